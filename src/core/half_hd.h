// fp16 <-> fp32 (and the float bit casts they use) for code compiled for both the CPU and the GPU: the quantizers'
// twins (src/quantize/anyprec_row.h, src/backend_cuda/quantize/) round scales and centroids through these on either
// side. The same bits as core/half.h (tests/test_gptq_gpu.cpp and tests/test_anyprec_gpu.cpp check every half and
// millions of floats).
#pragma once
#include <cstdint>
#include <cstring>

#ifndef LOWBIT_HD
#ifdef __CUDACC__
#define LOWBIT_HD __host__ __device__ __forceinline__
#else
#define LOWBIT_HD inline
#endif
#endif

namespace lowbit::hd {

LOWBIT_HD uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

LOWBIT_HD float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

LOWBIT_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {   // subnormal: normalize
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
  return bits_float(u);
}

// Round to nearest even.
LOWBIT_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;
  if (absu >= 0x477ff000u) return sign | 0x7c00u;
  if (absu < 0x38800000u) {
    if (absu < 0x33000000u) return sign;
    const uint32_t e = absu >> 23;
    const uint32_t m = (absu & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);
  return static_cast<uint16_t>(sign | (((r >> 13) - ((127 - 15) << 10)) & 0x7fffu));
}

}  // namespace lowbit::hd
