// The int8 forms of the any-precision GEMV's operands (GemvPath::TensorCoreInt8LutStream), shared by the kernels and
// their CPU twin (host + device, the same float operations on both sides, so both produce the same bytes):
//   - a row's 2^b fp16 centroids as int8 with one fp32 scale per row: sigma = max|c| / 127, q = rint(c / sigma); the
//     centroid becomes sigma * q, off by at most sigma / 2 = max|c| / 254 (the one lossy step of this path; the 4-bit
//     tables carry a second piece under sigma = max|c| / 126, i8_table_row2, and are stored in i8_split16's form);
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

// max |c| over a row's E centroids (NaN if any is NaN).
LOWBIT_HD float i8_row_absmax(const float* c, int E) {
  float mx = 0.0f;
  for (int e = 0; e < E; ++e) mx = i8_absmax_step(mx, c[e]);
  return mx;
}

// The int8 table of one row from its E centroids (as floats); returns the row scale sigma (0 for an all-zero row).
LOWBIT_HD float i8_table_row(const float* c, int E, int8_t* q) {
  const float s = i8_row_absmax(c, E) / kI8Max;
  for (int e = 0; e < E; ++e) q[e] = s > 0.0f && s <= 3.0e38f ? static_cast<int8_t>(rintf(c[e] / s)) : int8_t{0};
  return s;
}

// Two int8 pieces per centroid (the 4-bit tables, whose one-piece rounding measured +0.69% perplexity): the row scale
// sigma = max|c| / 126 (one step below i8_table_row's, so that i8_split16 below never needs 128), hi = rint(c / sigma),
// lo = rint((c / sigma - hi) * 254) in -127..126 (a residual that rounds to 127 is written as hi + 1, lo = -127: the
// same value), so c ~ sigma (hi + lo / 254), off by at most sigma / 508 = max|c| / 64008 (below the fp16 rounding of
// every centroid of at least max|c| / 32). Both pieces lie in -127..126.
inline constexpr float kI8Max2 = 126.0f;
LOWBIT_HD float i8_table_row2(const float* c, int E, int8_t* q, int8_t* l) {
  const float s = i8_row_absmax(c, E) / kI8Max2;
  const bool ok = s > 0.0f && s <= 3.0e38f;
  for (int e = 0; e < E; ++e) {
    if (!ok) {
      q[e] = l[e] = 0;
      continue;
    }
    const float v = fminf(fmaxf(c[e] / s, -kI8Max2), kI8Max2), h = rintf(v);
    const int lo = static_cast<int>(rintf((v - h) * kI8LoSteps));
    q[e] = static_cast<int8_t>(lo == 127 ? h + 1.0f : h);
    l[e] = static_cast<int8_t>(lo == 127 ? -127 : lo);
  }
  return s;
}

// A 16-entry int8 table in the form the 4-bit int8 GEMV looks it up with two PRMT and no merge (anyprec_gemv_i8.cu):
// s[0..7] = L, s[8..15] = H, such that for every 4-bit code c (plane 0 its msb)
//   A1(c) = c < 8 ? L[c] : -(L[c - 8] < 0)    (PRMT of L's 8 bytes under selector nibble c: for c >= 8 the nibble's
//                                              msb asks for the selected byte's sign bit replicated: 0 or -1)
//   A2(c) = c >= 8 ? H[c - 8] : -(H[c] < 0)   (the same PRMT of H's bytes under nibble c ^ 8)
// sum to t[c]: the mma adds A1 and A2 (two mma into one sum), so a code costs two PRMT where the two halves and their
// merge took three. Entry i pairs t[i] and t[i + 8]: L[i] = t[i] + h, H[i] = t[i + 8] + l with l = (L[i] < 0), h =
// (H[i] < 0), the first consistent (l, h) of the four (one always is). Needs t in -127..126 (i8_table_row2's range):
// L and H then lie in -127..127.
LOWBIT_HD void i8_split16(const int8_t* t, int8_t* s) {
  for (int i = 0; i < 8; ++i) {
    const int a = t[i], b = t[i + 8];
    int l = 0, h = 0;
    for (int k = 0; k < 4; ++k) {
      l = k & 1, h = k >> 1;
      if (l == (a + h < 0 ? 1 : 0) && h == (b + l < 0 ? 1 : 0)) break;
    }
    s[i] = static_cast<int8_t>(a + h);
    s[i + 8] = static_cast<int8_t>(b + l);
  }
}
// The value t[c] of a table in i8_split16's form (A1(c) + A2(c), as the GEMV's two PRMT and mma add it).
LOWBIT_HD int i8_split16_at(const int8_t* s, int c) {
  const int i = c & 7;
  return c < 8 ? s[i] - (s[i + 8] < 0 ? 1 : 0) : s[i + 8] - (s[i] < 0 ? 1 : 0);
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
