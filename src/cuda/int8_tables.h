// The int8 forms of the any-precision GEMV's operands (GemvPath::TensorCoreInt8LutStream), shared by the kernels and
// their CPU twin (host + device, the same float operations on both sides, so both produce the same bytes):
//   - a row's 2^b fp16 centroids as int8 with one fp32 scale per row: sigma = max|c| / 127, q = rint(c / sigma); the
//     centroid becomes sigma * q, off by at most sigma / 2 = max|c| / 254 (the one lossy step of this path);
//   - an activation as two int8 pieces under one scale per batch column: s = max|x| / 127, v = x / s,
//     hi = rint(v), lo = rint((v - hi) * 254), x ~ s (hi + lo / 254), off by at most s / 508 = max|x| / 64516.
// With both in int8 the GEMV runs on int8 mma.sync (m16n8k32) with exact int32 sums, and one PRMT looks up four
// codes (four bytes) where the fp16 tables need four (the low and high bytes, then two interleaves).
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define LOWBIT_HD __host__ __device__ __forceinline__
#else
#define LOWBIT_HD inline
#endif

namespace lowbit::cuda {

inline constexpr float kI8Max = 127.0f;     // largest int8 magnitude used (symmetric)
inline constexpr float kI8LoSteps = 254.0f; // the low piece: the residual in [-1/2, 1/2] in steps of 1/254

// max |v| that propagates NaN (a NaN or infinite input makes the scale non-finite, so the outputs are too).
LOWBIT_HD float i8_absmax_step(float m, float v) {
  const float a = fabsf(v);
  return (a > m || a != a) ? a : m;
}

// The int8 table of one row from its E centroids (as floats); returns the row scale sigma (0 for an all-zero row).
LOWBIT_HD float i8_table_row(const float* c, int E, int8_t* q) {
  float mx = 0.0f;
  for (int e = 0; e < E; ++e) mx = i8_absmax_step(mx, c[e]);
  const float s = mx / kI8Max;
  for (int e = 0; e < E; ++e) q[e] = s > 0.0f && s <= 3.0e38f ? static_cast<int8_t>(rintf(c[e] / s)) : int8_t{0};
  return s;
}

// Two int8 pieces per centroid (the 4-bit tables, whose one-piece rounding measured +0.69% perplexity): the row scale
// and hi as i8_table_row, lo = rint((c / sigma - hi) * 254), so c ~ sigma (hi + lo / 254), off by at most sigma / 508 =
// max|c| / 64516 (below the fp16 rounding of every centroid of at least max|c| / 32).
LOWBIT_HD float i8_table_row2(const float* c, int E, int8_t* q, int8_t* l) {
  const float s = i8_table_row(c, E, q);
  for (int e = 0; e < E; ++e)
    l[e] = s > 0.0f && s <= 3.0e38f ? static_cast<int8_t>(rintf((fminf(fmaxf(c[e] / s, -kI8Max), kI8Max) - q[e]) * kI8LoSteps))
                                    : int8_t{0};
  return s;
}

// The two int8 pieces of activation x under the column scale s (both 0 when s is 0 or not finite).
LOWBIT_HD void i8_x_pieces(float x, float s, int8_t& hi, int8_t& lo) {
  if (!(s > 0.0f && s <= 3.0e38f)) {
    hi = lo = 0;
    return;
  }
  const float v = fminf(fmaxf(x / s, -kI8Max), kI8Max);
  const float h = rintf(v);
  hi = static_cast<int8_t>(h);
  lo = static_cast<int8_t>(rintf((v - h) * kI8LoSteps));
}

}  // namespace lowbit::cuda
