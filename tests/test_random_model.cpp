// Synthetic "random:<preset>" sources: preset shapes and parameter counts, generation on read only, determinism,
// the weights' statistics (outlier columns included), overrides and their errors, loading through tensor_as_f32
// and the CPU model, random calibration ids, and the generator's throughput.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model/weight_convert.h"
#include "quantize/calibration.h"
#include "test_util.h"

namespace lowbit {
namespace {

int64_t param_count(const WeightSet& ws) {
  int64_t n = 0;
  for (const auto& [name, t] : ws.tensors) n += t.numel();
  return n;
}

std::vector<float> generate(const WeightSet& ws, const std::string& name) {
  std::vector<float> scratch;
  const float* p = tensor_as_f32(ws, name, ws.tensors.at(name).shape, false, scratch);
  EXPECT_EQ(p, scratch.data()) << name << ": a synthetic tensor must be generated into scratch";
  return scratch;
}

// Resident set size of this process, from /proc/self/statm.
int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return pages_resident * 4096;
}

struct Moments {
  double mean = 0, std = 0;
};
Moments moments(const float* x, int64_t n, int64_t stride = 1) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    s += x[i * stride];
    s2 += static_cast<double>(x[i * stride]) * x[i * stride];
  }
  Moments m;
  m.mean = s / static_cast<double>(n);
  m.std = std::sqrt(std::max(0.0, s2 / static_cast<double>(n) - m.mean * m.mean));
  return m;
}

class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// ---------------------------------------------------------------------------------------------------------
TEST(RandomModel, PresetsHaveHuggingFaceShapesAndParameterCounts) {
  struct Want {
    std::string preset;
    int dim, hidden, layers, heads, kv_heads, vocab;
    bool tied;
    double params;   // the published count
  };
  const std::vector<Want> wants = {
      {"tiny", 64, 176, 2, 4, 2, 512, false, 0},
      {"smollm2-135m", 576, 1536, 30, 9, 3, 49152, true, 134.5e6},
      {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, false, 6.74e9},
      {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, false, 8.03e9},
      {"llama2-70b", 8192, 28672, 80, 64, 8, 32000, false, 6.90e10},
  };
  ASSERT_EQ(random_preset_names().size(), wants.size());
  for (const Want& w : wants) {
    SCOPED_TRACE(w.preset);
    const WeightSet ws = read_weights("random:" + w.preset);
    const ModelConfig& c = ws.config;
    EXPECT_EQ(ws.format, ModelFormat::Random);
    EXPECT_STREQ(model_format_name(ws.format), "random");
    EXPECT_EQ(c.name, "random:" + w.preset);
    EXPECT_EQ(c.dim, w.dim);
    EXPECT_EQ(c.hidden_dim, w.hidden);
    EXPECT_EQ(c.n_layers, w.layers);
    EXPECT_EQ(c.n_heads, w.heads);
    EXPECT_EQ(c.n_kv_heads, w.kv_heads);
    EXPECT_EQ(c.head_dim, w.dim / w.heads);
    EXPECT_EQ(c.vocab_size, w.vocab);
    EXPECT_EQ(c.tie_embeddings, w.tied);
    EXPECT_FALSE(ws.vocab.has_value());
    EXPECT_TRUE(ws.files.empty());
    ASSERT_NE(ws.generator, nullptr);
    EXPECT_EQ(ws.tensors.size(), static_cast<size_t>(2 + 9 * w.layers + (w.tied ? 0 : 1)));
    EXPECT_EQ(ws.tensors.count("lm_head.weight"), w.tied ? 0u : 1u);
    for (const auto& [name, t] : ws.tensors) {
      EXPECT_EQ(t.data, nullptr) << name;
      EXPECT_EQ(t.dtype, DType::F32) << name;
      EXPECT_EQ(t.nbytes, static_cast<uint64_t>(t.numel()) * 4) << name;
    }
    EXPECT_EQ(ws.tensors.at("model.layers.0.self_attn.k_proj.weight").shape,
              (std::vector<int64_t>{c.kv_dim(), c.dim}));
    EXPECT_EQ(ws.tensors.at("model.layers.0.mlp.down_proj.weight").shape,
              (std::vector<int64_t>{c.dim, c.hidden_dim}));
    if (w.params > 0) {
      EXPECT_NEAR(static_cast<double>(param_count(ws)), w.params, 0.01 * w.params);
    }
  }
  const WeightSet l3 = read_weights("random:llama3-8b");
  EXPECT_EQ(l3.config.rope_theta, 500000.0f);
  EXPECT_EQ(l3.config.max_seq_len, 8192);
  EXPECT_EQ(l3.config.rope_scaling, RopeScaling::None);
  EXPECT_EQ(read_weights("random:smollm2-135m").config.rope_theta, 100000.0f);
  EXPECT_EQ(read_weights("random:llama2-70b").config.max_seq_len, 4096);
}

TEST(RandomModel, A70BSourceCostsNoMemoryUntilATensorIsRead) {
  const int64_t before = rss_bytes();
  const WeightSet ws = read_weights("random:llama2-70b");
  const int64_t after = rss_bytes();
  EXPECT_GT(param_count(ws), 68'000'000'000);
  EXPECT_LT(after - before, 16ll << 20) << "listing 723 tensors must not allocate their values";
}

TEST(RandomModel, OverridesSetLayersAndSeed) {
  const WeightSet ws = read_weights("random:llama2-70b?layers=10&seed=3");
  EXPECT_EQ(ws.config.n_layers, 10);
  EXPECT_EQ(ws.config.name, "random:llama2-70b?layers=10&seed=3");
  EXPECT_EQ(ws.generator->seed(), 3u);
  EXPECT_EQ(ws.tensors.size(), static_cast<size_t>(2 + 9 * 10 + 1));
  EXPECT_EQ(ws.tensors.count("model.layers.9.mlp.up_proj.weight"), 1u);
  EXPECT_EQ(ws.tensors.count("model.layers.10.mlp.up_proj.weight"), 0u);
  // Order of overrides does not matter; the canonical name lists them in one order.
  EXPECT_EQ(read_weights("random:tiny?seed=7&layers=1").config.name, "random:tiny?layers=1&seed=7");
  EXPECT_EQ(read_weights("random:tiny?seed=7").config.name, "random:tiny?seed=7");
  EXPECT_EQ(read_weights("random:tiny?layers=2").config.name, "random:tiny");   // the preset's own count
  EXPECT_EQ(read_weights("random:tiny?layers=5").config.n_layers, 5);
}

TEST(RandomModel, UnknownPresetsAndBadOverridesAreOneLineErrorsListingThePresets) {
  auto open = [](const std::string& s) { return read_weights(s); };
  test::expect_error(open, "random:llama2-13b", "unknown preset 'llama2-13b'");
  test::expect_error(open, "random:", "unknown preset ''");
  test::expect_error(open, "random:tiny?layers=0", "bad override layers='0'");
  test::expect_error(open, "random:tiny?layers=1025", "bad override layers='1025'");
  test::expect_error(open, "random:tiny?layers=x", "bad override layers='x'");
  test::expect_error(open, "random:tiny?layers=3x", "bad override layers='3x'");
  test::expect_error(open, "random:tiny?layers=", "bad override layers=''");
  test::expect_error(open, "random:tiny?seed=-1", "bad override seed='-1'");
  test::expect_error(open, "random:tiny?heads=2", "bad override 'heads=2'");
  test::expect_error(open, "random:tiny?", "bad override ''");
  test::expect_error(open, "random:tiny?layers=2&", "bad override ''");
  for (const char* s : {"random:nope", "random:tiny?layers=0", "random:tiny?x=1"}) {
    try {
      read_weights(s);
      ADD_FAILURE() << s;
    } catch (const Error& e) {
      for (const std::string& p : random_preset_names()) EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("random:<preset>[?layers=N&seed=S]"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
TEST(RandomModel, TensorsAreDeterministicPerSeedAndName) {
  const WeightSet a = read_weights("random:smollm2-135m?layers=2");
  const WeightSet b = read_weights("random:smollm2-135m?layers=2");
  const WeightSet s1 = read_weights("random:smollm2-135m?layers=2&seed=1");
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  const std::vector<float> qa = generate(a, q), qa2 = generate(a, q), qb = generate(b, q), qs = generate(s1, q);
  ASSERT_EQ(qa.size(), 576u * 576u);
  EXPECT_EQ(std::memcmp(qa.data(), qa2.data(), qa.size() * 4), 0);
  EXPECT_EQ(std::memcmp(qa.data(), qb.data(), qa.size() * 4), 0);
  int same = 0;
  for (size_t i = 0; i < qa.size(); ++i) same += qa[i] == qs[i];
  EXPECT_LT(same, 100) << "another seed must give other values";
  // Another tensor of the same shape, in another layer, is another stream.
  const std::vector<float> q1 = generate(a, "model.layers.1.self_attn.q_proj.weight");
  same = 0;
  for (size_t i = 0; i < qa.size(); ++i) same += qa[i] == q1[i];
  EXPECT_LT(same, 100);
  // The first layers of a shorter override are the same tensors as the full preset's.
  const WeightSet full = read_weights("random:smollm2-135m");
  EXPECT_EQ(std::memcmp(generate(full, q).data(), qa.data(), qa.size() * 4), 0);
  // The values do not depend on the thread count.
  std::vector<float> one(qa.size());
  {
    OmpThreads t(1);
    a.generator->fill(q, {576, 576}, one.data());
  }
  EXPECT_EQ(std::memcmp(one.data(), qa.data(), qa.size() * 4), 0);
}

TEST(RandomModel, LinearWeightsAreNormalWithOutlierColumns) {
  const WeightSet ws = read_weights("random:smollm2-135m?layers=1");
  const int64_t n = 1536, k = 576;
  const std::vector<float> w = generate(ws, "model.layers.0.mlp.gate_proj.weight");
  const std::vector<int64_t> outliers = random_outlier_columns(0, k);
  ASSERT_EQ(outliers.size(), 3u);   // 0.5% of 576, rounded
  EXPECT_EQ(outliers, random_outlier_columns(0, k));
  EXPECT_NE(outliers, random_outlier_columns(1, k));
  // Columns wider than 4x the nominal std are exactly the outlier columns, each about 8x.
  std::vector<int64_t> wide;
  double inlier_s = 0, inlier_s2 = 0, inlier_max = 0;
  int64_t inlier_n = 0;
  for (int64_t c = 0; c < k; ++c) {
    const Moments m = moments(w.data() + c, n, k);
    if (m.std > 4 * kRandomWeightStd) {
      wide.push_back(c);
      EXPECT_NEAR(m.std, kRandomOutlierColumnScale * kRandomWeightStd, 0.06 * kRandomOutlierColumnScale * kRandomWeightStd);
      continue;
    }
    for (int64_t r = 0; r < n; ++r) {
      const double v = w[static_cast<size_t>(r * k + c)];
      inlier_s += v;
      inlier_s2 += v * v;
      inlier_max = std::max(inlier_max, std::fabs(v));
      ++inlier_n;
    }
  }
  EXPECT_EQ(wide, outliers);
  const double mean = inlier_s / static_cast<double>(inlier_n);
  const double std_dev = std::sqrt(inlier_s2 / static_cast<double>(inlier_n) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std_dev, kRandomWeightStd, 0.01 * kRandomWeightStd);
  // Irwin-Hall(4) reaches 3.46 std; 880k samples come within 3 std.
  EXPECT_GT(inlier_max, 3.0 * kRandomWeightStd);
  EXPECT_LE(inlier_max, 3.47 * kRandomWeightStd);
  // Every linear weight reading the model width has the same outlier columns (fixed hidden channels).
  const std::vector<float> q = generate(ws, "model.layers.0.self_attn.q_proj.weight");
  for (int64_t c : outliers) EXPECT_GT(moments(q.data() + c, k, k).std, 4 * kRandomWeightStd) << c;
  // down_proj reads the FFN width: 8 outlier columns of 1536.
  EXPECT_EQ(random_outlier_columns(0, 1536).size(), 8u);
  EXPECT_EQ(random_outlier_columns(0, 64).size(), 1u);   // at least one, however narrow
}

TEST(RandomModel, NormsAreNearOneAndEmbeddingsPlainNormal) {
  const WeightSet ws = read_weights("random:llama2-7b?layers=1");
  const std::vector<float> norm = generate(ws, "model.layers.0.input_layernorm.weight");
  const Moments nm = moments(norm.data(), static_cast<int64_t>(norm.size()));
  EXPECT_NEAR(nm.mean, 1.0, 0.005);
  EXPECT_NEAR(nm.std, kRandomNormNoiseStd, 0.05 * kRandomNormNoiseStd);
  EXPECT_GT(*std::min_element(norm.begin(), norm.end()), 0.8f);

  const WeightSet tiny = read_weights("random:tiny");
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    SCOPED_TRACE(name);
    const std::vector<float> e = generate(tiny, name);
    const Moments m = moments(e.data(), static_cast<int64_t>(e.size()));
    EXPECT_NEAR(m.mean, 0.0, 5e-4);
    EXPECT_NEAR(m.std, kRandomWeightStd, 0.02 * kRandomWeightStd);
    for (int64_t c = 0; c < 64; ++c) EXPECT_LT(moments(e.data() + c, 512, 64).std, 1.3 * kRandomWeightStd) << c;
  }
}

// ---------------------------------------------------------------------------------------------------------
TEST(RandomModel, TensorAsF32ChecksShapeAndName) {
  const WeightSet ws = read_weights("random:tiny");
  std::vector<float> scratch;
  const float* p = tensor_as_f32(ws, "model.layers.1.self_attn.o_proj.weight", {64, 64}, false, scratch);
  ASSERT_EQ(scratch.size(), 64u * 64u);
  std::vector<float> direct(64 * 64);
  ws.generator->fill("model.layers.1.self_attn.o_proj.weight", {64, 64}, direct.data());
  EXPECT_EQ(std::memcmp(p, direct.data(), direct.size() * 4), 0);
  // q/k rows are generated in Hugging Face order: qk_rows changes nothing.
  std::vector<float> s1, s2;
  tensor_as_f32(ws, "model.layers.0.self_attn.k_proj.weight", {32, 64}, false, s1);
  tensor_as_f32(ws, "model.layers.0.self_attn.k_proj.weight", {32, 64}, true, s2);
  EXPECT_EQ(s1, s2);
  auto wrong_shape = [&](const std::string& path) {
    return tensor_as_f32(ws, "model.layers.0.self_attn.k_proj.weight", {64, 64}, false, scratch);
  };
  test::expect_error(wrong_shape, "random:tiny", "has shape [32, 64], expected [64, 64]");
  auto missing = [&](const std::string& path) { return tensor_as_f32(ws, "model.layers.2.mlp.up_proj.weight", {176, 64}, false, scratch); };
  test::expect_error(missing, "random:tiny", "missing tensor model.layers.2.mlp.up_proj.weight");
}

TEST(RandomModel, CpuModelLoadsAndRunsAForwardWithoutNaN) {
  for (const std::string src : {"random:tiny", "random:smollm2-135m?layers=2&seed=5"}) {
    SCOPED_TRACE(src);
    auto model = Model::load(src);
    EXPECT_FALSE(model->has_tokenizer());
    const ModelConfig& c = model->config();
    CalibOptions co;
    co.samples = 1;
    co.seqlen = 16;
    const std::vector<int32_t> ids = draw_random_calibration(c.vocab_size, co)[0];
    const int n = static_cast<int>(ids.size());
    std::vector<float> logits(static_cast<size_t>(n) * c.vocab_size), ref(logits.size());
    KVCache cache = model->new_cache(n), cache_ref = model->new_cache(n);
    model->forward(ids.data(), n, cache, logits.data(), /*all_logits=*/true);
    model->forward_ref(ids.data(), n, cache_ref, ref.data(), /*all_logits=*/true);
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      ASSERT_TRUE(std::isfinite(logits[i])) << i;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(logits[i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(logits[i]) - ref[i]));
    }
    EXPECT_GT(max_abs, 1e-3) << "logits must not be all zero";
    EXPECT_LT(max_diff, 2e-4);
  }
}

// ---------------------------------------------------------------------------------------------------------
TEST(RandomCalibration, IdsAreSeededAndInRange) {
  CalibOptions o;
  o.samples = 8;
  o.seqlen = 512;
  o.seed = 11;
  const auto a = draw_random_calibration(49152, o), b = draw_random_calibration(49152, o);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 8u);
  double sum = 0;
  for (const auto& w : a) {
    ASSERT_EQ(w.size(), 512u);
    for (int32_t id : w) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 49152);
      sum += id;
    }
  }
  EXPECT_NEAR(sum / (8 * 512), 49152 / 2.0, 49152 * 0.02);   // uniform: mean vocab/2, std of the mean ~0.4%
  o.seed = 12;
  EXPECT_NE(draw_random_calibration(49152, o), a);
  EXPECT_NE(a[0], a[1]);
  o.samples = 0;
  EXPECT_THROW(draw_random_calibration(49152, o), Error);
  o.samples = 1;
  EXPECT_THROW(draw_random_calibration(0, o), Error);
  const auto tiny = draw_random_calibration(2, o);
  for (int32_t id : tiny[0]) EXPECT_TRUE(id == 0 || id == 1);
}

// ---------------------------------------------------------------------------------------------------------
// Throughput of one llama2-7b FFN weight [11008, 4096] (180 MB of fp32): printed, not asserted (shared machines).
TEST(RandomModel, GenerationThroughput) {
  const WeightSet ws = read_weights("random:llama2-7b?layers=1");
  const std::string name = "model.layers.0.mlp.gate_proj.weight";
  const std::vector<int64_t> shape = {11008, 4096};
  std::vector<float> out(static_cast<size_t>(11008) * 4096);
  ws.generator->fill(name, shape, out.data());   // first touch of the pages out of the timing
  const double bytes = static_cast<double>(out.size()) * sizeof(float);
  auto gbps = [&](int threads) {
    OmpThreads t(threads);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      ws.generator->fill(name, shape, out.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return bytes / best / 1e9;
  };
  // Baseline: writing the same buffer with a constant on one thread, the ceiling a generator could reach.
  double fill_best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::fill(out.begin(), out.end(), static_cast<float>(rep));
    fill_best = std::min(fill_best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double fill_gbps = bytes / fill_best / 1e9;
  const int all = omp_get_max_threads();
  const double one = gbps(1);
  const double many = gbps(all);
  std::printf("random weights [11008, 4096] fp32: %.2f GB/s on 1 thread (%.2fx of std::fill's %.2f GB/s; target >= 1 "
              "GB/s), %.2f GB/s on %d threads\n", one, one / fill_gbps, fill_gbps, many, all);
}

}  // namespace
}  // namespace lowbit
