// Random uniform-format weights for the format and container tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>

#include "core/half.h"
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

}  // namespace lowbit::test
