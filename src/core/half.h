// IEEE fp16 and bfloat16 <-> fp32 conversions (exact, round-to-nearest-even on the way down). The fp16 ones also run on
// the GPU (LOWBIT_HD): the quantizers' GPU twins round scales and centroids through the very same code.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace lowbit {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

LOWBIT_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return hd::bits_float(u);
}

LOWBIT_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = hd::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (absu >= 0x477ff000u) return sign | 0x7c00u;           // overflow (incl. rounding up) -> inf
  if (absu < 0x38800000u) {                                 // subnormal or zero in fp16
    if (absu < 0x33000000u) return sign;                    // < half of smallest subnormal -> 0
    const uint32_t e = absu >> 23;
    const uint32_t m = (absu & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;                         // 14 - (e - 127) + 13 - 1 ... see below
    // value = m * 2^(e-150); fp16 subnormal unit = 2^-24 -> q = m * 2^(e-126) = m >> (126-e)
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);   // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | (((r >> 13) - ((127 - 15) << 10)) & 0x7fffu));
}

}  // namespace lowbit
