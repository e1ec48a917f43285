// Quantization core: Hessian capture, RTN, GPTQ (against an exact naive reference), the driver on real models.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "model/model.h"
#include "quantize/capture.h"
#include "quantize/gptq.h"
#include "quantize/quantize_model.h"
#include "quantize/rtn.h"
#include "runtime/eval_text.h"
#include "runtime/perplexity.h"
#include "test_util.h"

namespace lowbit {
namespace {

// Error budgets of the quantizers vs full precision: relative RMS of the per-weight error of RTN on Gaussian
// weights, per bit width, group 32 (measured: ~0.60 / 0.27 / 0.13 / 0.062 / 0.031 / 0.015 / 0.0077).
constexpr double kMaxRelRmsRtn[9] = {0, 0, 0.65, 0.30, 0.145, 0.07, 0.035, 0.018, 0.009};

std::vector<float> gaussian(size_t n, uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Correlated inputs X = Z A (so H has real off-diagonal structure), and H = 2/N XᵀX computed directly in fp64.
std::vector<float> correlated_inputs(int64_t rows, int64_t k, uint64_t seed) {
  auto z = gaussian(static_cast<size_t>(rows * k), seed);
  auto a = gaussian(static_cast<size_t>(k * k), seed + 1, 0.3f);
  for (int64_t i = 0; i < k; ++i) a[static_cast<size_t>(i * k + i)] += 1.0f;
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(z[static_cast<size_t>(r * k + i)]) * a[static_cast<size_t>(i * k + j)];
      x[static_cast<size_t>(r * k + j)] = static_cast<float>(acc);
    }
  return x;
}

std::vector<double> direct_hessian(const std::vector<float>& x, int64_t rows, int64_t k) {
  std::vector<double> h(static_cast<size_t>(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double acc = 0;
      for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(x[static_cast<size_t>(r * k + i)]) * x[static_cast<size_t>(r * k + j)];
      h[static_cast<size_t>(i * k + j)] = 2.0 * acc / static_cast<double>(rows);
    }
  return h;
}

TEST(InputStats, HessianAndColumnStatsMatchDirectComputation) {
  const int64_t k = 37, rows = 3000;   // odd width; rows span two 2048-row chunks
  const auto x = correlated_inputs(rows, k, 5);
  InputStats st(k);
  st.add(x.data(), 1000);
  st.add(x.data() + 1000 * k, rows - 1000);
  const auto h = st.hessian(), want = direct_hessian(x, rows, k);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    worst = std::max(worst, std::fabs(h[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  EXPECT_LT(worst / scale, 1e-6);
  for (int64_t c = 0; c < k; ++c) {
    double mx = 0, sa = 0, sq = 0, s = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double v = x[static_cast<size_t>(r * k + c)];
      mx = std::max(mx, std::fabs(v));
      sa += std::fabs(v);
      sq += v * v;
      s += v;
    }
    EXPECT_DOUBLE_EQ(st.max_abs()[static_cast<size_t>(c)], mx);
    EXPECT_NEAR(st.mean_abs()[static_cast<size_t>(c)], sa / rows, 1e-9 * sa);
    EXPECT_NEAR(st.l2_norm()[static_cast<size_t>(c)], std::sqrt(sq), 1e-9 * std::sqrt(sq));
    EXPECT_NEAR(st.variance()[static_cast<size_t>(c)], sq / rows - (s / rows) * (s / rows), 1e-9 * sq / rows);
  }
}

TEST(Rtn, ErrorBudgetPerBitAndEncoding) {
  const int64_t n = 64, k = 256;
  const auto w = gaussian(static_cast<size_t>(n * k), 11);
  for (int bits = 2; bits <= 8; ++bits) {
    for (bool sym : {false, true}) {
      UniformSpec s;
      s.bits = bits;
      s.group_size = 32;
      s.symmetric = sym;
      const UniformQuantized q = rtn_quantize(w.data(), n, k, s);
      double err = 0, ref = 0;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const double d = q.dequant(r, c) - w[static_cast<size_t>(r * k + c)];
          err += d * d;
          ref += static_cast<double>(w[static_cast<size_t>(r * k + c)]) * w[static_cast<size_t>(r * k + c)];
          ASSERT_LT(q.codes[static_cast<size_t>(r * k + c)], 1 << bits);
        }
      EXPECT_LT(std::sqrt(err / ref), kMaxRelRmsRtn[bits]) << bits << " bits, sym " << sym;
    }
  }
  // MSE clipping never increases the |err|^2.4 objective it searches.
  UniformSpec s;
  s.bits = 3;
  s.group_size = 32;
  const auto plain = rtn_quantize(w.data(), n, k, s);
  s.mse_clip = true;
  const auto clipped = rtn_quantize(w.data(), n, k, s);
  double e_plain = 0, e_clip = 0;
  for (int64_t i = 0; i < n * k; ++i) {
    e_plain += std::pow(std::fabs(plain.dequant(i / k, i % k) - w[static_cast<size_t>(i)]), 2.4);
    e_clip += std::pow(std::fabs(clipped.dequant(i / k, i % k) - w[static_cast<size_t>(i)]), 2.4);
  }
  EXPECT_LT(e_clip, e_plain);
  std::vector<float> bad(w);
  bad[17] = NAN;
  EXPECT_THROW(rtn_quantize(bad.data(), n, k, UniformSpec{}), Error);
}

// The textbook sequential OBS update in fp64, no blocking, no Cholesky: after quantizing column i,
// w_j -= (w_i - ŵ_i) / [H⁻¹]_ii · [H⁻¹]_ij for j > i, then H⁻¹ <- H⁻¹ - H⁻¹_{:,i} H⁻¹_{i,:} / H⁻¹_ii.
std::vector<uint8_t> naive_gptq_codes(const std::vector<float>& w, int64_t n, int64_t k, std::vector<double> h,
                                      const UniformSpec& s, double percdamp) {
  double mean = 0;
  for (int64_t i = 0; i < k; ++i) mean += h[static_cast<size_t>(i * k + i)];
  for (int64_t i = 0; i < k; ++i) h[static_cast<size_t>(i * k + i)] += percdamp * mean / k;
  // Gauss-Jordan inverse
  std::vector<double> a(h), inv(static_cast<size_t>(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i) inv[static_cast<size_t>(i * k + i)] = 1;
  for (int64_t c = 0; c < k; ++c) {
    const double p = a[static_cast<size_t>(c * k + c)];
    for (int64_t j = 0; j < k; ++j) {
      a[static_cast<size_t>(c * k + j)] /= p;
      inv[static_cast<size_t>(c * k + j)] /= p;
    }
    for (int64_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[static_cast<size_t>(r * k + c)];
      for (int64_t j = 0; j < k; ++j) {
        a[static_cast<size_t>(r * k + j)] -= f * a[static_cast<size_t>(c * k + j)];
        inv[static_cast<size_t>(r * k + j)] -= f * inv[static_cast<size_t>(c * k + j)];
      }
    }
  }
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  const int maxq = (1 << s.bits) - 1;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<double> row(w.begin() + r * k, w.begin() + (r + 1) * k), hinv(inv);
    GroupParams p;
    for (int64_t i = 0; i < k; ++i) {
      if (i % s.group_size == 0) {
        std::vector<float> grp(row.begin() + i, row.begin() + std::min(k, i + s.group_size));
        p = find_group_params(grp.data(), static_cast<int64_t>(grp.size()), 1, s);
      }
      const int code = quantize_code(static_cast<float>(row[static_cast<size_t>(i)]), p, maxq);
      codes[static_cast<size_t>(r * k + i)] = static_cast<uint8_t>(code);
      const double d = hinv[static_cast<size_t>(i * k + i)];
      const double e = (row[static_cast<size_t>(i)] - dequant_code(code, p)) / d;
      for (int64_t j = i + 1; j < k; ++j) row[static_cast<size_t>(j)] -= e * hinv[static_cast<size_t>(i * k + j)];
      std::vector<double> col(static_cast<size_t>(k)), rw(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) {
        col[static_cast<size_t>(j)] = hinv[static_cast<size_t>(j * k + i)];
        rw[static_cast<size_t>(j)] = hinv[static_cast<size_t>(i * k + j)];
      }
      for (int64_t x = 0; x < k; ++x)
        for (int64_t y = 0; y < k; ++y) hinv[static_cast<size_t>(x * k + y)] -= col[static_cast<size_t>(x)] * rw[static_cast<size_t>(y)] / d;
    }
  }
  return codes;
}

TEST(Gptq, MatchesNaiveSequentialReferenceExactly) {
  const int64_t n = 6, k = 40, rows = 400;
  const auto w = gaussian(static_cast<size_t>(n * k), 21);
  const auto x = correlated_inputs(rows, k, 22);
  const auto h = direct_hessian(x, rows, k);
  GptqOptions o;
  o.spec.bits = 3;
  o.spec.group_size = 8;
  o.block_size = 16;   // blocks cross group boundaries and the lazy batched update is exercised
  const UniformQuantized q = gptq_quantize(w.data(), n, k, h, o);
  EXPECT_EQ(q.codes, naive_gptq_codes(w, n, k, h, o.spec, o.percdamp));
}

TEST(Gptq, DiagonalHessianIsRtnAndBeatsRtnOtherwise) {
  const int64_t n = 32, k = 96, rows = 800;
  const auto w = gaussian(static_cast<size_t>(n * k), 31);
  std::vector<double> diag(static_cast<size_t>(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i) diag[static_cast<size_t>(i * k + i)] = 1.0 + static_cast<double>(i % 7);
  GptqOptions o;
  o.spec.bits = 4;
  o.spec.group_size = 32;
  EXPECT_EQ(gptq_quantize(w.data(), n, k, diag, o).codes, rtn_quantize(w.data(), n, k, o.spec).codes);
  const auto h = direct_hessian(correlated_inputs(rows, k, 32), rows, k);
  for (int bits = 2; bits <= 8; ++bits) {
    o.spec.bits = bits;
    for (bool act : {false, true}) {
      o.act_order = act;
      const double e_gptq = hessian_weighted_error(w.data(), gptq_quantize(w.data(), n, k, h, o), h);
      const double e_rtn = hessian_weighted_error(w.data(), rtn_quantize(w.data(), n, k, o.spec), h);
      EXPECT_LT(e_gptq, e_rtn) << bits << " bits, act-order " << act;
    }
  }
}

TEST(Gptq, ActOrderAndStaticGroupsEncodings) {
  const int64_t n = 8, k = 64, rows = 500;
  const auto w = gaussian(static_cast<size_t>(n * k), 41);
  const auto h = direct_hessian(correlated_inputs(rows, k, 42), rows, k);
  GptqOptions o;
  o.spec.bits = 4;
  o.spec.group_size = 16;
  o.act_order = true;
  const auto a = gptq_quantize(w.data(), n, k, h, o);
  ASSERT_EQ(a.g_idx.size(), static_cast<size_t>(k));   // groups follow the processing order
  std::vector<int> per_group(4, 0);
  for (int32_t g : a.g_idx) ++per_group[static_cast<size_t>(g)];
  EXPECT_EQ(per_group, (std::vector<int>{16, 16, 16, 16}));
  o.static_groups = true;
  const auto b = gptq_quantize(w.data(), n, k, h, o);
  EXPECT_TRUE(b.g_idx.empty());                          // static groups keep the original order: no g_idx
  // dead input column: zero Hessian row -> weights of that column quantize to 0
  std::vector<double> hd(h);
  for (int64_t j = 0; j < k; ++j) hd[static_cast<size_t>(5 * k + j)] = hd[static_cast<size_t>(j * k + 5)] = 0.0;
  GptqStats st;
  o = GptqOptions{};
  o.spec.bits = 4;
  const auto d = gptq_quantize(w.data(), n, k, hd, o, &st);
  EXPECT_EQ(st.dead_columns, 1);
  for (int64_t r = 0; r < n; ++r) EXPECT_EQ(d.dequant(r, 5), 0.0f);
}

// ---------------------------------------------------------------------------------------------------------
// End to end on real models.

double ppl_subset(const Model& m, const std::vector<int32_t>& ids, int ctx, int windows) {
  PplOptions po;
  po.ctx = ctx;
  po.max_windows = windows;
  return perplexity(m, make_windows_contiguous(ids, ctx), po).ppl;
}

TEST(Quantize, Stories260KRoundTripThroughLowbitFile) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  auto model = Model::load(bin);
  QuantizeOptions o;
  o.gptq.spec.bits = 4;
  o.gptq.spec.group_size = 32;
  o.calib.samples = 16;
  o.calib.seqlen = 128;
  const std::string out = test::temp_dir() + "/s.lowbit";
  const QuantizeReport r = quantize_to_file(*model, o, out);
  EXPECT_LT(r.hessian_error_sum, r.rtn_hessian_error_sum);
  // Every stored bit counted: rows of 4-bit codes padded to 32-bit words, fp16 scale + u8 zero per group of 32
  // (4.75 bits where k is a multiple of 32; down_proj has k = 172, so 6 groups and a padded word per row).
  double bits = 0, weights = 0;
  for (int l = 0; l < model->config().n_layers; ++l)
    for (const std::string& name : model->linear_names(l)) {
      const auto& sh = model->tensor_shape(name);
      const double n = static_cast<double>(sh[0]), k = static_cast<double>(sh[1]);
      bits += n * std::ceil(k * 4 / 32) * 32 + n * std::ceil(k / 32) * (16 + 8);
      weights += n * k;
    }
  EXPECT_NEAR(r.avg_bits, bits / weights, 1e-9);
  // The file decodes to exactly the weights the in-memory fake-quantized model used: same logits.
  auto loaded = Model::load(out);
  EXPECT_TRUE(loaded->has_packed_weights());
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 430, 271, 280};
  const int V = loaded->config().vocab_size;
  std::vector<float> a(static_cast<size_t>(V)), b(a.size());
  KVCache ca = model->new_cache(8), cb = loaded->new_cache(8);
  model->forward(ids.data(), 8, ca, a.data(), false);
  loaded->forward(ids.data(), 8, cb, b.data(), false);
  for (int i = 0; i < V; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]) << i;
}

// GPTQ must beat RTN on SmolLM2. What CI can afford on 2 cores (GPTQ's column sweep alone costs ~55 s per width
// here, whatever the calibration size): (1) at 8 bits per channel (the one width where GPTQ loses in perplexity, and
// the path without groups) and at 3 bits g128, the layer objective sum_l tr(dW H dWT) of GPTQ below RTN's on the same
// Hessians (in-sample); (2) at 3 bits, where the full-test gap is wide (GPTQ 78.0 vs RTN 123.2, docs/QUALITY.md),
// perplexity on the first 4 WikiText-2 windows of 512 tokens (a subset). The calibration must stay at 16 x 512: with
// 4 x 512 GPTQ overfits and loses to RTN on those windows (184.7 vs 167.4, against 143.8 at 16 x 512). 2, 4..7 bits
// are covered by the full-test table in docs/QUALITY.md (GPTQ ahead at every width 2..8 with groups; behind by 0.25%
// at 8 bits per channel).
TEST(Quantize, SmolLM2GptqBeatsRtnAt3And8Bits) {
  const std::string gguf = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(gguf, "SmolLM2 GGUF");
  const std::string wiki = test::shared_path("data/wikitext-2-raw/wiki.test.raw");
  LOWBIT_REQUIRE_FILE(wiki, "WikiText-2");
  const std::string dir = test::temp_dir();
  for (const int bits : {3, 8}) {
    QuantizeOptions o;
    o.gptq.spec.bits = bits;
    o.gptq.spec.group_size = bits == 8 ? 0 : 128;
    o.calib.samples = bits == 3 ? 16 : 2;
    o.calib.seqlen = bits == 3 ? 512 : 256;
    auto g = Model::load(gguf);
    const QuantizeReport rg = quantize_to_file(*g, o, dir + "/g.lowbit");
    EXPECT_LT(rg.hessian_error_sum, rg.rtn_hessian_error_sum) << bits << " bits";
    if (bits != 3) continue;
    o.method = QuantMethod::Rtn;
    auto r = Model::load(gguf);
    quantize_to_file(*r, o, dir + "/r.lowbit");
    const auto gq = Model::load(dir + "/g.lowbit"), rq = Model::load(dir + "/r.lowbit");
    const auto ids = gq->tokenizer().encode(load_eval_text(wiki, TextMode::WikiText, "text", "").docs[0], false, false);
    const double ppl_g = ppl_subset(*gq, ids, 512, 4), ppl_r = ppl_subset(*rq, ids, 512, 4);
    std::printf("[ 3 bits g128 ] GPTQ ppl %.3f  RTN ppl %.3f (first 4 x 512-token windows)\n", ppl_g, ppl_r);
    EXPECT_LT(ppl_g, ppl_r);
  }
}

}  // namespace
}  // namespace lowbit
