// The empirical Fisher diagonal on the GPU (backend_cuda/quantize/fisher_gpu.h) and its backward steps
// (backward_ops.h):
//   - every backward step against its CPU twin on random data, at odd and real shapes (GQA, MHA, sliding-window
//     zeros in the attention probabilities, unaligned accumulators);
//   - fisher_diagonal_gpu against the CPU fisher_diagonal (model/backward.h) on stories260K (real tokens, windows of
//     different lengths up to the model's 512 positions) and on the tiny fixtures (Qwen2 q/k/v biases, Mistral
//     sliding window shorter than the window, Llama-3 untied head and RoPE scaling);
//   - the host-spill and recompute (checkpoint interval 2) paths against the all-on-device run: bit-identical;
//   - both Fisher passes against PyTorch autograd (tests/fixtures/fisher_golden.safetensors, tools/fisher_ref.py);
//     the CPU one runs everywhere, the GPU one where there is a device;
//   - input errors, refused before any device work (they run without a GPU).
// Without a GPU the device tests skip and say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "model/backward.h"
#include "model/model.h"
#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LOWBIT_WITH_CUDA
#include <cublas_v2.h>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dense/dense.h"
#include "backend_cuda/quantize/backward_ops.h"
#include "backend_cuda/quantize/block_loader.h"
#include "backend_cuda/quantize/fisher_gpu.h"
#endif

namespace lowbit {
namespace {

using test::fixture;
using test::shared_path;

// GPU Fisher vs the CPU fisher_diagonal, per tensor ‖gpu − cpu‖₂ / ‖cpu‖₂: both fp32 with different summation
// orders (cuBLAS vs OpenBLAS, float vs double softmax sums); squares double the gradients' ~1e-6.
constexpr double kMaxFisherRelL2 = 1e-4;
// Mean loss, GPU vs CPU, relative.
constexpr double kMaxLossRel = 1e-5;
// Either pass vs PyTorch fp32 autograd: the same two budgets.
constexpr double kMaxFisherRelL2VsTorch = 1e-4;
constexpr double kMaxLossRelVsTorch = 1e-5;
// A backward step vs its CPU twin, relative L2: fp32 rounding with different summation orders (the twins sum the
// matmuls in double).
constexpr double kMaxStepRelL2 = 2e-6;

double rel_l2(const float* got, const float* want, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}
double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return rel_l2(got.data(), want.data(), std::min(got.size(), want.size()));
}

std::string stories_bin() { return shared_path("models/stories260K/stories260K.bin"); }

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return ids;
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
// PyTorch autograd (tools/fisher_ref.py fixture): `fisher` runs a Fisher pass over a case's windows.
using FisherPass = std::function<FisherDiag(const Model&, const std::vector<std::vector<int32_t>>&)>;

void expect_matches_torch(const FisherPass& fisher) {
  SafetensorsFile golden = SafetensorsFile::open(fixture("fisher_golden.safetensors"));
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
    std::vector<std::vector<int32_t>> windows;
    for (int i = 0;; ++i) {
      const TensorView* w = golden.find(case_name + "/window/" + std::to_string(i));
      if (w == nullptr) break;
      const auto* p = reinterpret_cast<const int32_t*>(w->data);
      windows.emplace_back(p, p + w->numel());
    }
    ASSERT_GE(windows.size(), 2u);
    const FisherDiag got = fisher(*model, windows);
    const TensorView* loss_t = golden.find(case_name + "/mean_loss");
    ASSERT_TRUE(loss_t != nullptr && loss_t->dtype == DType::F64);
    const double want_loss = *reinterpret_cast<const double*>(loss_t->data);
    EXPECT_NEAR(got.mean_loss, want_loss, kMaxLossRelVsTorch * want_loss);

    const std::string prefix = case_name + "/fisher/";
    int compared = 0;
    double worst = 0.0;
    for (const auto& [key, want] : golden.tensors()) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(prefix.size());
      ASSERT_TRUE(got.diag.count(name)) << name;
      const std::vector<float>& ours = got.diag.at(name);
      const int64_t cols = want.shape.at(1);
      std::vector<int64_t> rows;
      if (const TensorView* r = golden.find(case_name + "/rows/" + name)) {
        const auto* rp = reinterpret_cast<const int32_t*>(r->data);
        rows.assign(rp, rp + r->numel());
      } else {
        for (int64_t i = 0; i < want.shape.at(0); ++i) rows.push_back(i);
      }
      std::vector<float> picked;
      for (int64_t r : rows)
        picked.insert(picked.end(), ours.begin() + r * cols, ours.begin() + (r + 1) * cols);
      const auto* wp = reinterpret_cast<const float*>(want.data);
      const double err = rel_l2(picked.data(), wp, picked.size());
      EXPECT_LE(err, kMaxFisherRelL2VsTorch) << name;
      worst = std::max(worst, err);
      ++compared;
    }
    EXPECT_GE(compared, 7) << "no Fisher tensors stored for " << case_name;
    std::printf("  %s: %zu windows, mean loss %.6f (torch %.6f), %d tensors, worst relative L2 %.2e (budget %.0e)\n",
                case_name.c_str(), windows.size(), got.mean_loss, want_loss, compared, worst, kMaxFisherRelL2VsTorch);
    ++compared_cases;
  }
  EXPECT_GE(compared_cases, 3);
}

// The reference the GPU is checked against, itself checked against PyTorch: runs without a GPU.
TEST(FisherGolden, CpuMatchesTorchAutograd) {
  expect_matches_torch(
      [](const Model& m, const std::vector<std::vector<int32_t>>& w) { return fisher_diagonal(m, w); });
}

#ifdef LOWBIT_WITH_CUDA


std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> fetch(const cuda::DeviceBuffer<float>& d) {
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  return d.download();
}

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() {
    cuda::cublas_check(cublasCreate(&h), "cublasCreate");
    cuda::cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  ~Cublas() { cublasDestroy(h); }
};

// ---------------------------------------------------------------------------------------------------------
// Backward steps vs their CPU twins.

TEST(FisherGpuSteps, RmsnormBackward) {
  SKIP_WITHOUT_GPU();
  for (auto [rows, dim] : {std::pair{3, 37}, {5, 64}, {2, 4096}, {4, 8192}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(dim));
    const size_t n = static_cast<size_t>(rows) * dim;
    const auto x = randn(n, 1, 2.0f), w = randn(static_cast<size_t>(dim), 2), dy = randn(n, 3), dx0 = randn(n, 4);
    std::vector<float> want = dx0;
    cuda::rmsnorm_backward_ref(x.data(), w.data(), dy.data(), want.data(), rows, dim, 1e-5f);
    cuda::DeviceBuffer<float> dx(x), dw(w), ddy(dy), ddx(dx0);
    cuda::rmsnorm_backward_f32(dx.get(), dw.get(), ddy.get(), ddx.get(), rows, dim, 1e-5f, nullptr);
    EXPECT_LE(rel_l2(fetch(ddx), want), kMaxStepRelL2);
  }
}

TEST(FisherGpuSteps, SwigluBackward) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{37}, int64_t{1000}, int64_t{172} * 33}) {
    SCOPED_TRACE(n);
    const auto g = randn(static_cast<size_t>(n), 5, 3.0f), u = randn(static_cast<size_t>(n), 6),
               da = randn(static_cast<size_t>(n), 7);
    std::vector<float> wg(static_cast<size_t>(n)), wu(static_cast<size_t>(n));
    cuda::swiglu_backward_ref(g.data(), u.data(), da.data(), wg.data(), wu.data(), n);
    cuda::DeviceBuffer<float> dg_in(g), du_in(u), dda(da), dg(static_cast<size_t>(n)), du(static_cast<size_t>(n));
    cuda::swiglu_backward_f32(dg_in.get(), du_in.get(), dda.get(), dg.get(), du.get(), n, nullptr);
    EXPECT_LE(rel_l2(fetch(dg), wg), kMaxStepRelL2);
    EXPECT_LE(rel_l2(fetch(du), wu), kMaxStepRelL2);
  }
}

// Causal softmax rows of random scores for `heads` heads ([heads, T, T]); window > 0 also hides keys more than
// window - 1 positions back (Mistral), as block_f32.cu's softmax does.
std::vector<float> causal_probs(int heads, int T, int window, uint32_t seed) {
  std::vector<float> p = randn(static_cast<size_t>(heads) * T * T, seed, 2.0f);
  for (int64_t r = 0; r < static_cast<int64_t>(heads) * T; ++r) {
    const int t = static_cast<int>(r % T), lo = window > 0 ? std::max(0, t - window + 1) : 0;
    float* row = p.data() + r * T;
    float mx = -INFINITY;
    for (int j = lo; j <= t; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int j = lo; j <= t; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int j = 0; j < T; ++j) row[j] = j >= lo && j <= t ? static_cast<float>(row[j] / sum) : 0.0f;
  }
  return p;
}

TEST(FisherGpuSteps, SoftmaxBackward) {
  SKIP_WITHOUT_GPU();
  for (auto [heads, T, window] : {std::tuple{1, 1, 0}, {2, 7, 0}, {4, 64, 0}, {3, 300, 0}, {2, 40, 6}}) {
    SCOPED_TRACE(std::to_string(heads) + " heads, T " + std::to_string(T) + ", window " + std::to_string(window));
    const auto p = causal_probs(heads, T, window, 8);
    const auto dp = randn(p.size(), 9);
    std::vector<float> want = dp;
    cuda::softmax_backward_ref(p.data(), want.data(), static_cast<int64_t>(heads) * T, T);
    cuda::DeviceBuffer<float> dprobs(p), ddp(dp);
    cuda::softmax_backward_f32(dprobs.get(), ddp.get(), static_cast<int64_t>(heads) * T, T, nullptr);
    const auto got = fetch(ddp);
    EXPECT_LE(rel_l2(got, want), kMaxStepRelL2);
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] == 0.0f) {
        ASSERT_EQ(got[i], 0.0f) << "entry " << i << " is masked but got a gradient";
      }
    }
  }
}

TEST(FisherGpuSteps, CrossEntropy) {
  SKIP_WITHOUT_GPU();
  for (auto [rows, vocab] : {std::pair{1, 7}, {5, 512}, {3, 32003}, {2, 128256}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(vocab));
    const auto logits = randn(static_cast<size_t>(rows) * vocab, 10, 3.0f);
    const auto targets = random_tokens(rows, vocab, 11);
    const int64_t n_pred = rows + 4;   // a chunk of a longer window: the mean runs over the window
    std::vector<float> want = logits;
    std::vector<double> want_loss(static_cast<size_t>(rows));
    cuda::cross_entropy_ref(want.data(), targets.data(), rows, vocab, n_pred, want_loss.data());
    cuda::DeviceBuffer<float> dl(logits);
    cuda::DeviceBuffer<int32_t> dt(targets);
    cuda::DeviceBuffer<double> loss(static_cast<size_t>(rows));
    cuda::cross_entropy_f32(dl.get(), dt.get(), rows, vocab, n_pred, loss.get(), nullptr);
    EXPECT_LE(rel_l2(fetch(dl), want), kMaxStepRelL2);
    const std::vector<double> got_loss = loss.download();
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r) EXPECT_NEAR(got_loss[r], want_loss[r], 1e-5);
  }
}

TEST(FisherGpuSteps, SquareAccumulate) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{4099}}) {
    for (int shift : {0, 1}) {   // shift 1: not 16-byte aligned, the scalar path
      SCOPED_TRACE(std::to_string(n) + " shift " + std::to_string(shift));
      const auto g = randn(static_cast<size_t>(n + shift), 12), a = randn(static_cast<size_t>(n + shift), 13);
      std::vector<float> want = a;
      cuda::square_accumulate_ref(want.data() + shift, g.data() + shift, n);
      cuda::DeviceBuffer<float> dg(g), da(a);
      cuda::square_accumulate_f32(da.get() + shift, dg.get() + shift, n, nullptr);
      EXPECT_LE(rel_l2(fetch(da), want), kMaxStepRelL2);   // the GPU may fuse the multiply-add
    }
  }
}

TEST(FisherGpuSteps, LinearGradients) {
  SKIP_WITHOUT_GPU();
  Cublas cb;
  cuda::cublas_check(cublasSetStream(cb.h, nullptr), "cublasSetStream");
  for (auto [rows, n, k] : {std::tuple{7, 13, 37}, {64, 172, 64}, {33, 64, 172}, {512, 96, 80}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(n) + "x" + std::to_string(k));
    const auto dy = randn(static_cast<size_t>(rows) * n, 14), x = randn(static_cast<size_t>(rows) * k, 15),
               w = randn(static_cast<size_t>(n) * k, 16), dx0 = randn(static_cast<size_t>(rows) * k, 17);
    std::vector<float> want_dw(static_cast<size_t>(n) * k), want_dx = dx0;
    cuda::linear_weight_grad_ref(dy.data(), x.data(), rows, n, k, want_dw.data());
    cuda::DeviceBuffer<float> ddy(dy), dx(x), dw(w), dx_acc(dx0), dw_out(want_dw.size());
    cuda::linear_weight_grad_f32(cb.h, ddy.get(), dx.get(), rows, n, k, dw_out.get());
    EXPECT_LE(rel_l2(fetch(dw_out), want_dw), kMaxStepRelL2);
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> want = dx0;
      cuda::linear_input_grad_ref(dy.data(), w.data(), rows, n, k, beta, want.data());
      dx_acc.upload(dx0.data(), dx0.size());
      cuda::linear_input_grad_f32(cb.h, ddy.get(), dw.get(), rows, n, k, beta, dx_acc.get());
      EXPECT_LE(rel_l2(fetch(dx_acc), want), kMaxStepRelL2) << "beta " << beta;
    }
  }
}

TEST(FisherGpuSteps, AttentionBackward) {
  SKIP_WITHOUT_GPU();
  Cublas cb;
  // GQA 2:1 and 4:1 (stories260K's 8/4 at hd 8), MHA, one kv head for three query heads, a sliding window's zeros.
  struct Case {
    cuda::AttentionDims d;
    int window;
  };
  for (const Case& cs : {Case{{7, 4, 2, 8}, 0}, Case{{33, 8, 4, 8}, 0}, Case{{20, 2, 2, 4}, 0},
                         Case{{16, 3, 1, 16}, 0}, Case{{64, 8, 2, 32}, 0}, Case{{40, 4, 2, 8}, 6}}) {
    const cuda::AttentionDims& d = cs.d;
    SCOPED_TRACE("T " + std::to_string(d.T) + " heads " + std::to_string(d.heads) + "/" +
                 std::to_string(d.kv_heads) + " hd " + std::to_string(d.head_dim) + " window " +
                 std::to_string(cs.window));
    const size_t qn = static_cast<size_t>(d.T) * d.heads * d.head_dim;
    const size_t kn = static_cast<size_t>(d.T) * d.kv_heads * d.head_dim;
    const auto q = randn(qn, 20), k = randn(kn, 21), v = randn(kn, 22), dout = randn(qn, 23);
    // The probabilities need not come from q and k for the backward's algebra; random causal rows test it as well.
    const auto p = causal_probs(d.heads, d.T, cs.window, 24);
    std::vector<float> want_dq(qn), want_dk(kn), want_dv(kn);
    cuda::attention_backward_ref(d, q.data(), k.data(), v.data(), p.data(), dout.data(), want_dq.data(),
                                 want_dk.data(), want_dv.data());
    cuda::DeviceBuffer<float> dq_in(q), dk_in(k), dv_in(v), dp(p), ddo(dout), ds(p.size()), dq(qn), dk(kn), dv(kn);
    cuda::attention_backward_f32(cb.h, d, dq_in.get(), dk_in.get(), dv_in.get(), dp.get(), ddo.get(), ds.get(),
                                 dq.get(), dk.get(), dv.get(), nullptr);
    EXPECT_LE(rel_l2(fetch(dq), want_dq), kMaxStepRelL2);
    EXPECT_LE(rel_l2(fetch(dk), want_dk), kMaxStepRelL2);
    EXPECT_LE(rel_l2(fetch(dv), want_dv), kMaxStepRelL2);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The whole pass.

struct GpuFisher {
  FisherDiag fd;                 // diag, mean_loss, sequences
  cuda::FisherGpuReport rep;
  std::vector<int> order;        // layers in callback order
};

GpuFisher run_gpu(const WeightSet& ws, const std::vector<std::vector<int32_t>>& windows,
                  const cuda::FisherGpuOptions& opts = {}) {
  GpuFisher out;
  int last_done = 0, total = 0;
  out.rep = cuda::fisher_diagonal_gpu(
      ws, windows,
      [&](int layer, std::map<std::string, std::vector<float>>& diag) {
        out.order.push_back(layer);
        const std::array<std::string, 7> names = cuda::block_linear_names(layer);
        EXPECT_EQ(diag.size(), 7u);
        for (const std::string& n : names) {
          EXPECT_TRUE(diag.count(n)) << n;
          out.fd.diag[n] = std::move(diag[n]);
        }
      },
      opts,
      [&](int done, int t) {
        EXPECT_EQ(done, last_done + 1);
        last_done = done;
        total = t;
      });
  EXPECT_EQ(last_done, total) << "progress did not reach its total";
  out.fd.mean_loss = out.rep.mean_loss;
  out.fd.sequences = out.rep.sequences;
  const int L = ws.config.n_layers;
  std::vector<int> want_order;
  for (int l = L - 1; l >= 0; --l) want_order.push_back(l);
  EXPECT_EQ(out.order, want_order) << "blocks must come back in order L-1 .. 0";
  return out;
}

void expect_matches_cpu(const Model& m, const std::vector<std::vector<int32_t>>& windows, const char* what) {
  const FisherDiag cpu = fisher_diagonal(m, windows);
  const GpuFisher gpu = run_gpu(m.weights(), windows);
  EXPECT_NEAR(gpu.rep.mean_loss, cpu.mean_loss, kMaxLossRel * cpu.mean_loss);
  EXPECT_EQ(gpu.rep.sequences, static_cast<int>(windows.size()));
  ASSERT_EQ(gpu.fd.diag.size(), cpu.diag.size());
  double worst = 0.0;
  std::string worst_name;
  for (const auto& [name, want] : cpu.diag) {
    ASSERT_TRUE(gpu.fd.diag.count(name)) << name;
    const double err = rel_l2(gpu.fd.diag.at(name), want);
    EXPECT_LE(err, kMaxFisherRelL2) << name;
    if (err > worst) worst = err, worst_name = name;
  }
  std::printf("  %s: %zu windows, loss %.6f (cpu %.6f), worst relative L2 %.2e at %s (budget %.0e); forward %.3f s, "
              "backward %.3f s, peak device %.1f MB, checkpoint interval %d\n",
              what, windows.size(), gpu.rep.mean_loss, cpu.mean_loss, worst, worst_name.c_str(), kMaxFisherRelL2,
              gpu.rep.forward_seconds, gpu.rep.backward_seconds, gpu.rep.peak_device_bytes / 1e6,
              gpu.rep.checkpoint_interval);
}

// Real text for stories260K: windows of different lengths, the longest the model's whole context.
std::vector<std::vector<int32_t>> stories_windows(const Model& m) {
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friend "
      "Tom. One day, they found a big red ball under a tree. Lily said, \"Let's share the ball!\" Tom smiled and they "
      "played together until the sun went down. ";
  std::string text;
  std::vector<int32_t> ids;
  while (static_cast<int>(ids.size()) < m.config().max_seq_len + 100) {
    text += story;
    ids = m.tokenizer().encode(text, true, false);
  }
  const int T = m.config().max_seq_len;
  auto slice = [&](int from, int n) { return std::vector<int32_t>(ids.begin() + from, ids.begin() + from + n); };
  return {slice(0, T), slice(37, 200), slice(100, 61), slice(5, 2)};
}

TEST(FisherGpu, MatchesCpuOnStories260K) {
  SKIP_WITHOUT_GPU();
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  auto m = Model::load(stories_bin());
  expect_matches_cpu(*m, stories_windows(*m), "stories260K");
}

// q/k/v biases (qwen2), a sliding window of 6 under windows of up to 48 tokens (mistral_sw), an untied head and
// llama3 RoPE scaling (llama3).
class FisherGpuTiny : public ::testing::TestWithParam<const char*> {};
TEST_P(FisherGpuTiny, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto m = Model::load(fixture(std::string("tiny_") + GetParam()));
  const int V = m->config().vocab_size;
  expect_matches_cpu(*m, {random_tokens(48, V, 1), random_tokens(31, V, 2), random_tokens(9, V, 3)}, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Archs, FisherGpuTiny, ::testing::Values("qwen2", "mistral_sw", "llama3"));

// Activations in pinned host memory, and only every 2nd block input stored (the rest recomputed), give the same
// bits as everything on the device: the same kernels on the same inputs.
TEST(FisherGpu, HostSpillAndRecomputeAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  auto m = Model::load(stories_bin());
  const ModelConfig& c = m->config();
  ASSERT_EQ(c.n_layers, 5);   // slot counts below: 1 + L with every input stored, 1 + 3 + 1 at interval 2
  const std::vector<std::vector<int32_t>> windows = {
      random_tokens(100, c.vocab_size, 4), random_tokens(64, c.vocab_size, 5), random_tokens(3, c.vocab_size, 6)};
  const size_t slot = (100 + 64 + 3) * static_cast<size_t>(c.dim) * sizeof(float);
  const GpuFisher base = run_gpu(m->weights(), windows);
  EXPECT_EQ(base.rep.checkpoint_interval, 1);
  EXPECT_EQ(base.rep.host_spill_bytes, 0u);
  EXPECT_EQ(base.rep.device_activation_bytes, 6 * slot);

  struct Case {
    const char* what;
    size_t device, host;
    int interval;
    size_t want_device, want_host;
  };
  for (const Case& cs : {Case{"all on the host", 1, 0, 1, 0, 6 * slot},
                         Case{"2 slots on the device, 3 on the host, interval 2", 2 * slot, 3 * slot, 2, 2 * slot,
                              3 * slot},
                         Case{"5 slots on the host, interval 2", 1, 5 * slot + 7, 2, 0, 5 * slot}}) {
    SCOPED_TRACE(cs.what);
    cuda::FisherGpuOptions opts;
    opts.device_activation_budget = cs.device;
    opts.host_activation_budget = cs.host;
    const GpuFisher got = run_gpu(m->weights(), windows, opts);
    EXPECT_EQ(got.rep.checkpoint_interval, cs.interval);
    EXPECT_EQ(got.rep.device_activation_bytes, cs.want_device);
    EXPECT_EQ(got.rep.host_spill_bytes, cs.want_host);
    EXPECT_EQ(got.rep.mean_loss, base.rep.mean_loss);
    for (const auto& [name, want] : base.fd.diag) EXPECT_EQ(got.fd.diag.at(name), want) << name;
  }
}

TEST(FisherGpu, RefusesWhenActivationsCannotFit) {
  SKIP_WITHOUT_GPU();
  auto m = Model::load(fixture("tiny_qwen2"));
  cuda::FisherGpuOptions opts;
  opts.device_activation_budget = 1;
  opts.host_activation_budget = 1;
  const std::vector<std::vector<int32_t>> windows = {random_tokens(16, m->config().vocab_size, 7)};
  try {
    cuda::fisher_diagonal_gpu(m->weights(), windows, [](int, std::map<std::string, std::vector<float>>&) {}, opts);
    ADD_FAILURE() << "no error with 1-byte budgets";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need at least"), std::string::npos) << e.what();
  }
}

TEST(FisherGpu, MatchesTorchAutograd) {
  SKIP_WITHOUT_GPU();
  expect_matches_torch(
      [](const Model& m, const std::vector<std::vector<int32_t>>& w) { return run_gpu(m.weights(), w).fd; });
}

// Bad input is refused before any device work: these run without a GPU.
TEST(FisherGpuErrors, RefusesBadWindows) {
  auto m = Model::load(fixture("tiny_qwen2"));
  const int V = m->config().vocab_size, max_t = m->config().max_seq_len;
  const cuda::FisherBlockFn ignore = [](int, std::map<std::string, std::vector<float>>&) {};
  const std::vector<std::pair<std::vector<std::vector<int32_t>>, std::string>> cases = {
      {{}, "no calibration windows"},
      {{{1, 2, 3}, {4}}, "window 1 has 1 tokens; need at least 2"},
      {{{1, V}}, "out of range"},
      {{{1, -1}}, "out of range"},
      {{random_tokens(max_t + 1, V, 8)}, "more than the model's maximum"},
  };
  for (const auto& [windows, phrase] : cases) {
    try {
      cuda::fisher_diagonal_gpu(m->weights(), windows, ignore);
      ADD_FAILURE() << "no error (expected '" << phrase << "')";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

#else
TEST(FisherGpu, SkippedWithoutCudaToolkit) { GTEST_SKIP() << "GPU tests skipped: lowbit was built without CUDA"; }
#endif

}  // namespace
}  // namespace lowbit
