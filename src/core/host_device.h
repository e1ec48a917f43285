// Scalar helpers for code compiled for both the CPU and the GPU (the quantizers' twins: src/quantize/anyprec_row.h,
// src/backend_cuda/quantize/): the LOWBIT_HD qualifier, float bit casts and single-rounding arithmetic, so that a
// twin performs the same IEEE operations on either side. core/half.h's fp16 conversions are built on them.
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

// Single-rounding arithmetic: on the device the __*_rn intrinsics, which nvcc never contracts into a fused multiply-add;
// on the host plain operators, exact only where the translation unit is compiled with -ffp-contract=off (the
// quantizers, CMakeLists.txt).
LOWBIT_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LOWBIT_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LOWBIT_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LOWBIT_HD double dadd_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
LOWBIT_HD double dsub_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
LOWBIT_HD double dmul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
LOWBIT_HD double ddiv_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace lowbit::hd
