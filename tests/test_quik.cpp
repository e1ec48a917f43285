// QUIK: per-token activation quantization (integer and FP8), the integer-exact reference and its float twin, the
// zero-point correction, the packed layout (bit-exact round trip, corrupt parts), outlier-aware GPTQ, the CLI.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "core/half.h"
#include "formats/format_table.h"
#include "formats/quik/layout.h"
#include "model/model.h"
#include "quantize/calibration.h"
#include "quantize/gptq.h"
#include "quantize/quik.h"
#include "runtime/backend.h"
#include "packed_fixtures.h"
#include "test_util.h"

namespace lowbit {
namespace {

constexpr double kSimRelTol = 1e-6;        // integer path vs float simulation of the same quantization (fp64 sums)
constexpr double kFastVsRefRelTol = 1e-5;  // BLAS fast path vs the reference (outlier GEMM in fp32)
// Named per-bit budgets of outlier-aware GPTQ on the synthetic layer: layer objective / ‖W‖²_H.
constexpr double kW4RelObjective = 1e-3;   // measured 1.4e-4 (without the outlier columns: 1.3e-2)
constexpr double kW8RelObjective = 1e-5;   // measured 4.4e-7

std::vector<float> activations(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) x[static_cast<size_t>(i)] = nd(rng) * (i % 23 == 0 ? 20.0f : 1.0f) + 0.3f;
  return x;
}

TEST(QuikActivations, ConstantZeroAndNonFiniteRows) {
  for (int abits : {4, 8}) {
    const int H = 1 << (abits - 1);
    std::vector<int32_t> codes(5);
    const std::vector<float> constant(5, 3.25f), zeros(5, 0.0f);
    ActQuant a = quik_quantize_activations(constant.data(), 5, abits, false, codes.data());
    for (int32_t c : codes) EXPECT_EQ(c, -H);   // decodes to (c + H) * sa + mn = mn exactly
    EXPECT_EQ((codes[0] + H) * a.sa + a.mn, 3.25f);
    a = quik_quantize_activations(zeros.data(), 5, abits, false, codes.data());
    EXPECT_EQ((codes[2] + H) * a.sa + a.mn, 0.0f);
    const std::vector<float> ramp = {-1.0f, -0.5f, 0.0f, 0.5f, 2.0f};
    a = quik_quantize_activations(ramp.data(), 5, abits, false, codes.data());
    EXPECT_EQ(codes[0], -H);
    EXPECT_EQ(codes[4], H - 1);   // the maximum maps to the top code
    for (int i = 0; i < 5; ++i) EXPECT_NEAR((codes[i] + H) * a.sa + a.mn, ramp[static_cast<size_t>(i)], a.sa / 2 + 1e-7);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = ramp;
      x[3] = bad;
      try {
        quik_quantize_activations(x.data(), 5, abits, false, codes.data());
        ADD_FAILURE() << "non-finite activation accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
      }
      EXPECT_THROW(quik_quantize_activations(x.data(), 5, 8, true, codes.data()), Error);
    }
  }
  // E4M3: 3 mantissa bits, subnormal step 2^-9, saturation at 448, ties to even.
  EXPECT_EQ(e4m3_round(448.0f), 448.0f);
  EXPECT_EQ(e4m3_round(1000.0f), 448.0f);
  EXPECT_EQ(e4m3_round(-1000.0f), -448.0f);
  EXPECT_EQ(e4m3_round(1.0625f), 1.0f);     // halfway between 1 and 1.125: to even
  EXPECT_EQ(e4m3_round(1.1875f), 1.25f);    // halfway between 1.125 and 1.25: to even
  EXPECT_EQ(e4m3_round(0.3f), 0.3125f);
  EXPECT_EQ(e4m3_round(std::ldexp(1.4f, -9)), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_round(std::ldexp(0.4f, -9)), 0.0f);
  std::vector<int32_t> codes(3);
  const std::vector<float> x = {-2.0f, 0.5f, 1.0f};
  const ActQuant a = quik_quantize_activations(x.data(), 3, 8, true, codes.data());
  EXPECT_FLOAT_EQ(a.sa, 2.0f / 448.0f);
  EXPECT_EQ(codes[0], -448 * 512);
}

// The CPU linear quantizes its tokens on OpenMP threads: a non-finite activation in one of many rows still surfaces
// as the one-line error, not a crash.
TEST(QuikGemm, NonFiniteRowInAThreadedForwardIsAnError) {
  const QuikQuantized q = test::random_quik(32, 1024, 8, 8, false, 16, 77);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const PackedWeight w = pack_quik(q, storage);
  const auto op = make_packed_linear(w, nullptr, "t");
  const int64_t m = 256;
  std::vector<float> x = activations(m, 1024, 9), y(static_cast<size_t>(m * 32));
  x[static_cast<size_t>(200 * 1024 + 5)] = std::numeric_limits<float>::quiet_NaN();   // a base column (outliers: 16)
  bool base = true;
  for (int32_t c : q.outlier_idx) base = base && c != 5;
  ASSERT_TRUE(base);
  // "quik: activation 5 is nan (non-finite input cannot be quantized)", one line.
  test::expect_error([&](const std::string&) { op->forward(x.data(), m, y.data()); }, "activation", "non-finite");
}

TEST(QuikGemm, IntegerPathEqualsFloatSimulationAndFastPath) {
  struct Case {
    int wbits, abits;
    bool fp8;
  };
  for (const Case cs : {Case{4, 4, false}, Case{4, 8, false}, Case{8, 8, false}, Case{4, 16, false}, Case{8, 16, false}, Case{4, 8, true}})
    // 5 x 2100: a row whose integer sums can pass 2^24 at W8A8 (the fast path splits it into exact sgemm chunks).
    for (const auto& [n, k, no] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{7, 33, 5}, {16, 64, 0}, {3, 9, 9}, {24, 300, 40}, {5, 2100, 20}}) {
      SCOPED_TRACE("W" + std::to_string(cs.wbits) + "A" + std::to_string(cs.abits) + (cs.fp8 ? " fp8 " : " ") +
                   std::to_string(n) + "x" + std::to_string(k) + " outliers " + std::to_string(no));
      const QuikQuantized q = test::random_quik(n, k, cs.wbits, cs.abits, cs.fp8, no, static_cast<uint32_t>(n * k + no));
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const PackedWeight w = pack_quik(q, storage);
      std::vector<float> bias(static_cast<size_t>(n), 0.25f);
      const int64_t m = 3, kb = q.base();
      const std::vector<float> x = activations(m, k, 5);
      std::vector<float> y(static_cast<size_t>(m * n), NAN), yf(y.size(), NAN);
      std::vector<int64_t> acc;
      quik_gemm_packed_ref(w, x.data(), m, bias.data(), y.data(), &acc);
      const auto op = make_packed_linear(w, bias.data(), "t");
      op->forward(x.data(), m, yf.data());
      // The float simulation: decode the quantized activations and weights, multiply in fp64.
      std::vector<float> wd(static_cast<size_t>(n * k));
      q.dequantize(wd.data());
      const std::vector<int64_t> base = q.base_columns();
      std::vector<float> xb(static_cast<size_t>(kb));
      std::vector<int32_t> codes(static_cast<size_t>(kb));
      for (int64_t t = 0; t < m; ++t) {
        for (int64_t j = 0; j < kb; ++j) xb[static_cast<size_t>(j)] = x[static_cast<size_t>(t * k + base[static_cast<size_t>(j)])];
        ActQuant a;
        if (cs.abits != 16) a = quik_quantize_activations(xb.data(), kb, cs.abits, cs.fp8, codes.data());
        const double H = cs.abits == 16 ? 0 : std::ldexp(1.0, cs.abits - 1);
        for (int64_t r = 0; r < n; ++r) {
          double sim = bias[static_cast<size_t>(r)];
          int64_t direct = 0;
          for (int64_t j = 0; j < kb; ++j) {
            const double xhat = cs.abits == 16 ? xb[static_cast<size_t>(j)]
                                : cs.fp8      ? static_cast<double>(codes[static_cast<size_t>(j)]) / 512.0 * a.sa
                                              : (codes[static_cast<size_t>(j)] + H) * a.sa + a.mn;
            sim += xhat * wd[static_cast<size_t>(r * k + base[static_cast<size_t>(j)])];
            direct += static_cast<int64_t>(codes[static_cast<size_t>(j)]) * q.wq[static_cast<size_t>(r * kb + j)];
          }
          for (int32_t c : q.outlier_idx)
            sim += static_cast<double>(f16_to_f32(f32_to_f16(x[static_cast<size_t>(t * k + c)]))) * wd[static_cast<size_t>(r * k + c)];
          const float yr = y[static_cast<size_t>(t * n + r)];
          EXPECT_NEAR(yr, sim, kSimRelTol * (1 + std::fabs(sim))) << "t " << t << " r " << r;
          EXPECT_NEAR(yf[static_cast<size_t>(t * n + r)], yr, kFastVsRefRelTol * (1 + std::fabs(yr)));
          if (cs.abits != 16) {
            EXPECT_EQ(acc[static_cast<size_t>(t * n + r)], direct);   // the integer GEMM, exactly
          }
        }
      }
    }
}

TEST(QuikGemm, ZeroPointCorrectionIsExact) {
  // Σ_c (xq_c + H) wq_c = acc + H Σ_c wq_c in integers, and wReduced = sw · Σ wq by definition: the correction
  // term (H sa + mn) wReduced reproduces the unsigned-code product with no approximation beyond fp rounding.
  const QuikQuantized q = test::random_quik(8, 200, 4, 4, false, 0, 3);
  const std::vector<float> x = activations(1, 200, 9);
  std::vector<int32_t> codes(200);
  const ActQuant a = quik_quantize_activations(x.data(), 200, 4, false, codes.data());
  for (int64_t r = 0; r < 8; ++r) {
    int64_t acc = 0, sumw = 0, unsigned_acc = 0;
    for (int64_t j = 0; j < 200; ++j) {
      const int64_t wq = q.wq[static_cast<size_t>(r * 200 + j)];
      acc += codes[static_cast<size_t>(j)] * wq;
      sumw += wq;
      unsigned_acc += (codes[static_cast<size_t>(j)] + 8) * wq;
    }
    EXPECT_EQ(unsigned_acc, acc + 8 * sumw);
    const double sw = f16_to_f32(q.scale[static_cast<size_t>(r)]);
    EXPECT_EQ(q.wreduced[static_cast<size_t>(r)], static_cast<float>(sw * static_cast<double>(sumw)));
    const double corrected = a.sa * sw * acc + (8.0 * a.sa + a.mn) * q.wreduced[static_cast<size_t>(r)];
    const double direct = a.sa * sw * unsigned_acc + a.mn * sw * sumw;
    EXPECT_NEAR(corrected, direct, 1e-12 * (1 + std::fabs(direct)));
  }
}

// Which QUIK weights the GPU runs (format_table's gpu_refuses): integer activations; FP8 and A16 stay on the CPU,
// and a model holding one is kept off the GPU by --device auto (first_cpu_only_weight) with the reason named.
TEST(QuikGpu, EveryActivationFormRunsThere) {
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  for (const auto& [wbits, abits, fp8] : std::vector<std::tuple<int, int, bool>>{{4, 8, false}, {8, 4, false}, {4, 8, true}, {8, 16, false}})
    EXPECT_EQ(gpu_refusal(pack_quik(test::random_quik(4, 64, wbits, abits, fp8, 2, 1), storage)), nullptr)
        << "W" << wbits << "A" << abits << (fp8 ? " FP8" : "");
  // Only a weight without its activation parameters stays on the CPU (by name).
  WeightSet ws;
  ws.packed["model.layers.0.mlp.up_proj.weight"] = pack_quik(test::random_quik(4, 64, 8, 8, false, 2, 1), storage);
  ws.packed["model.layers.0.mlp.down_proj.weight"] = pack_quik(test::random_quik(4, 64, 4, 8, true, 2, 1), storage);
  EXPECT_EQ(first_cpu_only_weight(ws), "");
  ws.packed["model.layers.0.mlp.down_proj.weight"].params.erase("act_fp8");
  EXPECT_EQ(first_cpu_only_weight(ws), "model.layers.0.mlp.down_proj.weight");
  const char* why = gpu_refusal(ws.packed["model.layers.0.mlp.down_proj.weight"]);
  ASSERT_NE(why, nullptr);
  EXPECT_NE(std::string(why).find("activation parameters are missing"), std::string::npos) << why;
}

TEST(QuikPack, RoundTripIsBitExactAndBitsFollowTheLayout) {
  for (int wbits : {4, 8})
    for (const auto& [n, k, no] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 0}, {5, 17, 4}, {3, 64, 63}, {9, 100, 100}}) {
      const QuikQuantized q = test::random_quik(n, k, wbits, 8, false, no, static_cast<uint32_t>(wbits + n + k));
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const PackedWeight w = pack_quik(q, storage);
      const QuikQuantized u = unpack_quik(w, "t");
      EXPECT_EQ(u.wq, q.wq) << wbits << " " << n << "x" << k;
      EXPECT_EQ(u.scale, q.scale);
      EXPECT_EQ(u.wreduced, q.wreduced);
      EXPECT_EQ(u.outlier_idx, q.outlier_idx);
      EXPECT_EQ(u.outlier_w, q.outlier_w);
      const int64_t kb = k - no;
      const uint64_t want = (wbits == 8 ? 8ull * n * kb : 8ull * n * ((kb + 1) / 2)) + 16ull * n + 32ull * n + 32ull * no + 16ull * n * no;
      EXPECT_EQ(packed_stored_bits(w, "t"), want);
      // dequantize puts every column back at its original index: base columns ascending, then the outliers
      std::vector<float> wd(static_cast<size_t>(n * k));
      u.dequantize(wd.data());
      for (int64_t o = 0; o < no; ++o)
        EXPECT_EQ(wd[static_cast<size_t>(u.outlier_idx[static_cast<size_t>(o)])], f16_to_f32(u.outlier_w[static_cast<size_t>(o)]));
    }
}

struct Layer {
  int64_t n = 32, k = 96;
  std::vector<float> w;
  std::vector<double> h, amax;
};
Layer random_layer(uint32_t seed) {
  Layer p;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  for (int64_t i = 0; i < p.n * p.k; ++i) p.w.push_back(static_cast<float>(0.05 * nd(rng)));
  const int64_t N = 512;
  std::vector<double> x(static_cast<size_t>(N * p.k));
  p.amax.assign(static_cast<size_t>(p.k), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < p.k; ++c) {
      const double v = nd(rng) * (c % 11 == 3 ? 30.0 : 1.0);   // a few massive-activation channels
      x[static_cast<size_t>(t * p.k + c)] = v;
      p.amax[static_cast<size_t>(c)] = std::max(p.amax[static_cast<size_t>(c)], std::fabs(v));
    }
  p.h.assign(static_cast<size_t>(p.k * p.k), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t a = 0; a < p.k; ++a)
      for (int64_t b = 0; b < p.k; ++b)
        p.h[static_cast<size_t>(a * p.k + b)] += 2.0 / N * x[static_cast<size_t>(t * p.k + a)] * x[static_cast<size_t>(t * p.k + b)];
  return p;
}

TEST(QuikQuantize, OutlierColumnsAndFeedbackIntoThem) {
  const Layer p = random_layer(4);
  const std::vector<int32_t> cols = quik_outlier_columns(p.amax, 9);
  ASSERT_EQ(cols.size(), 9u);
  for (int32_t c : cols) EXPECT_EQ(c % 11, 3) << "outlier columns are the massive-activation channels";
  double wnorm = 0;
  {
    std::vector<float> zero(p.w.size(), 0.0f);
    wnorm = hessian_weighted_error(p.w.data(), zero.data(), p.n, p.k, p.h);
  }
  QuikStats with, without, w8;
  const QuikQuantized q = quik_quantize(p.w.data(), p.n, p.k, p.h, cols, 4, 8, false, false, 0.01, &with);
  quik_quantize(p.w.data(), p.n, p.k, p.h, {}, 4, 8, false, false, 0.01, &without);
  quik_quantize(p.w.data(), p.n, p.k, p.h, cols, 8, 8, false, false, 0.01, &w8);
  std::printf("[ quik layer objective / |W|_H^2 ] W4 outliers %.3g  W4 none %.3g  W8 outliers %.3g\n", with.hessian_error / wnorm,
              without.hessian_error / wnorm, w8.hessian_error / wnorm);
  EXPECT_LT(10 * with.hessian_error, without.hessian_error);   // the mechanism: outlier columns carry the error
  EXPECT_LT(with.hessian_error, kW4RelObjective * wnorm);
  EXPECT_LT(w8.hessian_error, kW8RelObjective * wnorm);
  // GPTQ's error feedback reached the fp16 outlier columns: they differ from the original weights, and putting the
  // original values back makes the layer objective worse.
  std::vector<float> wd(p.w.size());
  q.dequantize(wd.data());
  int changed = 0;
  for (int64_t r = 0; r < p.n; ++r)
    for (int32_t c : cols) changed += wd[static_cast<size_t>(r * p.k + c)] != f16_to_f32(f32_to_f16(p.w[static_cast<size_t>(r * p.k + c)]));
  EXPECT_GT(changed, static_cast<int>(p.n * cols.size() / 2));
  std::vector<float> reverted = wd;
  for (int64_t r = 0; r < p.n; ++r)
    for (int32_t c : cols) reverted[static_cast<size_t>(r * p.k + c)] = p.w[static_cast<size_t>(r * p.k + c)];
  EXPECT_GT(hessian_weighted_error(p.w.data(), reverted.data(), p.n, p.k, p.h), with.hessian_error);
  // Clipping search: never worse on the squared error it minimises, so never a larger objective by much.
  QuikStats clipped;
  quik_quantize(p.w.data(), p.n, p.k, p.h, cols, 4, 8, false, true, 0.01, &clipped);
  EXPECT_LT(clipped.hessian_error, 1.5 * with.hessian_error);
}

TEST(QuikQuantize, ExactlyRepresentableWeightsRoundTripThroughThePermutation) {
  // Base columns on the integer grid of a power-of-two scale, outlier columns fp16-exact: quantization error is
  // zero, nothing flows, and dequantize returns W exactly in the original column order.
  const Layer p = random_layer(6);
  const std::vector<int32_t> cols = {2, 40, 95};
  std::vector<float> w(p.w.size());
  std::mt19937 rng(1);
  for (int64_t r = 0; r < p.n; ++r)
    for (int64_t c = 0; c < p.k; ++c) {
      const bool out = std::find(cols.begin(), cols.end(), c) != cols.end();
      w[static_cast<size_t>(r * p.k + c)] = out ? f16_to_f32(f32_to_f16(0.37f * static_cast<float>(c - r)))
                                                : std::ldexp(static_cast<float>(static_cast<int>(rng() % 15) - 7), -6);
    }
  for (int64_t r = 0; r < p.n; ++r) w[static_cast<size_t>(r * p.k + (r % 2 == 0 ? 0 : 1))] = std::ldexp(7.0f, -6);   // row max = 7 · 2^-6
  QuikStats st;
  const QuikQuantized q = quik_quantize(w.data(), p.n, p.k, p.h, cols, 4, 4, false, false, 0.01, &st);
  std::vector<float> wd(w.size());
  q.dequantize(wd.data());
  EXPECT_EQ(wd, w);
  EXPECT_EQ(st.hessian_error, 0.0);
}

TEST(QuikCorrupt, ReadersRefuseBadParts) {
  const QuikQuantized q = test::random_quik(6, 33, 4, 8, false, 4, 2);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const PackedWeight good = pack_quik(q, storage);
  auto with_bytes = [&](const std::string& part, size_t offset, const std::vector<uint8_t>& value) {
    return test::with_part_bytes(good, part, offset, value, storage);
  };
  const auto expect = test::expect_packed_refused;
  float wr = q.wreduced[1] * 1.5f + 1.0f;
  std::vector<uint8_t> bytes(4);
  std::memcpy(bytes.data(), &wr, 4);
  expect(with_bytes("wreduced", 4, bytes), "is not scale * sum of the row's codes");
  expect(with_bytes("outlier_idx", 4, {0, 0, 0, 0}), "not increasing");
  // kb = 29 is odd: the last byte of a row has a padding nibble
  expect(with_bytes("qweight4", 14, {0xf0}), "non-zero padding nibble");
  expect(with_bytes("scale", 0, {0x00, 0x7c}), "part scale [0] is not finite");
  {
    PackedWeight w = good;
    w.params["act_fp8"] = 1;
    w.params["abits"] = 4;
    expect(w, "act_fp8 needs wbits 4 and abits 8");
  }
  {
    PackedWeight w = good;
    w.params["wbits"] = 8;
    expect(w, "part qweight4 must be absent when wbits = 8");
  }
}

TEST(QuikCli, QuantizesEvaluatesAndRefusesMisuse) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  LOWBIT_REQUIRE_FILE(text, "TinyStories sample");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  const std::string dir = test::temp_dir();
  std::string out;
  ASSERT_EQ(test::run_cli("quantize " + bin + " --method quik --wbits 4 --abits 8 --int8-down-proj --calib-samples 4 "
                          "--calib-seqlen 64 -o " + dir + "/q.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("fp16 outlier columns: 190"), std::string::npos) << "4 per dim-wide input, 14 for down_proj\n" << out;
  ASSERT_EQ(test::run_cli("ppl " + dir + "/q.lowbit --text " + text + " --max-windows 1", &out), 0) << out;
  EXPECT_NE(out.find("perplexity"), std::string::npos) << out;
  // One file, any activation width at load time: unquantized activations score at least as well as 4-bit ones.
  auto nll = [&](const std::string& abits) {
    std::string o;
    EXPECT_EQ(test::run_cli("ppl " + dir + "/q.lowbit --text " + text + " --max-windows 1 --abits " + abits, &o), 0) << o;
    const size_t at = o.find("mean NLL: ");
    return at == std::string::npos ? 1e9 : std::stod(o.substr(at + 10));
  };
  const double a16 = nll("16"), a4 = nll("4");
  EXPECT_LT(a16, a4);
  EXPECT_LT(a4, 1e9);
  // The loaded model: the fast path agrees with the integer reference on real activations. Per linear, on the
  // inputs the model's forward gives it: the same input gives the same codes, so the kernel budget applies.
  // Whole-model logits are compared with activations not quantized (abits 16) only: the two forwards differ
  // upstream by an ulp (fp32 BLAS vs fp64 loops), and a quantized activation that close to a rounding boundary
  // takes the other code (seen: 128.50002 vs 128.49999 in a down_proj), which moves the logits by up to 0.1
  // depending on the quantized file's last bits (thread count, -march).
  const std::vector<int32_t> tokens = {1, 200, 300, 17, 5, 90};
  const int n = static_cast<int>(tokens.size());
  auto load_at = [&](const std::string& abits) {
    LoadOptions opts;
    opts.quik_abits = abits;
    return Model::load(dir + "/q.lowbit", opts);
  };
  for (const char* abits : {"", "4"}) {   // as stored (8), and as `ppl --abits 4` runs it
    SCOPED_TRACE(std::string("abits '") + abits + "'");
    const auto model = load_at(abits);
    const ModelConfig& c = model->config();
    std::vector<float> x(static_cast<size_t>(n * c.dim));
    model->embed(tokens.data(), n, x.data());
    KVCache cache = model->new_cache(16);
    int checked = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      const std::vector<std::string> names = model->linear_names(l);   // q, k, v, o, gate, up, down
      const LinearInputHook hook = [&](int, LinearSlot slot, const float* in, int rows, int64_t) {
        for (size_t i = 0; i < names.size(); ++i) {   // the linears that read this slot's input
          if (kLinearSlot[i] != slot) continue;
          const std::string& name = names[i];
          const auto op = make_packed_linear(model->weights().packed.at(name), nullptr, name);
          std::vector<float> fast(static_cast<size_t>(rows * op->n())), ref(fast.size());
          op->forward(in, rows, fast.data());
          op->forward_ref(in, rows, ref.data());
          for (size_t j = 0; j < fast.size(); ++j)
            EXPECT_NEAR(fast[j], ref[j], kFastVsRefRelTol * (1 + std::fabs(ref[j]))) << name << " [" << j << "]";
          ++checked;
        }
      };
      model->layer_forward(l, x.data(), n, 0, cache, &hook);
    }
    EXPECT_EQ(checked, 7 * c.n_layers);
  }
  const auto model = load_at("16");
  const size_t V = static_cast<size_t>(model->config().vocab_size);
  std::vector<float> fast(tokens.size() * V), ref(fast.size());
  KVCache c1 = model->new_cache(16), c2 = model->new_cache(16);
  model->forward(tokens.data(), n, c1, fast.data(), true);
  model->forward_ref(tokens.data(), n, c2, ref.data(), true);
  for (size_t i = 0; i < fast.size(); ++i) EXPECT_NEAR(fast[i], ref[i], 1e-3 * (1 + std::fabs(ref[i])));
  test::expect_cli_refuses({
      {"quantize " + bin + " --method quik --outliers 2.5 -o " + dir + "/c.lowbit", "quik: --outliers is a column count"},
      {"quantize " + bin + " --method quik --wbits 8 --act-fp8 -o " + dir + "/c.lowbit", "--act-fp8 needs --wbits 4 --abits 8"},
      {"quantize " + bin + " --method quik --wbits 3 -o " + dir + "/c.lowbit", "--wbits"},
      {"quantize " + bin + " --method anyprec --outliers 3 -o " + dir + "/c.lowbit", "--outliers is a fraction"},
      {"ppl " + bin + " --text " + text + " --abits 8", "--abits applies to QUIK models only"},
      {"ppl " + dir + "/q.lowbit --text " + text + " --abits 3", "--abits must be 4, 8, 16 or fp8"},
      {"ppl " + dir + "/q.lowbit --text " + text + " --abits fp8", "has 8-bit weights; FP8 activations need W4"},
  }, dir + "/c.lowbit");
}

}  // namespace
}  // namespace lowbit
