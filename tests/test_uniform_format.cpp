// The "uniform" packed weight format (formats/uniform/layout.h): the bit layout against hand-packed words, pack /
// unpack round trips bit-exact over bits, odd shapes, group sizes, sym/asym and act-order, the format table's
// stored-bit count, UniformLinear's fast path vs its scalar oracle vs a direct dequantize + naive matmul, and
// every corruption of the parts refused with a message naming the weight and the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/half.h"
#include "formats/format_table.h"
#include "formats/uniform/layout.h"
#include "test_util.h"
#include "packed_fixtures.h"

using lowbit::test::random_quantized;

namespace lowbit {
namespace {

using test::expect_error;
using Storage = std::vector<std::shared_ptr<std::vector<uint8_t>>>;

// UniformLinear::forward (fp32 BLAS accumulation) vs forward_ref (double) on the same decoded weights: the
// difference is accumulation rounding only, bounded relative to sum_c |x_c * w_c| (+ |bias|). Measured: at most
// 1.1e-7 (one fp32 ulp) over the cases below; one fp16 ulp of a scale decoded wrongly would be ~1e-3.
constexpr double kFp32AccumBudget = 1e-6;


void expect_same(const UniformQuantized& a, const UniformQuantized& b) {
  EXPECT_EQ(a.bits, b.bits);
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.group_size, b.group_size);
  EXPECT_EQ(a.symmetric, b.symmetric);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.zeros, b.zeros);
  EXPECT_EQ(a.g_idx, b.g_idx);
}

uint32_t word(const PackedWeight& w, int64_t i) {
  uint32_t v;
  std::memcpy(&v, w.parts.at("qweight").data + 4 * i, 4);
  return v;
}

// A part replaced by a copy of its bytes with `edit` applied (the copy lives in `storage`).
template <typename T, typename Edit>
void edit_part(PackedWeight& w, const std::string& part, Storage& storage, Edit edit) {
  TensorView& v = w.parts.at(part);
  auto buf = std::make_shared<std::vector<uint8_t>>(v.data, v.data + v.nbytes);
  storage.push_back(buf);
  edit(reinterpret_cast<T*>(buf->data()));
  v.data = buf->data();
}

// ---------------------------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------------------------

// Codes are a little-endian bit stream per row, code c at bits [c*bits, (c+1)*bits); rows start on a new word.
TEST(UniformLayout, MatchesHandPackedWords) {
  UniformQuantized q = random_quantized(2, 11, 3, 11, true, false, 1);
  for (int c = 0; c < 11; ++c) q.codes[c] = static_cast<uint8_t>(c % 8);
  q.codes[10] = 7;                                      // straddles: bits 30..31 of word 0, bit 0 of word 1
  for (int c = 0; c < 11; ++c) q.codes[11 + c] = 0;     // row 1 all zero: its words follow row 0's
  q.codes[11] = 5;
  Storage storage;
  const PackedWeight w = pack_uniform(q, storage);
  ASSERT_EQ(w.parts.at("qweight").shape, (std::vector<int64_t>{2, 2}));  // 33 bits -> 2 words per row
  EXPECT_EQ(word(w, 0), 0xc8fac688u);  // 0,1,2,...,7,0,1 then 0b11 of the 7
  EXPECT_EQ(word(w, 1), 0x1u);          // the 7's top bit; the rest is zero padding
  EXPECT_EQ(word(w, 2), 0x5u);
  EXPECT_EQ(word(w, 3), 0x0u);

  // bits 4: eight codes per word, nibble c % 8 of word c / 8.
  UniformQuantized q4 = random_quantized(1, 9, 4, 9, false, false, 2);
  for (int c = 0; c < 9; ++c) q4.codes[c] = static_cast<uint8_t>((5 * c + 1) % 16);
  const PackedWeight w4 = pack_uniform(q4, storage);
  EXPECT_EQ(word(w4, 0), 0x4fa50b61u);
  EXPECT_EQ(word(w4, 1), 0x9u);
}

TEST(UniformLayout, EncodedValueIsCodeMinusZeroTimesScale) {
  UniformQuantized q = random_quantized(1, 4, 4, 2, false, false, 3);
  q.codes = {0, 15, 7, 9};
  q.zeros = {8, 3};
  q.scales = {f32_to_f16(0.5f), f32_to_f16(-0.25f)};
  EXPECT_EQ(q.dequant(0, 0), -4.0f);
  EXPECT_EQ(q.dequant(0, 1), 3.5f);
  EXPECT_EQ(q.dequant(0, 2), -1.0f);
  EXPECT_EQ(q.dequant(0, 3), -1.5f);
  q.symmetric = true;  // zero point 2^(bits-1) = 8
  q.zeros.clear();
  EXPECT_EQ(q.dequant(0, 1), 3.5f);
  EXPECT_EQ(q.dequant(0, 3), -0.25f);
  q.g_idx = {1, 1, 0, 0};  // act-order: column 0 uses group 1's scale
  EXPECT_EQ(q.dequant(0, 0), 2.0f);
}

// ---------------------------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------------------------

TEST(UniformPack, RoundTripIsBitExact) {
  int cases = 0;
  uint32_t seed = 10;
  for (int bits = 2; bits <= 8; ++bits) {
    for (int64_t k : {1, 7, 37, 576, 1000}) {
      for (int64_t n : {1, 3, 64}) {
        // per-channel, the usual 32/128, and 3 (which divides none of 7, 37, 1000: a short last group)
        for (int64_t g : {k, int64_t{32}, int64_t{128}, int64_t{3}}) {
          if (g > k) continue;
          for (bool symmetric : {false, true}) {
            for (bool act_order : {false, true}) {
              SCOPED_TRACE(testing::Message() << "bits " << bits << " n " << n << " k " << k << " g " << g
                                              << (symmetric ? " sym" : " asym") << (act_order ? " act-order" : ""));
              const UniformQuantized q = random_quantized(n, k, bits, g, symmetric, act_order, ++seed);
              Storage storage;
              const PackedWeight w = pack_uniform(q, storage);
              EXPECT_EQ(w.format, FormatId::Uniform);
              EXPECT_EQ(w.shape, (std::vector<int64_t>{n, k}));
              EXPECT_EQ(w.parts.at("qweight").shape, (std::vector<int64_t>{n, (k * bits + 31) / 32}));
              EXPECT_EQ(w.parts.count("zeros"), symmetric ? 0u : 1u);
              EXPECT_EQ(w.parts.count("g_idx"), act_order ? 1u : 0u);
              expect_same(unpack_uniform(w, "w"), q);
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 7 * 4 * (1 + 2 + 3 + 4 + 4) * 3);  // bits x sym/act x valid (k, g) pairs x n
}

// The format table's exact stored bits: every part at its dtype width, padding words and g_idx included.
TEST(UniformPack, StoredBitsCountEveryPart) {
  Storage storage;
  // n=4, k=64, bits=4, g=32, asym: 4*64*4 code bits + 4*2*16 scale bits + 4*2*8 zero bits = 1216 (4.75 / weight).
  const PackedWeight w = pack_uniform(random_quantized(4, 64, 4, 32, false, false, 4), storage);
  EXPECT_EQ(packed_stored_bits(w, "w"), 1216u);
  // symmetric: no zeros; act-order adds 64 int32 group indices.
  EXPECT_EQ(packed_stored_bits(pack_uniform(random_quantized(4, 64, 4, 32, true, false, 5), storage), "w"), 1152u);
  EXPECT_EQ(packed_stored_bits(pack_uniform(random_quantized(4, 64, 4, 32, true, true, 6), storage), "w"),
            1152u + 64u * 32u);
  // bits 3, k 37: 111 code bits per row padded to 4 words = 128 bits; 2 groups (32 + 5 columns).
  EXPECT_EQ(packed_stored_bits(pack_uniform(random_quantized(3, 37, 3, 32, false, false, 7), storage), "w"),
            3u * 128u + 3u * 2u * 16u + 3u * 2u * 8u);
}

// ---------------------------------------------------------------------------------------------------------------
// UniformLinear
// ---------------------------------------------------------------------------------------------------------------

struct LinearCase {
  int64_t n, k, group_size, m;
  int bits;
  bool symmetric, act_order, bias;
};

TEST(UniformLinear, FastPathAndOracleGiveTheEncodedWeights) {
  const LinearCase cases[] = {
      {3, 37, 32, 1, 3, false, false, false},   {64, 576, 128, 1, 4, false, true, true},
      {64, 576, 128, 5, 4, true, false, true},  {3, 1000, 1000, 2, 2, false, false, false},
      {1, 7, 3, 3, 8, true, true, true},        {17, 129, 64, 9, 5, false, false, true},
  };
  uint32_t seed = 100;
  for (const LinearCase& lc : cases) {
    SCOPED_TRACE(testing::Message() << "n " << lc.n << " k " << lc.k << " g " << lc.group_size << " m " << lc.m
                                    << " bits " << lc.bits);
    const UniformQuantized q =
        random_quantized(lc.n, lc.k, lc.bits, lc.group_size, lc.symmetric, lc.act_order, ++seed);
    Storage storage;
    const PackedWeight w = pack_uniform(q, storage);
    std::mt19937 rng(++seed);
    std::normal_distribution<float> normal;
    std::vector<float> x(static_cast<size_t>(lc.m * lc.k)), bias(static_cast<size_t>(lc.n));
    for (float& v : x) v = normal(rng);
    for (float& v : bias) v = normal(rng);
    const float* b = lc.bias ? bias.data() : nullptr;
    const std::unique_ptr<LinearOp> op = make_packed_linear(w, b, "w");
    ASSERT_EQ(op->n(), lc.n);
    ASSERT_EQ(op->k(), lc.k);

    std::vector<float> y(static_cast<size_t>(lc.m * lc.n)), y_ref(y.size());
    op->forward(x.data(), lc.m, y.data());
    op->forward_ref(x.data(), lc.m, y_ref.data());

    // The oracle's oracle: dequantize, then the plain double-accumulating matmul, in the same order.
    std::vector<float> wf(static_cast<size_t>(lc.n * lc.k));
    q.dequantize(wf.data());
    for (int64_t i = 0; i < lc.m; ++i) {
      for (int64_t r = 0; r < lc.n; ++r) {
        double acc = b ? b[r] : 0.0, magnitude = b ? std::abs(b[r]) : 0.0;
        for (int64_t c = 0; c < lc.k; ++c) {
          acc += static_cast<double>(x[i * lc.k + c]) * wf[r * lc.k + c];
          magnitude += std::abs(static_cast<double>(x[i * lc.k + c]) * wf[r * lc.k + c]);
        }
        const size_t o = static_cast<size_t>(i * lc.n + r);
        EXPECT_EQ(y_ref[o], static_cast<float>(acc)) << "row " << i << " output " << r;
        EXPECT_LE(std::abs(y[o] - acc), kFp32AccumBudget * magnitude) << "row " << i << " output " << r;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Errors: each corruption refused, naming the weight and the problem
// ---------------------------------------------------------------------------------------------------------------

class UniformCorrupt : public testing::Test {
 protected:
  static constexpr char kWhere[] = "model.lowbit: tensor model.layers.0.mlp.up_proj.weight";
  // asym + act-order, bits 4, n 3, k 37, groups of 16 -> G = 3; 148 code bits = 5 words per row.
  UniformCorrupt() : good_(pack_uniform(random_quantized(3, 37, 4, 16, false, true, 9), storage_)) {}

  void expect_refused(const PackedWeight& w, const std::string& phrase) {
    expect_error([&](const std::string& where) { unpack_uniform(w, where); }, kWhere, phrase);
    expect_error([&](const std::string& where) { make_packed_linear(w, nullptr, where); }, kWhere, phrase);
    expect_error([&](const std::string& where) { validate_packed(w, where); }, kWhere, phrase);
  }

  Storage storage_;
  PackedWeight good_;
};

TEST_F(UniformCorrupt, GoodWeightPasses) { EXPECT_NO_THROW(validate_packed(good_, kWhere)); }

TEST_F(UniformCorrupt, WrongPartDType) {
  PackedWeight w = good_;
  w.parts["scales"].dtype = DType::BF16;
  expect_refused(w, "part scales has dtype BF16, format uniform needs F16");
  w = good_;
  w.parts["zeros"].dtype = DType::I8;
  expect_refused(w, "part zeros has dtype I8, format uniform needs U8");
}

TEST_F(UniformCorrupt, WrongPartShape) {
  PackedWeight w = good_;
  w.parts["qweight"].shape = {3, 6};
  expect_refused(w, "part qweight has shape [3, 6], format uniform needs [n, ceil(k*bits/32)] = [3, 5]");
  w = good_;
  w.parts["g_idx"].shape = {36};
  expect_refused(w, "part g_idx has shape [36], format uniform needs [k] = [37]");
  w = good_;
  w.parts["scales"].nbytes -= 2;  // a view that lies about its size
  expect_refused(w, "part scales holds 16 bytes, its shape needs 18");
}

TEST_F(UniformCorrupt, MissingOrExtraPart) {
  PackedWeight w = good_;
  w.parts.erase("zeros");
  expect_refused(w, "missing part zeros (U8 [n, G])");
  w = good_;
  w.params["symmetric"] = 1;  // says symmetric, still carries zeros
  expect_refused(w, "part zeros must be absent when symmetric = 1");
  w = good_;
  w.parts["bias"] = w.parts["scales"];
  expect_refused(w, "unknown part 'bias' for format uniform");
}

TEST_F(UniformCorrupt, ZeroPointTooWide) {
  PackedWeight w = good_;
  edit_part<uint8_t>(w, "zeros", storage_, [](uint8_t* z) { z[4] = 16; });
  expect_refused(w, "part zeros [1, 1] = 16 is not below 2^bits = 16");
}

TEST_F(UniformCorrupt, GroupIndexOutOfRange) {
  PackedWeight w = good_;
  edit_part<int32_t>(w, "g_idx", storage_, [](int32_t* g) { g[36] = 3; });
  expect_refused(w, "part g_idx [36] = 3 is outside [0, 3)");
  edit_part<int32_t>(w, "g_idx", storage_, [](int32_t* g) { g[36] = -1; });
  expect_refused(w, "part g_idx [36] = -1 is outside [0, 3)");
}

TEST_F(UniformCorrupt, ParamsOutOfRange) {
  PackedWeight w = good_;
  w.params["bits"] = 9;
  expect_refused(w, "parameter bits = 9 is out of range [2, 8]");
  w.params["bits"] = 1;
  expect_refused(w, "parameter bits = 1 is out of range [2, 8]");
  w = good_;
  w.params["group_size"] = 38;
  expect_refused(w, "parameter group_size = 38 is out of range [1, 37] (k)");
  w = good_;
  w.params["act_order"] = 2;
  expect_refused(w, "parameter act_order = 2 is out of range [0, 1]");
  w = good_;
  w.params.erase("symmetric");
  expect_refused(w, "has no parameter 'symmetric'");
  w = good_;
  w.params["zero_point"] = 1;
  expect_refused(w, "unknown parameter 'zero_point' for format uniform");
  w = good_;
  w.shape = {3, 37, 1};
  expect_refused(w, "needs a logical shape [n, k]");
}

TEST_F(UniformCorrupt, PaddingBitsAndScales) {
  PackedWeight w = good_;
  edit_part<uint32_t>(w, "qweight", storage_, [](uint32_t* q) { q[9] |= 1u << 31; });  // row 1's last word
  expect_refused(w, "part qweight row 1 has non-zero padding bits");
  w = good_;
  edit_part<uint16_t>(w, "scales", storage_, [](uint16_t* s) { s[2] = 0x7c00; });  // +inf
  expect_refused(w, "part scales [0, 2] is not finite");
}

TEST_F(UniformCorrupt, UnknownFormatFailsLoudly) {
  PackedWeight w = good_;
  w.format = static_cast<FormatId>(kFormatCount);   // an id outside the enum: a bad cast or corrupt memory
  EXPECT_THROW(make_packed_linear(w, nullptr, kWhere), Error);
  EXPECT_THROW(validate_packed(w, kWhere), Error);
  expect_error([&](const std::string& where) { packed_format_named("uniform4", where); }, kWhere,
               "unknown packed weight format 'uniform4' (known: uniform, anyprec, mixed24, mixed24a, quik)");
  w.format = FormatId::AnyPrec;
  expect_error([&](const std::string& where) { unpack_uniform(w, where); }, kWhere,
               "unpack_uniform given a weight of format 'anyprec'");
}

TEST(UniformPackErrors, RefusesWhatItCannotEncode) {
  Storage storage;
  UniformQuantized q = random_quantized(2, 8, 3, 4, false, false, 11);
  q.codes[5] = 8;
  expect_error([&](const std::string&) { pack_uniform(q, storage); }, "pack_uniform",
               "code 8 at index 5 needs more than 3 bits");
  q = random_quantized(2, 8, 3, 4, false, false, 11);
  q.zeros[1] = 8;
  expect_error([&](const std::string&) { pack_uniform(q, storage); }, "pack_uniform", "part zeros [0, 1] = 8");
  q = random_quantized(2, 8, 3, 4, false, false, 11);
  q.scales.pop_back();
  expect_error([&](const std::string&) { pack_uniform(q, storage); }, "pack_uniform", "3 scales, need n * G = 4");
  q = random_quantized(2, 8, 3, 4, false, false, 11);
  q.bits = 9;
  expect_error([&](const std::string&) { pack_uniform(q, storage); }, "pack_uniform", "bits 9 out of range [2, 8]");
}

// The table describes what the docs and the reader rely on.
TEST(FormatTable, DeclaresUniform) {
  const PackedFormat* f = &packed_format(FormatId::Uniform);
  EXPECT_EQ(f->name, "uniform");
  EXPECT_EQ(parse_format_name("uniform"), FormatId::Uniform);
  EXPECT_EQ(parse_format_name("nope"), std::nullopt);
  std::vector<std::string> params, parts;
  for (const PackedParam& p : f->params) params.emplace_back(p.name);
  for (const PackedPart& p : f->parts) parts.emplace_back(p.name);
  EXPECT_EQ(params, (std::vector<std::string>{"bits", "group_size", "symmetric", "act_order"}));
  EXPECT_EQ(parts, (std::vector<std::string>{"qweight", "scales", "zeros", "g_idx"}));
}

}  // namespace
}  // namespace lowbit
