// The arithmetic the GPU quantizers (gptq_gpu.cu) share with their CPU twins (quantize/rtn.cpp, gptq.cpp, quik.cpp),
// written once for host and device so that both sides perform the same IEEE operations in the same order:
//   - every float +, -, * is rounded on its own, as the C++ source of the twins reads (the device side uses the
//     __f*_rn intrinsics, which nvcc never contracts into an FMA). The CPU twins are the same in a portable build,
//     where GCC has no FMA to contract into; with -march=native GCC fuses two of their expressions: GPTQ's in-block
//     update w -= e·u (one rounding less per update) and QUIK's clipping shrink 1 - 0.01·step (8 of its 51 values
//     move by one ulp). RTN has no such expression;
//   - std::min/std::max/std::clamp are spelled as the ternaries libstdc++ uses (they decide which of +0/-0 survives);
//   - a float -> int conversion of an out-of-range value gives INT_MIN as x86's cvttss2si does.
// Where the twins are insensitive to this (products of a small integer and an fp16 scale are exact in fp32), the
// comments say so.
// The warp-level helpers at the end (device only) spread GPTQ's MSE-clipping grid search over the lanes: one lane per
// shrink candidate, each summing its error sequentially over the group exactly as the CPU does, then the first
// minimum over the candidates (the CPU keeps a candidate only when it is strictly better).
// The header compiles as plain C++ too (no CUDA): tests/test_gptq_gpu.cpp runs the scalar parts on the CPU against
// the CPU quantizers.
#pragma once
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "core/host_device.h"


namespace lowbit::cuda::gptq_twin {

using hd::bits_float;
using ::lowbit::f16_to_f32;
using ::lowbit::f32_to_f16;
using hd::float_bits;

using hd::add_rn;
using hd::dadd_rn;
using hd::dmul_rn;
using hd::mul_rn;
using hd::sub_rn;

LOWBIT_HD float round_even(float x) {   // std::nearbyint in the default rounding mode
#ifdef __CUDA_ARCH__
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

// static_cast<int>(float) as x86 computes it: out-of-range values and NaN give INT_MIN.
LOWBIT_HD int float_to_int_x86(float v) {
  return (v >= -2147483648.0f && v < 2147483648.0f) ? static_cast<int>(v) : INT_MIN;
}

// std::min(a, b) / std::max(a, b) of libstdc++ (the first argument wins ties, so +0/-0 follow the CPU).
LOWBIT_HD float std_min(float a, float b) { return (b < a) ? b : a; }
LOWBIT_HD float std_max(float a, float b) { return (a < b) ? b : a; }

// The UniformSpec fields the device needs.
struct UniformSpecTwin {
  int bits = 4;
  bool symmetric = false;
  bool mse_clip = false;
  float max_shrink = 0.8f;
  int grid = 100;
};

// GroupParams of quantize/rtn.h (scale is always f16_to_f32(scale_f16)).
struct UniformParams {
  float scale;
  uint16_t scale_f16;
  int zero;
};

// rtn.cpp's params_for_range.
LOWBIT_HD UniformParams uniform_params_for_range(float xmin, float xmax, const UniformSpecTwin& s) {
  const int maxq = (1 << s.bits) - 1;
  UniformParams p;
  if (s.symmetric) {
    const float m = std_max(fabsf(xmin), xmax);
    xmin = -m;
    xmax = m;
  }
  if (xmin == 0.0f && xmax == 0.0f) {
    xmin = -1.0f;
    xmax = 1.0f;
  }
  const float scale = std_max(sub_rn(xmax, xmin) / static_cast<float>(maxq), 6.0e-8f);
  p.scale_f16 = f32_to_f16(scale);
  p.scale = f16_to_f32(p.scale_f16);
  if (p.scale == 0.0f) {
    p.scale_f16 = 1;
    p.scale = f16_to_f32(1);
  }
  if ((float_bits(p.scale) & 0x7fffffffu) == 0x7f800000u) {
    p.scale_f16 = 0x7bff;
    p.scale = 65504.0f;
  }
  int zero = s.symmetric ? (maxq + 1) / 2 : float_to_int_x86(round_even(-xmin / p.scale));
  zero = zero < 0 ? 0 : zero;
  p.zero = maxq < zero ? maxq : zero;
  return p;
}

// rtn.h's quantize_code.
LOWBIT_HD int uniform_code(float x, const UniformParams& p, int maxq) {
  const float q = add_rn(round_even(x / p.scale), static_cast<float>(p.zero));
  return q < 0 ? 0 : (q > static_cast<float>(maxq) ? maxq : float_to_int_x86(q));
}

// (code - zero) as the float both dequant_code and UniformQuantized::dequant multiply by the scale (exact).
LOWBIT_HD float uniform_offset(int code, const UniformParams& p) {
  return sub_rn(static_cast<float>(code), static_cast<float>(p.zero));
}

// The shrink factor of candidate c of the MSE grid (c = 0: the full range).
LOWBIT_HD float clip_shrink(int c, int grid) { return sub_rn(1.0f, static_cast<float>(c) / static_cast<float>(grid)); }

LOWBIT_HD int clip_steps(const UniformSpecTwin& s) {
  return static_cast<int>(mul_rn(s.max_shrink, static_cast<float>(s.grid)));
}

LOWBIT_HD UniformParams clip_candidate(float xmin, float xmax, int c, const UniformSpecTwin& s) {
  const float shrink = clip_shrink(c, s.grid);
  return uniform_params_for_range(mul_rn(shrink, xmin), mul_rn(shrink, xmax), s);
}

// One term of find_group_params' error: |x̂ - x|^2.4 (x̂ = (q - z)·s is exact, so the CPU's FMA contraction of
// x̂ - x, when it happens, gives the same value).
LOWBIT_HD double clip_error_term(float v, const UniformParams& p, int maxq) {
  const float deq = mul_rn(uniform_offset(uniform_code(v, p, maxq), p), p.scale);
  return pow(static_cast<double>(fabsf(sub_rn(deq, v))), 2.4);
}

// The error of one candidate over the group, summed in the CPU's order. load(i) gives x[i], i < count.
template <typename Load>
LOWBIT_HD double clip_error(Load load, int64_t count, const UniformParams& p, int maxq) {
  double e = 0;
  for (int64_t i = 0; i < count; ++i) e = dadd_rn(e, clip_error_term(load(i), p, maxq));
  return e;
}

// find_group_params, one thread: the form the CPU test checks against rtn.cpp.
template <typename Load>
LOWBIT_HD UniformParams group_params_sequential(Load load, int64_t count, const UniformSpecTwin& s) {
  float xmin = 0.0f, xmax = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float v = load(i);
    xmin = std_min(xmin, v);
    xmax = std_max(xmax, v);
  }
  UniformParams best = uniform_params_for_range(xmin, xmax, s);
  if (!s.mse_clip) return best;
  const int maxq = (1 << s.bits) - 1;
  double best_err = clip_error(load, count, best, maxq);
  const int steps = clip_steps(s);
  for (int c = 1; c <= steps; ++c) {
    const UniformParams p = clip_candidate(xmin, xmax, c, s);
    const double e = clip_error(load, count, p, maxq);
    if (e < best_err) {
      best_err = e;
      best = p;
    }
  }
  return best;
}

// QUIK: the signed code of x under the row scale sc (std::clamp(nearbyint(x / sc), -qmax - 1, qmax)).
LOWBIT_HD float quik_code(float x, float sc, int qmax) {
  const float v = round_even(x / sc);
  const float lo = static_cast<float>(-qmax - 1), hi = static_cast<float>(qmax);
  return (v < lo) ? lo : ((hi < v) ? hi : v);
}

// QUIK's clipping candidate `step`: the shrink 1 - 0.01 step and the fp16-rounded scale it gives.
LOWBIT_HD float quik_shrink(int step) { return sub_rn(1.0f, mul_rn(0.01f, static_cast<float>(step))); }
LOWBIT_HD float quik_candidate_scale(float p, float amax, int qmax) {
  return f16_to_f32(f32_to_f16(mul_rn(p, amax) / static_cast<float>(qmax)));
}

// Σ (x - c·sc)² over a row's base columns, in the CPU's order (c·sc and d·d are exact, so contraction is moot).
template <typename Load>
LOWBIT_HD double quik_clip_error(Load load, int64_t kb, float sc, int qmax) {
  double e = 0;
  for (int64_t i = 0; i < kb; ++i) {
    const float x = load(i);
    const double d = sub_rn(x, mul_rn(quik_code(x, sc, qmax), sc));
    e = dadd_rn(e, dmul_rn(d, d));
  }
  return e;
}

// The fp16 row scale of quik.cpp: amax = max |x| over the base columns, optionally the least-error shrink.
template <typename Load>
LOWBIT_HD uint16_t quik_row_scale_sequential(Load load, int64_t kb, int qmax, bool clip) {
  float amax = 0;
  for (int64_t i = 0; i < kb; ++i) amax = std_max(amax, fabsf(load(i)));
  float best_p = 1.0f;
  if (clip && amax > 0) {
    double best = -1;
    for (int step = 0; step <= 50; ++step) {
      const float p = quik_shrink(step);
      const double e = quik_clip_error(load, kb, quik_candidate_scale(p, amax, qmax), qmax);
      if (best < 0 || e < best) {
        best = e;
        best_p = p;
      }
    }
  }
  return f32_to_f16(amax > 0 ? mul_rn(best_p, amax) / static_cast<float>(qmax) : 1.0f);
}

#ifdef __CUDACC__

constexpr unsigned kFullMask = 0xffffffffu;

// The first minimum of (err, candidate) over the warp: the lowest candidate among equal errors, as the CPU's strict
// "e < best" scan keeps the earliest. Lanes without a candidate pass (+inf, INT_MAX).
__device__ __forceinline__ int warp_first_argmin(double err, int cand) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const double oe = __shfl_xor_sync(kFullMask, err, off);
    const int oc = __shfl_xor_sync(kFullMask, cand, off);
    if (oe < err || (oe == err && oc < cand)) {
      err = oe;
      cand = oc;
    }
  }
  return cand;
}

// find_group_params for one group by a whole warp (all 32 lanes call it with the same arguments; the result is the
// same in every lane). load(i), i < count, may read shared or global memory; every lane reads every value.
template <typename Load>
__device__ UniformParams warp_group_params(Load load, int64_t count, const UniformSpecTwin& s) {
  const int lane = threadIdx.x & 31;
  float xmin = 0.0f, xmax = 0.0f;
  for (int64_t i = lane; i < count; i += 32) {
    const float v = load(i);
    xmin = std_min(xmin, v);
    xmax = std_max(xmax, v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    xmin = std_min(xmin, __shfl_xor_sync(kFullMask, xmin, off));
    xmax = std_max(xmax, __shfl_xor_sync(kFullMask, xmax, off));
  }
  // min/max are exact; only the sign of a zero can depend on the order, and lane 0's choice is made everyone's.
  xmin = __shfl_sync(kFullMask, xmin, 0);
  xmax = __shfl_sync(kFullMask, xmax, 0);
  if (!s.mse_clip) return uniform_params_for_range(xmin, xmax, s);
  const int maxq = (1 << s.bits) - 1;
  const int steps = clip_steps(s);
  double my_err = INFINITY;
  int my_c = INT_MAX;
  for (int c = lane; c <= steps; c += 32) {
    const double e = clip_error(load, count, clip_candidate(xmin, xmax, c, s), maxq);
    if (my_c == INT_MAX || e < my_err) {
      my_err = e;
      my_c = c;
    }
  }
  return clip_candidate(xmin, xmax, warp_first_argmin(my_err, my_c), s);
}

// QUIK's row scale by a whole warp: amax over the lanes, then one lane per clipping candidate.
template <typename Load>
__device__ uint16_t warp_quik_row_scale(Load load, int64_t kb, int qmax, bool clip) {
  const int lane = threadIdx.x & 31;
  float amax = 0;
  for (int64_t i = lane; i < kb; i += 32) amax = std_max(amax, fabsf(load(i)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = std_max(amax, __shfl_xor_sync(kFullMask, amax, off));
  amax = __shfl_sync(kFullMask, amax, 0);
  float best_p = 1.0f;
  if (clip && amax > 0) {
    double my_err = INFINITY;
    int my_step = INT_MAX;
    for (int step = lane; step <= 50; step += 32) {
      const double e = quik_clip_error(load, kb, quik_candidate_scale(quik_shrink(step), amax, qmax), qmax);
      if (my_step == INT_MAX || e < my_err) {
        my_err = e;
        my_step = step;
      }
    }
    best_p = quik_shrink(warp_first_argmin(my_err, my_step));
  }
  return f32_to_f16(amax > 0 ? mul_rn(best_p, amax) / static_cast<float>(qmax) : 1.0f);
}

#endif  // __CUDACC__

}  // namespace lowbit::cuda::gptq_twin
