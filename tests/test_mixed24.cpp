// 2/4-bit intra-matrix mixed precision: eq. 9 sensitivity, allocation, two-order scales, exclusive 2-bit outliers,
// the generic packed layout (bit-exact round trip, corrupt parts), the CPU reference, and the file's bit accounting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/half.h"
#include "formats/format_table.h"
#include "formats/mixed24/layout.h"
#include "formats/mixed24a/layout.h"
#include "io/lowbit_file.h"
#include "model/model.h"
#include "quantize/mixed24.h"
#include "quantize/quantize_model.h"
#include "packed_fixtures.h"
#include "test_util.h"

namespace lowbit {
namespace {

constexpr double kFastVsRefRelTol = 2e-5;        // fp32 BLAS vs double accumulation on identical weights
constexpr double kScaleQuantRelErr = 1.0 / 30;   // 4-bit second-order codes: |ŝ - s| <= step/2 = range/30


TEST(Mixed24Pack, RoundTripIsBitExactForOddShapes) {
  uint32_t seed = 1;
  for (int64_t n : {1, 5, 17, 33})
    for (int64_t k : {1, 15, 16, 17, 100, 257}) {
      const Mixed24Quantized q = test::random_mixed(n, k, seed % 2 == 0, seed);
      ++seed;
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const PackedWeight w = pack_mixed24(q, storage);
      const Mixed24Quantized u = unpack_mixed24(w, "t");
      EXPECT_EQ(u.codes, q.codes) << n << "x" << k;
      EXPECT_EQ(u.group_bits, q.group_bits);
      EXPECT_EQ(u.zero2, q.zero2);
      EXPECT_EQ(u.scode2, q.scode2);
      EXPECT_EQ(u.ss2, q.ss2);
      EXPECT_EQ(u.sm2, q.sm2);
      EXPECT_EQ(u.scale4, q.scale4);
      EXPECT_EQ(u.zero4, q.zero4);
      EXPECT_EQ(u.outlier_col, q.outlier_col);
      EXPECT_EQ(u.outlier_val, q.outlier_val);
      // Stored bits: 2 bits per 2-bit-group code and 4 per 4-bit one (short last group padded), 6 per (row, 2-bit
      // group) of scale code + zero in whole words per row, 32 per (16 rows, 2-bit group), 16 + 4 per (row, 4-bit
      // group) (zeros in whole words per row), the group widths, CSR.
      const int64_t G = q.groups();
      const uint64_t want = 32ull * n * (q.g2 + 2 * q.g4) + 32ull * n * ((6 * q.g2 + 31) / 32) +
                            32ull * q.row_groups() * q.g2 + 16ull * n * q.g4 + 32ull * n * ((4 * q.g4 + 31) / 32) + 8ull * G +
                            (q.outlier_rowptr.empty() ? 0 : 32ull * (n + 1) + 32ull * q.outlier_col.size());
      EXPECT_EQ(packed_stored_bits(w, "t"), want);
    }
}

TEST(Mixed24Linear, ReferenceEqualsDequantizeThenMatmul) {
  const Mixed24Quantized q = test::random_mixed(40, 200, true, 7);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const PackedWeight w = pack_mixed24(q, storage);
  std::vector<float> bias(40, 0.5f);
  const auto op = make_packed_linear(w, bias.data(), "t");
  Mixed24Quantized qi = q;
  qi.index();
  std::vector<float> deq(40 * 200);
  qi.dequantize(deq.data());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t m : {1, 3}) {
    std::vector<float> x(static_cast<size_t>(m * 200)), y(static_cast<size_t>(m * 40)), yr(y.size()), yd(y.size());
    for (auto& v : x) v = nd(rng);
    op->forward(x.data(), m, y.data());
    op->forward_ref(x.data(), m, yr.data());
    DenseLinear(deq.data(), bias.data(), 40, 200).forward_ref(x.data(), m, yd.data());
    for (size_t i = 0; i < y.size(); ++i) {
      EXPECT_NEAR(y[i], yr[i], kFastVsRefRelTol * (1 + std::fabs(yr[i])));
      EXPECT_NEAR(yd[i], yr[i], 1e-6 * (1 + std::fabs(yr[i])));
    }
  }
}

struct Problem {
  int64_t n = 48, k = 160;
  std::vector<float> w;
  std::vector<double> h;
};
Problem random_problem(uint32_t seed, int64_t k = 160) {
  Problem p;
  p.k = k;
  std::mt19937 rng(seed);
  std::student_t_distribution<float> heavy(4.0f);
  for (int64_t i = 0; i < p.n * p.k; ++i) p.w.push_back(0.02f * heavy(rng));
  // H = 2/N XᵀX of correlated activations with a few large channels.
  const int64_t N = 400;
  std::vector<double> x(static_cast<size_t>(N * p.k));
  std::normal_distribution<double> nd;
  for (int64_t t = 0; t < N; ++t) {
    const double common = nd(rng);
    for (int64_t c = 0; c < p.k; ++c) x[static_cast<size_t>(t * p.k + c)] = nd(rng) * (c % 37 == 0 ? 8.0 : 1.0) + 0.5 * common;
  }
  p.h.assign(static_cast<size_t>(p.k * p.k), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t a = 0; a < p.k; ++a)
      for (int64_t b = 0; b < p.k; ++b)
        p.h[static_cast<size_t>(a * p.k + b)] += 2.0 / N * x[static_cast<size_t>(t * p.k + a)] * x[static_cast<size_t>(t * p.k + b)];
  return p;
}

TEST(Mixed24Quantize, SensitivityAllocationScalesAndOutliers) {
  const Problem p = random_problem(5);
  const GptqFactor f = gptq_factor(p.h, p.k, GptqOptions{});
  const std::vector<double> hinv = hinv_diagonal(f);
  // diag of (H + λI)⁻¹ by a direct solve of one column
  {
    std::vector<double> a(p.h);
    for (int64_t i = 0; i < p.k; ++i) a[static_cast<size_t>(i * p.k + i)] += f.damp;
    // Gauss-Jordan on [A | e_3]
    std::vector<double> e(static_cast<size_t>(p.k), 0.0);
    e[3] = 1.0;
    for (int64_t c = 0; c < p.k; ++c) {
      const double piv = a[static_cast<size_t>(c * p.k + c)];
      for (int64_t j = 0; j < p.k; ++j) a[static_cast<size_t>(c * p.k + j)] /= piv;
      e[static_cast<size_t>(c)] /= piv;
      for (int64_t r = 0; r < p.k; ++r) {
        if (r == c) continue;
        const double fac = a[static_cast<size_t>(r * p.k + c)];
        for (int64_t j = 0; j < p.k; ++j) a[static_cast<size_t>(r * p.k + j)] -= fac * a[static_cast<size_t>(c * p.k + j)];
        e[static_cast<size_t>(r)] -= fac * e[static_cast<size_t>(c)];
      }
    }
    EXPECT_NEAR(hinv[3], e[3], 1e-9 * std::fabs(e[3]));
  }
  const std::vector<double> s = mixed24_group_sensitivity(p.w.data(), p.n, p.k, hinv);
  double s0 = 0;
  for (int64_t r = 0; r < p.n; ++r)
    for (int64_t c = 0; c < 16; ++c) s0 += static_cast<double>(p.w[static_cast<size_t>(r * p.k + c)]) * p.w[static_cast<size_t>(r * p.k + c)] / (hinv[static_cast<size_t>(c)] * hinv[static_cast<size_t>(c)]);
  EXPECT_NEAR(s[0], s0, 1e-9 * s0);   // eq. 9
  const std::vector<uint8_t> bits = allocate_4bit_groups(s, 0.25);
  ASSERT_EQ(bits.size(), 10u);
  double min4 = INFINITY, max2 = 0;
  int fours = 0;
  for (size_t g = 0; g < bits.size(); ++g) {
    if (bits[g] == 4) {
      ++fours;
      min4 = std::min(min4, s[g]);
    } else {
      max2 = std::max(max2, s[g]);
    }
  }
  EXPECT_EQ(fours, 3);   // round(0.25 * 10)
  EXPECT_GE(min4, max2);

  Mixed24Options o;
  o.outlier_fraction = 0.01;
  Mixed24Stats st;
  const Mixed24Quantized q = mixed24_quantize(p.w.data(), p.n, p.k, p.h, f, o, &st);
  EXPECT_EQ(q.group_bits, bits);
  EXPECT_EQ(st.outliers, std::llround(0.01 * p.n * p.k));
  for (uint16_t c : q.outlier_col) EXPECT_EQ(q.group_bits[c / 16], 2) << "outlier in a 4-bit group";
  // Second-order scales: each ŝ is one of 16 levels of its 16-row block and the levels span the block's range.
  for (int64_t j = 0; j < q.g2; ++j)
    for (int64_t rg = 0; rg < q.row_groups(); ++rg) {
      const float step = f16_to_f32(q.ss2[static_cast<size_t>(rg * q.g2 + j)]);
      for (int64_t r = rg * 16; r < std::min(p.n, rg * 16 + 16); ++r) EXPECT_GE(q.scale2(r, j), 0.0f);
      EXPECT_GE(step, 0.0f);
    }
  // With outliers from all groups, some land in 4-bit groups; the 2-bit-only rule is the quantizer's, not the format's.
  Mixed24Options all = o;
  all.outliers_from_all_groups = true;
  const Mixed24Quantized qa = mixed24_quantize(p.w.data(), p.n, p.k, p.h, f, all, nullptr);
  EXPECT_EQ(qa.outlier_col.size(), q.outlier_col.size());
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  EXPECT_NO_THROW(pack_mixed24(qa, storage));
}

TEST(Mixed24Quantize, ErrorFeedbackAndOutliersLowerTheLayerObjective) {
  const Problem p = random_problem(9);
  const GptqFactor f = gptq_factor(p.h, p.k, GptqOptions{});
  auto objective = [&](bool feedback, double outliers) {
    Mixed24Options o;
    o.error_feedback = feedback;
    o.outlier_fraction = outliers;
    Mixed24Stats st;
    mixed24_quantize(p.w.data(), p.n, p.k, p.h, f, o, &st);
    return st.hessian_error;
  };
  const double rtn = objective(false, 0), gptq = objective(true, 0), gptq_out = objective(true, 0.005);
  std::printf("[ mixed24 layer objective ] RTN %.4g  GPTQ %.4g  GPTQ + 0.5%% outliers %.4g\n", rtn, gptq, gptq_out);
  EXPECT_LT(gptq, 0.9 * rtn);
  EXPECT_LT(gptq_out, gptq);
  // All 4 bits: the objective falls further (more bits, same procedure).
  Mixed24Options o4;
  o4.ratio_4bit = 1.0;
  o4.outlier_fraction = 0;
  Mixed24Stats s4;
  mixed24_quantize(p.w.data(), p.n, p.k, p.h, f, o4, &s4);
  EXPECT_LT(s4.hessian_error, gptq);
}

TEST(Mixed24Corrupt, ReadersRefuseBadParts) {
  const Mixed24Quantized q = test::random_mixed(4, 40, true, 11);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const PackedWeight good = pack_mixed24(q, storage);
  auto with_byte = [&](const std::string& part, size_t offset, uint8_t value) {
    return test::with_part_bytes(good, part, offset, {value}, storage);
  };
  const auto expect = test::expect_packed_refused;
  expect(with_byte("group_bits", 0, 3), "(must be 2 or 4)");
  {
    PackedWeight w = good;
    w.params["groups4"] = w.params["groups4"] + 1;
    expect(w, "part qweight has shape");
  }
  Mixed24Quantized flip = q;
  flip.index();
  const size_t last_word = static_cast<size_t>(flip.g2 + 2 * flip.g4) * 4 - 1;   // row 0's last byte: padding (k = 40)
  expect(with_byte("qweight", last_word, 0x80), "non-zero padding codes");
  Mixed24Quantized idx = q;
  idx.index();
  ASSERT_TRUE(idx.g4 > 0 && idx.g2 > 0) << "the fixture should hold both group widths";
  if (idx.g4 > 0 && idx.g4 < 8) expect(with_byte("zero4", 3, 0x80), "part zero4 row 0 has non-zero padding bits");
  if (6 * idx.g2 % 32 != 0) {
    const int64_t w2 = (6 * idx.g2 + 31) / 32;
    expect(with_byte("meta2", static_cast<size_t>(4 * w2 - 1), 0x80), "part meta2 row 0 has non-zero padding bits");
  }
}

// ---- mixed24a: the memory-aligned layout ------------------------------------------------------------------------

// Named budgets of the aligned quantizer on the synthetic problem (k = 192, 12 groups, 3 units).
constexpr double kAlignedVsGenericObjective = 1.25;   // 3-bit scale codes in two slots + two-order 4-bit scales
constexpr double kAlignedFeedbackGain = 0.9;          // GPTQ feedback: objective at most 90% of round-to-nearest

TEST(Mixed24APack, RoundTripIsBitExactAndBitsFollowTheLayout) {
  uint32_t seed = 1;
  for (int64_t n : {1, 5, 17, 33})
    for (int64_t k : {64, 128, 320}) {
      const Mixed24AQuantized q = test::random_mixed24a(n, k, seed % 2 == 0, seed);
      ++seed;
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const PackedWeight w = pack_mixed24a(q, storage);
      const Mixed24AQuantized u = unpack_mixed24a(w, "t");
      EXPECT_EQ(u.perm, q.perm) << n << "x" << k;
      EXPECT_EQ(u.codes, q.codes);
      EXPECT_EQ(u.zero, q.zero);
      EXPECT_EQ(u.scode, q.scode);
      EXPECT_EQ(u.ss, q.ss);
      EXPECT_EQ(u.sm, q.sm);
      EXPECT_EQ(u.outlier_rowptr, q.outlier_rowptr);
      EXPECT_EQ(u.outlier_col, q.outlier_col);
      EXPECT_EQ(u.outlier_val, q.outlier_val);
      // Per (row, unit): 128 + 32 code bits, 16 + 8 metadata bits; per (16 rows, group) 32 bits; 16 per group of
      // perm; CSR. = 3.0 bits per weight + perm + outliers when n is a multiple of 16.
      const int64_t U = k / 64, G = k / 16, RG = (n + 15) / 16;
      const uint64_t want = 184ull * n * U + 32ull * RG * G + 16ull * G +
                            (q.outlier_rowptr.empty() ? 0 : 32ull * (n + 1) + 32ull * q.outlier_col.size());
      EXPECT_EQ(packed_stored_bits(w, "t"), want);
    }
}

TEST(Mixed24ALinear, PackedGemmEqualsDequantizeThenMatmul) {
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{40, 192}, {1, 64}, {17, 576}}) {
    const Mixed24AQuantized q = test::random_mixed24a(n, k, true, static_cast<uint32_t>(n + k));
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const PackedWeight w = pack_mixed24a(q, storage);
    std::vector<float> bias(static_cast<size_t>(n), 0.5f), deq(static_cast<size_t>(n * k));
    const auto op = make_packed_linear(w, bias.data(), "t");
    q.dequantize(deq.data());   // original column order
    // dequantize() puts stored column c of group p at original column 16 perm[p] + c % 16
    EXPECT_EQ(deq[static_cast<size_t>(q.perm[0]) * 16 + 3], q.value(0, 3));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    for (int64_t m : {1, 3}) {
      std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n), NAN), yr(y.size(), NAN), yd(y.size());
      for (auto& v : x) v = nd(rng);
      op->forward(x.data(), m, y.data());
      op->forward_ref(x.data(), m, yr.data());   // mixed24a_gemm_packed_ref: x gathered through perm, CSR added
      DenseLinear(deq.data(), bias.data(), n, k).forward_ref(x.data(), m, yd.data());
      for (size_t i = 0; i < y.size(); ++i) {
        EXPECT_NEAR(yd[i], yr[i], 1e-6 * (1 + std::fabs(yr[i]))) << n << "x" << k << " m " << m << " i " << i;
        EXPECT_NEAR(y[i], yr[i], kFastVsRefRelTol * (1 + std::fabs(yr[i])));
      }
    }
  }
}

TEST(Mixed24AQuantize, PermutationSlotsScalesAndObjective) {
  const Problem p = random_problem(5, 192);
  const GptqFactor f = gptq_factor(p.h, p.k, GptqOptions{});
  const std::vector<double> s = mixed24_group_sensitivity(p.w.data(), p.n, p.k, hinv_diagonal(f));
  Mixed24Options o;
  o.outlier_fraction = 0.01;
  Mixed24Stats st;
  const Mixed24AQuantized q = mixed24a_quantize(p.w.data(), p.n, p.k, p.h, f, o, &st);
  // Slot 3 of each unit holds one of the top-25% groups (the generic allocation), units by decreasing sensitivity,
  // and slot 0 is the most sensitive 2-bit group of its unit.
  const std::vector<uint8_t> bits = allocate_4bit_groups(s, 0.25);
  ASSERT_EQ(q.perm.size(), 12u);
  for (int64_t p4 = 0; p4 < 12; ++p4) EXPECT_EQ(bits[q.perm[static_cast<size_t>(p4)]], mixed24a_code_bits(p4)) << p4;
  for (int64_t u = 0; u + 1 < 3; ++u) EXPECT_GE(s[q.perm[static_cast<size_t>(4 * u + 3)]], s[q.perm[static_cast<size_t>(4 * u + 7)]]);
  for (int64_t u = 0; u < 3; ++u)
    for (int64_t slot : {1, 2}) EXPECT_GE(s[q.perm[static_cast<size_t>(4 * u)]], s[q.perm[static_cast<size_t>(4 * u + slot)]]);
  // Outliers: the requested count, only in 2-bit slots, and the dense code under each is its zero point.
  EXPECT_EQ(st.outliers, std::llround(0.01 * p.n * p.k));
  for (uint16_t c : q.outlier_col) EXPECT_NE((c / 16) % 4, 3) << "outlier in the 4-bit slot";
  // Scale codes fit their fields (3 bits in slots 1, 2); every ŝ is positive.
  for (int64_t r = 0; r < p.n; ++r)
    for (int64_t g = 0; g < 12; ++g) {
      EXPECT_LT(q.scode[static_cast<size_t>(r * 12 + g)], 1 << mixed24a_scale_bits(g));
      EXPECT_GT(q.scale(r, g), 0.0f);
    }
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  EXPECT_NO_THROW(pack_mixed24a(q, storage));
  // The layer objective: within the named budget of the generic layout (4-bit scale codes everywhere, fp16 4-bit
  // scales), and GPTQ's feedback beats round-to-nearest on the same grid.
  Mixed24Options o0 = o;
  o0.outlier_fraction = 0;
  Mixed24Stats generic, aligned, rtn;
  mixed24_quantize(p.w.data(), p.n, p.k, p.h, f, o0, &generic);
  mixed24a_quantize(p.w.data(), p.n, p.k, p.h, f, o0, &aligned);
  o0.error_feedback = false;
  mixed24a_quantize(p.w.data(), p.n, p.k, p.h, f, o0, &rtn);
  std::printf("[ mixed24a layer objective ] generic %.4g  aligned %.4g  aligned RTN %.4g\n", generic.hessian_error,
              aligned.hessian_error, rtn.hessian_error);
  EXPECT_LT(aligned.hessian_error, kAlignedVsGenericObjective * generic.hessian_error);
  EXPECT_LT(aligned.hessian_error, kAlignedFeedbackGain * rtn.hessian_error);
  EXPECT_LT(st.hessian_error, aligned.hessian_error);   // 1% outliers help
  // The aligned layout refuses what it cannot hold.
  Mixed24Options r10 = o;
  r10.ratio_4bit = 0.1;
  EXPECT_FALSE(mixed24_aligned_fits(192, r10));
  EXPECT_FALSE(mixed24_aligned_fits(160, o));
  EXPECT_THROW(mixed24a_quantize(p.w.data(), p.n, p.k, p.h, f, r10, nullptr), Error);
}

TEST(Mixed24ACorrupt, ReadersRefuseBadParts) {
  const Mixed24AQuantized q = test::random_mixed24a(20, 128, true, 11);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const PackedWeight good = pack_mixed24a(q, storage);
  auto with_bytes = [&](const std::string& part, size_t offset, const std::vector<uint8_t>& value) {
    return test::with_part_bytes(good, part, offset, value, storage);
  };
  const auto expect = test::expect_packed_refused;
  expect(with_bytes("perm", 2, {static_cast<uint8_t>(q.perm[0]), 0}), "repeats a group");
  expect(with_bytes("perm", 0, {99, 0}), "repeats a group or is not below G = 8");
  expect(with_bytes("ss4", 2, {0x00, 0x7c}), "part ss4 [1] is not finite");
  ASSERT_FALSE(q.outlier_col.empty());
  {   // the dense code under the first outlier made different from its zero point
    const int64_t r = std::upper_bound(q.outlier_rowptr.begin(), q.outlier_rowptr.end(), 0) - q.outlier_rowptr.begin() - 1;
    const int64_t c = q.outlier_col[0], u = c / 64, s = (c / 16) % 4, i = c % 16;
    const int bits = mixed24a_code_bits(s), zero = q.zero[static_cast<size_t>(r * 8 + c / 16)];
    const int other = (zero + 1) % (1 << bits);
    PackedWeight w = good;
    const std::string part = s < 3 || i < 8 ? "qa" : "qb";
    const size_t word = part == "qa" ? static_cast<size_t>((r * 2 + u) * 4 + s) : static_cast<size_t>(r * 2 + u);
    const int shift = s < 3 ? 2 * static_cast<int>(i) : 4 * static_cast<int>(i % 8);
    uint32_t v = 0;
    std::memcpy(&v, good.parts.at(part).data + 4 * word, 4);
    v = (v & ~(((1u << bits) - 1u) << shift)) | (static_cast<uint32_t>(other) << shift);
    std::vector<uint8_t> bytes(4);
    std::memcpy(bytes.data(), &v, 4);
    expect(with_bytes(part, 4 * word, bytes), "has a dense code other than its group's zero point");
  }
  {
    PackedWeight w = good;
    w.shape[1] = 100;
    expect(w, "part perm has shape");
  }
  EXPECT_THROW(unpack_mixed24(good, "w"), Error);   // a mixed24a weight is not a mixed24 one
}

TEST(Mixed24Model, Stories260KFileBitsMatchTheFileSize) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  const std::string dir = test::temp_dir();
  auto model = Model::load(bin);
  QuantizeOptions o;
  o.method = QuantMethod::Mixed24;
  o.calib.samples = 8;
  o.calib.seqlen = 128;
  const QuantizeReport rep = quantize_to_file(*model, o, dir + "/m.lowbit");
  EXPECT_GT(rep.outliers, 0);
  // Every byte of the file is the header, a dense tensor, or a counted packed part.
  const std::string bytes = test::read_file(dir + "/m.lowbit");
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const auto q = Model::load(dir + "/m.lowbit");
  uint64_t dense = 0, packed_bits = 0;
  for (const auto& [name, t] : q->weights().tensors) dense += t.nbytes;
  for (const auto& [name, w] : q->weights().packed) packed_bits += packed_stored_bits(w, name);
  EXPECT_EQ(8 + header + dense + packed_bits / 8, bytes.size());
  EXPECT_NEAR(rep.avg_bits, static_cast<double>(packed_bits) / static_cast<double>(rep.quantized_weights), 1e-9);
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

TEST(Mixed24Cli, QuantizesAndRefusesMisuse) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  const std::string dir = test::temp_dir();
  std::string out;
  ASSERT_EQ(test::run_cli("quantize " + bin + " --method mixed24 --calib-samples 4 --calib-seqlen 64 -o " + dir + "/m.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("outliers kept"), std::string::npos) << out;
  ASSERT_EQ(test::run_cli("inspect " + dir + "/m.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("mixed24"), std::string::npos) << out;
  EXPECT_NE(out.find("mixed24a"), std::string::npos) << "stories260K's k = 64 linears take the aligned layout\n" << out;
  test::expect_cli_refuses({
      {"quantize " + bin + " --method mixed24 --outliers 0.05 -o " + dir + "/c.lowbit", "--outliers for mixed24 must be in [0, 0.02]"},
      {"quantize " + bin + " --method mixed24 --layers-4bit mlp -o " + dir + "/c.lowbit", "--layers-4bit"},
      {"quantize " + bin + " --method mixed24 --layout aligned --ratio-4bit 0.1 -o " + dir + "/c.lowbit",
       "--layout aligned needs --ratio-4bit 0.25"},
      {"quantize " + bin + " --method mixed24 --layout aligned -o " + dir + "/c.lowbit",
       "--layout aligned: model.layers.0.mlp.down_proj.weight has k = 172"},
      {"ppl " + dir + "/m.lowbit --text " + bin + " --bits 3", "needs an any-precision model"},
  }, dir + "/c.lowbit");
}

}  // namespace
}  // namespace lowbit
