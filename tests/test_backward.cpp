// The backward pass (model/backward.h): loss and gradients against central differences of the double-precision
// reference loss, against PyTorch autograd (tools/make_grad_golden.py), the Fisher diagonal against squared
// gradients, and a SmolLM2-135M smoke/speed run.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "io/safetensors.h"
#include "model/backward.h"
#include "test_util.h"

namespace lowbit {
namespace {

using test::fixture;
using test::shared_path;

// Central differences of the double reference loss vs the fp32 analytic gradient, on entries whose gradient is at
// least kFDFloorOfMax of its tensor's largest: fp32 rounding of the analytic side is ~1e-6 of the tensor's max.
constexpr double kMaxRelErrFD = 1e-3;
constexpr double kFDFloorOfMax = 0.05;
// Fast fp32 loss vs the double reference loss (and vs the loss from Model::forward's logits).
constexpr double kMaxLossRelErrVsRef = 1e-5;
// vs PyTorch fp32 autograd: loss, and per tensor max|ours - torch| <= kGradTolOfMax * max|torch| + kGradTolAbs.
constexpr double kMaxLossRelErrVsTorch = 1e-5;
constexpr double kGradTolOfMax = 1e-5;
constexpr double kGradTolAbs = 1e-7;
// Squares below this are subnormal-range noise in the Fisher accumulation check.
constexpr float kTinyFloat = 1e-36f;

std::string stories_bin() { return shared_path("models/stories260K/stories260K.bin"); }

int64_t numel_of(const Model& m, const std::string& name) {
  int64_t n = 1;
  for (int64_t d : m.tensor_shape(name)) n *= d;
  return n;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

// Mean cross-entropy of tokens[t+1] under Model::forward's logits at t, in double.
double loss_from_forward(const Model& m, const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size()), V = m.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(n) * V);
  KVCache cache = m.new_cache(n);
  m.forward(ids.data(), n, cache, logits.data(), true);
  double loss = 0.0;
  for (int t = 0; t + 1 < n; ++t) {
    const float* l = logits.data() + static_cast<int64_t>(t) * V;
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(l[j]));
    for (int j = 0; j < V; ++j) sum += std::exp(l[j] - mx);
    loss += std::log(sum) + mx - l[ids[static_cast<size_t>(t + 1)]];
  }
  return loss / (n - 1);
}

std::unique_ptr<Model> load_case(const std::string& location, std::string* skip_reason) {
  const std::string kind = location.substr(0, location.find(':')), rel = location.substr(location.find(':') + 1);
  const std::string path = kind == "shared" ? shared_path(rel) : fixture(rel);
  if (kind == "shared" && path.empty()) {
    *skip_reason = "missing shared/" + rel + " (run scripts/setup.sh)";
    return nullptr;
  }
  return Model::load(path);
}

// ---------------------------------------------------------------------------------------------------------
// Finite differences: one entry of every tensor (chosen at random among those with a non-negligible gradient)
// against the central difference of the double-precision reference loss.
void check_finite_differences(const Model& model, const std::vector<int32_t>& ids, uint32_t seed) {
  const Gradients g = loss_and_gradients(model, ids);
  const double ref_loss = loss_reference(model, ids);
  EXPECT_NEAR(g.loss, ref_loss, kMaxLossRelErrVsRef * ref_loss);
  EXPECT_NEAR(g.loss, loss_from_forward(model, ids), kMaxLossRelErrVsRef * ref_loss);
  EXPECT_EQ(g.predicted, static_cast<int64_t>(ids.size()) - 1);
  std::set<std::string> want_keys;
  for (const std::string& name : model.tensor_names()) want_keys.insert(name);
  std::set<std::string> got_keys;
  for (const auto& [name, grad] : g.grad) got_keys.insert(name);
  EXPECT_EQ(got_keys, want_keys);

  std::mt19937 rng(seed);
  int checked = 0;
  double worst = 0.0;
  for (const std::string& name : model.tensor_names()) {
    const std::vector<float>& grad = g.grad.at(name);
    ASSERT_EQ(static_cast<int64_t>(grad.size()), numel_of(model, name)) << name;
    float gmax = 0.0f;
    for (float v : grad) gmax = std::max(gmax, std::fabs(v));
    ASSERT_GT(gmax, 0.0f) << name << ": gradient is all zero";
    std::uniform_int_distribution<size_t> pick(0, grad.size() - 1);
    size_t idx = pick(rng);
    for (int tries = 0; tries < 10000 && std::fabs(grad[idx]) < kFDFloorOfMax * gmax; ++tries) idx = pick(rng);
    ASSERT_GE(std::fabs(grad[idx]), kFDFloorOfMax * gmax) << name << ": no entry above the floor found";

    const float* w = model.tensor_f32(name);
    std::map<std::string, std::vector<double>> overrides;
    std::vector<double>& values = overrides[name];
    values.assign(w, w + grad.size());
    const double step = 1e-4 * std::max(1.0, std::fabs(values[idx]));
    values[idx] = static_cast<double>(w[idx]) + step;
    const double up = loss_reference(model, ids, &overrides);
    values[idx] = static_cast<double>(w[idx]) - step;
    const double down = loss_reference(model, ids, &overrides);
    const double fd = (up - down) / (2 * step), analytic = grad[idx];
    const double rel = std::fabs(fd - analytic) / std::max(std::fabs(fd), std::fabs(analytic));
    EXPECT_LT(rel, kMaxRelErrFD) << name << "[" << idx << "]: analytic " << analytic << ", central difference " << fd;
    worst = std::max(worst, rel);
    ++checked;
  }
  std::printf("  %d entries checked, worst relative error %.2e (budget %.0e)\n", checked, worst, kMaxRelErrFD);
}

TEST(BackwardFD, Stories260K) {
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  auto model = Model::load(stories_bin());
  check_finite_differences(*model, random_tokens(64, model->config().vocab_size, 1), 11);
}

// Tiny Hugging Face models cover what stories260K lacks: q/k/v biases (qwen2), a sliding window shorter than the
// sequence (mistral_sw), an untied head and llama3 RoPE scaling (llama3).
class BackwardFDTiny : public ::testing::TestWithParam<const char*> {};
TEST_P(BackwardFDTiny, MatchesCentralDifferences) {
  auto model = Model::load(fixture(std::string("tiny_") + GetParam()));
  check_finite_differences(*model, random_tokens(24, model->config().vocab_size, 2), 12);
}
INSTANTIATE_TEST_SUITE_P(Archs, BackwardFDTiny, ::testing::Values("qwen2", "mistral_sw", "llama3"));

// ---------------------------------------------------------------------------------------------------------
// PyTorch autograd: tests/fixtures/grad_golden.safetensors (tools/make_grad_golden.py).
TEST(BackwardGolden, MatchesTorchAutograd) {
  SafetensorsFile golden = SafetensorsFile::open(fixture("grad_golden.safetensors"));
  const auto cases = nlohmann::json::parse(golden.metadata().at("cases")).get<std::map<std::string, std::string>>();
  ASSERT_GE(cases.size(), 4u);
  int compared_cases = 0;
  for (const auto& [case_name, location] : cases) {
    SCOPED_TRACE(case_name);
    std::string skip;
    auto model = load_case(location, &skip);
    if (!model) {
      std::printf("  [skipped %s: %s]\n", case_name.c_str(), skip.c_str());
      continue;
    }
    const TensorView& ids_t = *golden.find(case_name + "/ids");
    const auto* ip = reinterpret_cast<const int32_t*>(ids_t.data);
    const std::vector<int32_t> ids(ip, ip + ids_t.numel());
    const Gradients g = loss_and_gradients(*model, ids);
    const double want_loss = *reinterpret_cast<const float*>(golden.find(case_name + "/loss")->data);
    EXPECT_NEAR(g.loss, want_loss, kMaxLossRelErrVsTorch * want_loss);

    const std::string grad_prefix = case_name + "/grad/";
    int compared = 0;
    double worst_of_budget = 0.0;
    for (const auto& [key, want] : golden.tensors()) {
      if (key.rfind(grad_prefix, 0) != 0) continue;
      const std::string name = key.substr(grad_prefix.size());
      ASSERT_TRUE(g.grad.count(name)) << name;
      const std::vector<float>& ours = g.grad.at(name);
      const std::vector<int64_t>& shape = model->tensor_shape(name);
      const int64_t cols = shape.size() == 2 ? shape[1] : 1;
      std::vector<int64_t> rows;   // the stored rows of ours, in order
      if (const TensorView* r = golden.find(case_name + "/rows/" + name)) {
        const auto* rp = reinterpret_cast<const int32_t*>(r->data);
        rows.assign(rp, rp + r->numel());
      } else {
        for (int64_t i = 0; i < static_cast<int64_t>(ours.size()) / cols; ++i) rows.push_back(i);
      }
      ASSERT_EQ(want.numel(), static_cast<int64_t>(rows.size()) * cols) << name;
      const float* w = reinterpret_cast<const float*>(want.data);
      double max_want = 0.0, max_diff = 0.0;
      for (size_t r = 0; r < rows.size(); ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          const double a = ours[static_cast<size_t>(rows[r] * cols + j)], b = w[static_cast<int64_t>(r) * cols + j];
          max_want = std::max(max_want, std::fabs(b));
          max_diff = std::max(max_diff, std::fabs(a - b));
        }
      }
      const double budget = kGradTolOfMax * max_want + kGradTolAbs;
      EXPECT_LE(max_diff, budget) << name << " (max |grad| " << max_want << ")";
      worst_of_budget = std::max(worst_of_budget, max_diff / budget);
      ++compared;
    }
    EXPECT_GE(compared, 20);
    std::printf("  %s: loss %.6f (torch %.6f), %d gradients, worst max-abs diff %.2f of its budget\n",
                case_name.c_str(), g.loss, want_loss, compared, worst_of_budget);
    ++compared_cases;
  }
  EXPECT_GE(compared_cases, 3);
}

// ---------------------------------------------------------------------------------------------------------
// Fisher diagonal = Σ_s g_s², keys exactly the linear weights; linear_weights_only gives the full run's values.
TEST(Fisher, SumOfSquaredGradients) {
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  auto model = Model::load(stories_bin());
  const int V = model->config().vocab_size;
  const std::vector<std::vector<int32_t>> seqs = {random_tokens(33, V, 3), random_tokens(50, V, 4)};
  std::vector<std::pair<int, int>> calls;
  const FisherDiag f = fisher_diagonal(*model, seqs, [&](int done, int total) { calls.emplace_back(done, total); });
  EXPECT_EQ(f.sequences, 2);
  EXPECT_EQ(calls, (std::vector<std::pair<int, int>>{{1, 2}, {2, 2}}));

  const Gradients g0 = loss_and_gradients(*model, seqs[0], true), g1 = loss_and_gradients(*model, seqs[1], true);
  const Gradients full0 = loss_and_gradients(*model, seqs[0]);
  EXPECT_DOUBLE_EQ(f.mean_loss, (g0.loss + g1.loss) / 2);
  EXPECT_DOUBLE_EQ(g0.loss, full0.loss);
  const std::vector<std::string> names = linear_weight_names(model->config());
  EXPECT_EQ(names.size(), 7u * model->config().n_layers);
  const std::set<std::string> want_keys(names.begin(), names.end());
  std::set<std::string> fisher_keys, grad_keys;
  for (const auto& kv : f.diag) fisher_keys.insert(kv.first);
  for (const auto& kv : g0.grad) grad_keys.insert(kv.first);
  EXPECT_EQ(fisher_keys, want_keys);
  EXPECT_EQ(grad_keys, want_keys);
  for (const std::string& name : names) {
    const std::vector<float>& d = f.diag.at(name);
    const std::vector<float>&a = g0.grad.at(name), &b = g1.grad.at(name);
    ASSERT_EQ(static_cast<int64_t>(d.size()), numel_of(*model, name)) << name;
    ASSERT_EQ(a.size(), d.size());
    ASSERT_EQ(b.size(), d.size());
    EXPECT_EQ(a, full0.grad.at(name)) << name << ": linear_weights_only changed the values";
    size_t mismatches = 0;
    for (size_t i = 0; i < d.size(); ++i) {
      // fisher_diagonal's order, (0 + a²) + b²; it may fuse the multiply-add (one rounding fewer): 2 ulp.
      const float want = (0.0f + a[i] * a[i]) + b[i] * b[i];
      if (std::fabs(d[i] - want) > 2 * std::numeric_limits<float>::epsilon() * want + kTinyFloat) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0u) << name;
  }
}

TEST(Backward, RejectsBadInput) {
  auto model = Model::load(fixture("tiny_mistral"));
  const int V = model->config().vocab_size;
  EXPECT_THROW(loss_and_gradients(*model, {5}), Error);
  EXPECT_THROW(loss_and_gradients(*model, {5, V}), Error);
  EXPECT_THROW(loss_and_gradients(*model, {-1, 3}), Error);
  EXPECT_THROW(loss_and_gradients(*model, std::vector<int32_t>(model->config().max_seq_len + 1, 3)), Error);
  EXPECT_THROW(fisher_diagonal(*model, {}), Error);
  const std::map<std::string, std::vector<double>> bad = {{"model.norm.weight", {1.0, 2.0}}};
  EXPECT_THROW(loss_reference(*model, {1, 2, 3}, &bad), Error);
}

// ---------------------------------------------------------------------------------------------------------
// SmolLM2-135M (30 layers, dim 576, 9/3 heads, vocab 49152, tied): the Fisher diagonal of one sequence is finite,
// non-negative and nonzero in every linear weight; prints the time per sequence.
TEST(SmolLM2, FisherSmokeAndSpeed) {
  const std::string gguf = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(gguf, "SmolLM2 GGUF");
  auto model = Model::load(gguf);
  std::string text;
  while (model->tokenizer().encode(text, true, false).size() < 512)
    text += "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps as his father had "
            "taught him. Out on the water, fishing boats turned for home while gulls argued over the harbour. ";
  const std::vector<int32_t> all = model->tokenizer().encode(text, true, false);
  for (int T : {128, 512}) {
    const std::vector<int32_t> ids(all.begin(), all.begin() + T);
    const auto t0 = std::chrono::steady_clock::now();
    const FisherDiag f = fisher_diagonal(*model, {ids});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  SmolLM2-135M fisher_diagonal, %d tokens: %.2f s per sequence, loss %.4f\n", T, secs, f.mean_loss);
    EXPECT_TRUE(std::isfinite(f.mean_loss));
    EXPECT_GT(f.mean_loss, 0.0);
    ASSERT_EQ(f.diag.size(), 7u * model->config().n_layers);
    for (const auto& [name, d] : f.diag) {
      ASSERT_EQ(static_cast<int64_t>(d.size()), numel_of(*model, name)) << name;
      size_t bad = 0, nonzero = 0;
      for (float v : d) {
        bad += !(std::isfinite(v) && v >= 0.0f);
        nonzero += v > 0.0f;
      }
      EXPECT_EQ(bad, 0u) << name;
      EXPECT_GT(nonzero, d.size() / 2) << name;
    }
  }
}

}  // namespace
}  // namespace lowbit
