// QUIK's per-token activation quantization as device pieces, shared by the kernel that quantizes x before a linear
// (quik_gemm.cu) and the kernels that produce x and quantize it on the way out (quik_producers.cu: RMSNorm, SwiGLU), so
// that every path gives the same bits. The arithmetic is quik_quantize_activations' (formats/quik/layout.h): per row,
// min / max over the base columns; integer activations asymmetric, sa = (max - min) / (2^abits - 1), code =
// clamp(round_half_even((v - min) / sa), 0, 2^abits - 1) - 2^(abits-1) by IEEE division; FP8 symmetric, sa = max|v| /
// 448, e4m3 by the hardware's round-to-nearest-even saturating conversion; a constant row takes sa = 1.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dispatch/device_weight.h"
#include "backend_cuda/quik/quik_act_layout.h"

namespace lowbit::cuda::quik_act {

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float from_e4m3(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
}

// The row's outlier columns as a bit mask over its k columns, and for each 32-column word the number of outliers
// before it, in shared memory: base column c of original column j is j - (outliers before j), so the row is read
// contiguously instead of gathered through base_idx (a dependent load per element, which measured latency-bound:
// ~355 us for 2048 tokens of 28672 columns on an H200). An outlier column j is outlier number j - base_col(j).
struct OutlierMap {
  uint32_t* mask;
  int* before;
  __device__ bool outlier(int64_t j) const { return (mask[j >> 5] >> (j & 31)) & 1u; }
  __device__ int64_t base_col(int64_t j) const {
    return j - before[j >> 5] - __popc(mask[j >> 5] & ((1u << (j & 31)) - 1u));
  }
};
inline size_t outlier_map_bytes(const QuikDevice& w) { return static_cast<size_t>((w.k + 31) / 32) * 8; }

// Built by the whole block (any size) into smem (outlier_map_bytes): the mask by atomicOr, then warp 0 scans the
// words' counts 32 at a time.
__device__ inline OutlierMap build_outlier_map(const QuikDevice& w, uint32_t* smem) {
  const int words = static_cast<int>((w.k + 31) / 32);
  OutlierMap om{smem, reinterpret_cast<int*>(smem + words)};
  for (int i = threadIdx.x; i < words; i += blockDim.x) om.mask[i] = 0;
  __syncthreads();
  for (int64_t o = threadIdx.x; o < w.no; o += blockDim.x) {
    const int32_t j = w.outlier_idx[o];
    atomicOr(&om.mask[j >> 5], 1u << (j & 31));
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    int run = 0;
    for (int base = 0; base < words; base += 32) {
      const int c = base + lane < words ? __popc(om.mask[base + lane]) : 0;
      int incl = c;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
      }
      if (base + lane < words) om.before[base + lane] = run + incl - c;
      run += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  __syncthreads();
  return om;
}

// fn(std::integral_constant<ActForm, f>{}): a form known at run time handed to code templated on it (kernel launches,
// and the attention kernels' one copy of the quantization loops for every form).
template <typename Fn>
__host__ __device__ __forceinline__ void by_form(ActForm f, Fn&& fn) {
  switch (f) {
    case ActForm::Int8: return fn(std::integral_constant<ActForm, ActForm::Int8>{});
    case ActForm::Fp8Int: return fn(std::integral_constant<ActForm, ActForm::Fp8Int>{});
    case ActForm::Fp8Byte: return fn(std::integral_constant<ActForm, ActForm::Fp8Byte>{});
    case ActForm::F32: return fn(std::integral_constant<ActForm, ActForm::F32>{});
    case ActForm::F16: return fn(std::integral_constant<ActForm, ActForm::F16>{});
  }
}

// The warp's min and max of each lane's (mn, mx), returned to every lane.
__device__ __forceinline__ void warp_min_max(float& mn, float& mx) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  }
}

// The block's min and max of each thread's (mn, mx) (blockDim a multiple of 32, at most 1024), returned to every thread.
__device__ inline void block_min_max(float& mn, float& mx) {
  __shared__ float smn[32], smx[32];
  warp_min_max(mn, mx);
  if ((threadIdx.x & 31) == 0) smn[threadIdx.x >> 5] = mn, smx[threadIdx.x >> 5] = mx;
  __syncthreads();
  mn = smn[0], mx = smx[0];
  for (int i = 1; i < static_cast<int>(blockDim.x / 32); ++i) mn = fminf(mn, smn[i]), mx = fmaxf(mx, smx[i]);
}

template <ActForm F>
constexpr bool kQuantized = F == ActForm::Int8 || F == ActForm::Fp8Int || F == ActForm::Fp8Byte;

// A row's scale sa and zero point lo from the min and max of its base columns.
template <ActForm F>
__device__ __forceinline__ void row_params(const QuikDevice& w, float mn, float mx, float& sa, float& lo) {
  sa = 1.0f, lo = 0.0f;   // no base column: the reference's defaults
  if constexpr (kQuantized<F>) {
    if (w.kb > 0) {
      if constexpr (F == ActForm::Int8) {
        lo = mn;
        sa = (mx - mn) / static_cast<float>((1 << w.abits) - 1);
      } else {
        sa = fmaxf(fabsf(mn), fabsf(mx)) / 448.0f;
      }
      if (!(sa > 0.0f)) sa = 1.0f;   // a constant (or zero) row: the reference's choice
    }
  }
}

// Base column c of token t's row in the form the next kernel reads (pad: c >= kb, zero codes / values).
template <ActForm F>
__device__ __forceinline__ void put(const QuikDevice& w, const ActScratch& s, int64_t t, int64_t c, float v, bool pad,
                                    float sa, float lo) {
  if constexpr (F == ActForm::Int8) {
    const int L = (1 << w.abits) - 1, H = 1 << (w.abits - 1);
    int code = 0;
    if (!pad) code = static_cast<int>(fminf(fmaxf(rintf(__fdiv_rn(v - lo, sa)), 0.0f), static_cast<float>(L))) - H;
    static_cast<int8_t*>(s.xq)[t * w.kbp + c] = static_cast<int8_t>(code);
  } else if constexpr (F == ActForm::Fp8Int || F == ActForm::Fp8Byte) {
    const uint8_t b = to_e4m3(__fdiv_rn(v, sa));   // padding: v = 0, e4m3 zero
    if constexpr (F == ActForm::Fp8Byte) static_cast<uint8_t*>(s.xq)[t * w.kbp + c] = b;
    else static_cast<int32_t*>(s.xq)[t * w.kbp + c] = static_cast<int32_t>(from_e4m3(b) * 512.0f);
  } else if constexpr (F == ActForm::F32) {
    static_cast<float*>(s.xq)[t * w.kbp + c] = v;
  } else {
    static_cast<__half*>(s.xq)[t * w.kbp + c] = __float2half_rn(v);
  }
}

// Column j of token t's row, value v: its base code, or (an outlier column) its fp16 value.
template <ActForm F>
__device__ __forceinline__ void put_column(const QuikDevice& w, const OutlierMap& om, const ActScratch& s, int64_t t,
                                           int64_t j, float v, float sa, float lo) {
  const int64_t c = om.base_col(j);
  if (om.outlier(j)) s.xo[t * w.no + (j - c)] = __float2half_rn(v);
  else put<F>(w, s, t, c, v, false, sa, lo);
}

// The row's padding columns and its per-token values, by `step` threads (thread i0 of them; the whole block by default).
template <ActForm F>
__device__ __forceinline__ void finish_row(const QuikDevice& w, const ActScratch& s, int64_t t, float sa, float lo,
                                           int i0 = static_cast<int>(threadIdx.x), int step = static_cast<int>(blockDim.x)) {
  for (int64_t c = w.kb + i0; c < w.kbp; c += step) put<F>(w, s, t, c, 0.0f, true, sa, lo);
  if (i0 == 0) {
    s.act[t] = {sa, lo};
    s.tsa[t] = sa;
    s.ta2[t] = F == ActForm::Int8 ? fmaf(static_cast<float>(1 << (w.abits - 1)), sa, lo) : 0.0f;
  }
}

}  // namespace lowbit::cuda::quik_act
