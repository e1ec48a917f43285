// Random packed weights (uniform, anyprec, mixed24, mixed24a, quik) for the format, container and fuzz tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <numeric>
#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "formats/anyprec/layout.h"
#include "formats/mixed24/layout.h"
#include "formats/mixed24a/layout.h"
#include "formats/quik/layout.h"
#include "formats/uniform/layout.h"

namespace lowbit::test {

// A random quantized weight: codes, zeros and group indices uniform over their ranges, scales fp16 in
// [2^-10, 2^-3) with random sign.
inline UniformQuantized random_quantized(int64_t n, int64_t k, int bits, int64_t group_size, bool symmetric,
                                  bool act_order, uint32_t seed) {
  std::mt19937 rng(seed);
  UniformQuantized q;
  q.bits = bits;
  q.n = n;
  q.k = k;
  q.group_size = group_size;
  q.symmetric = symmetric;
  const int64_t groups = q.groups();
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
  std::uniform_real_distribution<float> mag(-10.0f, -3.0f);
  for (int64_t i = 0; i < n * k; ++i) q.codes.push_back(static_cast<uint8_t>(code(rng)));
  for (int64_t i = 0; i < n * groups; ++i) {
    const float s = std::exp2(mag(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    q.scales.push_back(f32_to_f16(s));
  }
  if (!symmetric)
    for (int64_t i = 0; i < n * groups; ++i) q.zeros.push_back(static_cast<uint8_t>(code(rng)));
  if (act_order) {
    std::uniform_int_distribution<int> group(0, static_cast<int>(groups) - 1);
    for (int64_t c = 0; c < k; ++c) q.g_idx.push_back(group(rng));
  }
  return q;
}

// Random parent codes of `planes` bits and fp16 LUTs (multiples of 2^-14 in [-2^-4, 2^-4]) for the served widths.
inline AnyPrecQuantized random_codes(int64_t n, int64_t k, int planes, uint32_t widths, uint32_t seed) {
  std::mt19937 rng(seed);
  AnyPrecQuantized q;
  q.n = n;
  q.k = k;
  q.planes = planes;
  q.widths = widths;
  for (int64_t i = 0; i < n * k; ++i) q.codes.push_back(static_cast<uint8_t>(rng() & ((1u << planes) - 1)));
  for (int b : q.served_widths()) {
    auto& lut = q.luts[b];
    for (int64_t i = 0; i < (n << b); ++i) lut.push_back(f32_to_f16(std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, -14)));
  }
  return q;
}

// A random any-precision weight (random_codes: an 8-bit parent serving 2..8, or as given) with about 1.5% outliers
// when asked, each a fp16 value in [-2^-2, 2^-2] at 2^-12 steps.
inline AnyPrecQuantized random_anyprec(int64_t n, int64_t k, bool outliers, uint32_t seed, int planes = 8,
                                       uint32_t widths = 0x1FCu) {
  AnyPrecQuantized q = random_codes(n, k, planes, widths, seed);
  if (outliers) {
    std::mt19937 rng(seed + 1);
    q.outlier_rowptr.push_back(0);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c)
        if (rng() % 64 == 0) {
          q.outlier_col.push_back(static_cast<int32_t>(c));
          q.outlier_val.push_back(f32_to_f16(std::ldexp(static_cast<float>(rng() % 2001) - 1000.0f, -12)));
        }
      q.outlier_rowptr.push_back(static_cast<int32_t>(q.outlier_col.size()));
    }
  }
  return q;
}

// Activations x [m, k], standard normal.
inline std::vector<float> random_x(int64_t m, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = nd(rng);
  return x;
}

// Random group widths (1 in 4 at 4 bits), codes, scales, zeros and (optionally) ~2% outliers.
inline Mixed24Quantized random_mixed(int64_t n, int64_t k, bool outliers, uint32_t seed) {
  std::mt19937 rng(seed);
  Mixed24Quantized q;
  q.n = n;
  q.k = k;
  for (int64_t g = 0; g < q.groups(); ++g) q.group_bits.push_back(rng() % 4 == 0 ? 4 : 2);
  q.index();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) q.codes.push_back(static_cast<uint8_t>(rng() % (1u << q.group_bits[static_cast<size_t>(c / 16)])));
  auto half = [&] { return f32_to_f16(std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, -8 - static_cast<int>(rng() % 4))); };
  for (int64_t i = 0; i < n * q.g2; ++i) {
    q.zero2.push_back(static_cast<uint8_t>(rng() % 4));
    q.scode2.push_back(static_cast<uint8_t>(rng() % 16));
  }
  for (int64_t i = 0; i < q.row_groups() * q.g2; ++i) {
    q.ss2.push_back(half());
    q.sm2.push_back(half());
  }
  for (int64_t i = 0; i < n * q.g4; ++i) {
    q.scale4.push_back(half());
    q.zero4.push_back(static_cast<uint8_t>(rng() % 16));
  }
  if (outliers) {
    q.outlier_rowptr.push_back(0);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c)
        if (rng() % 50 == 0) {
          q.outlier_col.push_back(static_cast<uint16_t>(c));
          q.outlier_val.push_back(half());
        }
      q.outlier_rowptr.push_back(static_cast<int32_t>(q.outlier_col.size()));
    }
  }
  return q;
}

}  // namespace lowbit::test

namespace lowbit::test {

// A random mixed24a weight (k a multiple of 64): a random group permutation, codes and fields within their widths,
// and (optionally) about 2% outliers, each over a dense code equal to its group's zero point.
inline Mixed24AQuantized random_mixed24a(int64_t n, int64_t k, bool outliers, uint32_t seed) {
  std::mt19937 rng(seed);
  Mixed24AQuantized q;
  q.n = n;
  q.k = k;
  const int64_t G = q.groups();
  for (int64_t g = 0; g < G; ++g) q.perm.push_back(static_cast<uint16_t>(g));
  std::shuffle(q.perm.begin(), q.perm.end(), rng);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t p = 0; p < G; ++p) {
      q.zero.push_back(static_cast<uint8_t>(rng() % (1u << mixed24a_code_bits(p))));
      q.scode.push_back(static_cast<uint8_t>(rng() % (1u << mixed24a_scale_bits(p))));
    }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) q.codes.push_back(static_cast<uint8_t>(rng() % (1u << mixed24a_code_bits(c / 16))));
  auto half = [&] { return f32_to_f16(std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, -8 - static_cast<int>(rng() % 4))); };
  for (int64_t i = 0; i < q.row_groups() * G; ++i) {
    q.ss.push_back(half());
    q.sm.push_back(half());
  }
  if (outliers) {
    q.outlier_rowptr.push_back(0);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c)
        if (rng() % 50 == 0) {
          q.outlier_col.push_back(static_cast<uint16_t>(c));
          q.outlier_val.push_back(half());
          q.codes[static_cast<size_t>(r * k + c)] = q.zero[static_cast<size_t>(r * G + c / 16)];
        }
      q.outlier_rowptr.push_back(static_cast<int32_t>(q.outlier_col.size()));
    }
  }
  return q;
}

}  // namespace lowbit::test

namespace lowbit::test {

// A random quik weight: codes uniform over the signed range, fp16 scales near 2^-9, `outliers` random columns with
// fp16 weights, wReduced by its definition.
inline QuikQuantized random_quik(int64_t n, int64_t k, int wbits, int abits, bool fp8, int64_t outliers, uint32_t seed) {
  std::mt19937 rng(seed);
  QuikQuantized q;
  q.n = n;
  q.k = k;
  q.wbits = wbits;
  q.abits = abits;
  q.act_fp8 = fp8;
  std::vector<double> score(static_cast<size_t>(k));
  for (double& s : score) s = static_cast<double>(rng() % 100000);
  std::vector<int32_t> order(static_cast<size_t>(k));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)]; });
  order.resize(static_cast<size_t>(std::min(outliers, k)));
  std::sort(order.begin(), order.end());
  q.outlier_idx = order;
  const int64_t kb = q.base(), lo = -(1 << (wbits - 1)), span = 1 << wbits;
  for (int64_t i = 0; i < n * kb; ++i) q.wq.push_back(static_cast<int8_t>(lo + static_cast<int64_t>(rng() % span)));
  for (int64_t r = 0; r < n; ++r) {
    q.scale.push_back(f32_to_f16(std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, -9)));
    q.wreduced.push_back(quik_wreduced(q.scale.back(), q.wq.data() + r * kb, kb));
  }
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < n * q.outliers(); ++i) q.outlier_w.push_back(f32_to_f16(0.05f * nd(rng)));
  return q;
}

}  // namespace lowbit::test

namespace lowbit::test {

// A copy of `good` whose part `part` has `bytes` written at `offset` (the new buffer is kept alive in storage).
inline PackedWeight with_part_bytes(const PackedWeight& good, const std::string& part, size_t offset,
                                    const std::vector<uint8_t>& bytes, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage) {
  PackedWeight w = good;
  const TensorView& v = good.parts.at(part);
  auto buf = std::make_shared<std::vector<uint8_t>>(v.data, v.data + v.nbytes);
  std::copy(bytes.begin(), bytes.end(), buf->begin() + static_cast<std::ptrdiff_t>(offset));
  storage.push_back(buf);
  w.parts[part].data = buf->data();
  return w;
}

// validate_packed refuses w with an error containing phrase.
inline void expect_packed_refused(const PackedWeight& w, const std::string& phrase) {
  try {
    validate_packed(w, "w");
    ADD_FAILURE() << "accepted; expected " << phrase;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
}

}  // namespace lowbit::test
