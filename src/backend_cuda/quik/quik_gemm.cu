// QUIK on the GPU (quik.h): activation quantization, the GEMV, the library GEMMs, the outlier product and the epilogue.
//
// Design
//   Activations: one CTA per token row, reading the row contiguously (a shared-memory bit mask of the outlier columns
//   maps original column j to base column j - outliers before j); a block reduction of min / max over the base
//   columns, then the row's values in the form the next kernel reads (ActForm), by quik_quantize_activations' own fp32
//   operations (IEEE division, round half to even, clamp; e4m3 by the hardware's round-to-nearest-even saturating
//   conversion, which is the reference's e4m3_round), rows padded to kbp with zeros; the outlier columns' activations
//   rounded to fp16 beside them. The quantization runs once per linear call (fusing it into the kernels that produce x,
//   as QUIK does, is the next step).
//   GEMV (batch 1..8): one warp per output row, lane L taking the 16-code chunks L, L + 32, ... of the row. Integer
//   activations: 16 bytes of 8-bit codes, or 8 bytes of 4-bit ones whose even and odd nibbles are sign-extended into two
//   words of int8 (the activations' even and odd bytes gathered to match with byte permutes), then __dp4a into int32:
//   exact (|code| <= 128, kb < 2^17: below 2^31). FP8: the activations as the reference's integers (e4m3 value x 512,
//   |v| <= 229376) times the codes, 16 products summed in int32 (< 2^26) and the chunks in int64: exact. A16: fp32.
//   The outlier columns are summed in fp64 by the same warp.
//   GEMM (batch > 8): the library's tensor-core GEMM, "TN" (both operands K-contiguous, as the format stores them):
//   cuBLAS int8 -> int32 (exact), cuBLASLt e4m3 x e4m3 -> fp32 (4-bit codes are exact e4m3 values), cuBLAS fp16 ->
//   fp32 (A16; codes exact in fp16, x rounded to fp16). 4-bit codes are widened into the weight scratch per call, so
//   no wider copy of a weight is kept. The outliers' product is a fp16 cuBLAS GEMM written straight into y; then one
//   element-wise epilogue adds the scaled sums. (The outliers summed by each epilogue thread instead, OutlierPass::
//   Epilogue, reads outlier_w once per token: bench --kernels times both.)
#include "backend_cuda/quik/quik.h"

#include <cublasLt.h>
#include <cuda_fp8.h>

#include <cub/block/block_scan.cuh>

#include <cfloat>
#include <type_traits>

#include "backend_cuda/common/common.h"
#include "backend_cuda/quik/quik_fused.h"
#include "core/error.h"
#include "core/knobs.h"

namespace lowbit::cuda {
namespace {

constexpr int kActThreads = 256;
constexpr int kWarps = 8;   // rows per CTA of the GEMV and of the epilogue

// What the activation kernel writes for the base columns.
enum class ActForm {
  Int8,      // abits 4 / 8: signed codes (GEMV and GEMM)
  Fp8Int,    // FP8, for the GEMV: int32 e4m3 value x 512 (the reference's integers)
  Fp8Byte,   // FP8, for the GEMM: e4m3 bytes
  F32,       // A16, for the GEMV
  F16,       // A16, for the GEMM
};

constexpr size_t act_elem_bytes(ActForm f) {
  return f == ActForm::Fp8Int || f == ActForm::F32 ? 4 : f == ActForm::F16 ? 2 : 1;
}

struct RowAct {
  float sa, mn;
};

size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// The activation scratch: values [m, kbp] of the form's element, then (sa, mn) [m], then the fused GEMM's per-token
// vectors sa [m] and a2 = H sa + mn [m], then fp16 outlier activations [m, no].
struct ActScratch {
  void* xq;
  RowAct* act;
  float* tsa;
  float* ta2;
  __half* xo;
};
size_t act_bytes(const QuikDevice& w, int64_t m, ActForm f) {
  return align16(static_cast<size_t>(m * w.kbp) * act_elem_bytes(f)) + align16(static_cast<size_t>(m) * sizeof(RowAct)) +
         2 * align16(static_cast<size_t>(m) * sizeof(float)) + static_cast<size_t>(m * w.no) * sizeof(__half);
}
ActScratch act_layout(const QuikDevice& w, int64_t m, ActForm f, void* base) {
  uint8_t* p = static_cast<uint8_t*>(base);
  ActScratch s;
  s.xq = p;
  p += align16(static_cast<size_t>(m * w.kbp) * act_elem_bytes(f));
  s.act = reinterpret_cast<RowAct*>(p);
  p += align16(static_cast<size_t>(m) * sizeof(RowAct));
  s.tsa = reinterpret_cast<float*>(p);
  p += align16(static_cast<size_t>(m) * sizeof(float));
  s.ta2 = reinterpret_cast<float*>(p);
  p += align16(static_cast<size_t>(m) * sizeof(float));
  s.xo = reinterpret_cast<__half*>(p);
  return s;
}

ActForm gemv_form(const QuikDevice& w) {
  return w.abits == 16 ? ActForm::F32 : w.act_fp8 ? ActForm::Fp8Int : ActForm::Int8;
}
ActForm gemm_form(const QuikDevice& w) {
  return w.abits == 16 ? ActForm::F16 : w.act_fp8 ? ActForm::Fp8Byte : ActForm::Int8;
}

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float from_e4m3(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
}

// The row's outlier columns as a bit mask over its k columns, and for each 32-column word the number of outliers
// before it, in shared memory: base column c of original column j is j - (outliers before j), so the row is read
// contiguously instead of gathered through base_idx (a dependent load per element, which measured latency-bound:
// ~355 us for 2048 tokens of 28672 columns on an H200).
struct OutlierMap {
  uint32_t* mask;
  int* before;
  __device__ bool outlier(int64_t j) const { return (mask[j >> 5] >> (j & 31)) & 1u; }
  __device__ int64_t base_col(int64_t j) const {
    return j - before[j >> 5] - __popc(mask[j >> 5] & ((1u << (j & 31)) - 1u));
  }
};
size_t outlier_map_bytes(const QuikDevice& w) { return static_cast<size_t>((w.k + 31) / 32) * 8; }

__device__ OutlierMap build_outlier_map(const QuikDevice& w, uint32_t* smem) {
  using Scan = cub::BlockScan<int, kActThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int words = static_cast<int>((w.k + 31) / 32);
  OutlierMap om{smem, reinterpret_cast<int*>(smem + words)};
  for (int i = threadIdx.x; i < words; i += kActThreads) om.mask[i] = 0;
  __syncthreads();
  for (int64_t o = threadIdx.x; o < w.no; o += kActThreads) {
    const int32_t j = w.outlier_idx[o];
    atomicOr(&om.mask[j >> 5], 1u << (j & 31));
  }
  __syncthreads();
  const int per = (words + kActThreads - 1) / kActThreads, w0 = threadIdx.x * per, w1 = min(words, w0 + per);
  int sum = 0;
  for (int i = w0; i < w1; ++i) sum += __popc(om.mask[i]);
  int run = 0;
  Scan(scan).ExclusiveSum(sum, run);
  for (int i = w0; i < w1; ++i) {
    om.before[i] = run;
    run += __popc(om.mask[i]);
  }
  __syncthreads();
  return om;
}

// The row's columns j = 4i .. 4i + 3 (float4 loads where k allows) or j = i alone, each passed to f(j, v).
template <typename F>
__device__ __forceinline__ void for_each_column(const float* __restrict__ xr, int64_t k, F&& f) {
  if (k % 4 == 0 && reinterpret_cast<uintptr_t>(xr) % 16 == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 2
    for (int64_t i = threadIdx.x; i < k / 4; i += kActThreads) {
      const float4 v = x4[i];
      f(4 * i, v.x);
      f(4 * i + 1, v.y);
      f(4 * i + 2, v.z);
      f(4 * i + 3, v.w);
    }
  } else {
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < k; j += kActThreads) f(j, xr[j]);
  }
}

template <ActForm F>
__global__ void __launch_bounds__(kActThreads) quik_act_kernel(QuikDevice w, const float* __restrict__ x, ActScratch s) {
  constexpr bool kInt = F == ActForm::Int8, kFp8 = F == ActForm::Fp8Int || F == ActForm::Fp8Byte;
  extern __shared__ uint32_t act_smem[];
  const OutlierMap om = build_outlier_map(w, act_smem);
  const int64_t t = blockIdx.x;
  const float* xr = x + t * w.k;
  float sa = 1.0f, lo = 0.0f;   // no base column: the reference's defaults
  if constexpr (kInt || kFp8) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for_each_column(xr, w.k, [&](int64_t j, float v) {
      if (!om.outlier(j)) mn = fminf(mn, v), mx = fmaxf(mx, v);
    });
    __shared__ float smn[kActThreads / 32], smx[kActThreads / 32];
    for (int off = 16; off > 0; off >>= 1) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    }
    if ((threadIdx.x & 31) == 0) smn[threadIdx.x >> 5] = mn, smx[threadIdx.x >> 5] = mx;
    __syncthreads();
    mn = smn[0], mx = smx[0];
    for (int i = 1; i < kActThreads / 32; ++i) mn = fminf(mn, smn[i]), mx = fmaxf(mx, smx[i]);
    if (w.kb > 0) {
      if constexpr (kFp8) {
        sa = fmaxf(fabsf(mn), fabsf(mx)) / 448.0f;
      } else {
        lo = mn;
        sa = (mx - mn) / static_cast<float>((1 << w.abits) - 1);
      }
      if (!(sa > 0.0f)) sa = 1.0f;   // a constant (or zero) row: the reference's choice
    }
  }
  // Base column c of the row in the form the next kernel reads (padding c >= kb: zero codes / values).
  const auto put = [&](int64_t c, float v, bool pad) {
    if constexpr (kInt) {
      const int L = (1 << w.abits) - 1, H = 1 << (w.abits - 1);
      int code = 0;
      if (!pad) code = static_cast<int>(fminf(fmaxf(rintf(__fdiv_rn(v - lo, sa)), 0.0f), static_cast<float>(L))) - H;
      static_cast<int8_t*>(s.xq)[t * w.kbp + c] = static_cast<int8_t>(code);
    } else if constexpr (kFp8) {
      const uint8_t b = to_e4m3(__fdiv_rn(v, sa));   // padding: v = 0, e4m3 zero
      if constexpr (F == ActForm::Fp8Byte) static_cast<uint8_t*>(s.xq)[t * w.kbp + c] = b;
      else static_cast<int32_t*>(s.xq)[t * w.kbp + c] = static_cast<int32_t>(from_e4m3(b) * 512.0f);
    } else if constexpr (F == ActForm::F32) {
      static_cast<float*>(s.xq)[t * w.kbp + c] = v;
    } else {
      static_cast<__half*>(s.xq)[t * w.kbp + c] = __float2half_rn(v);
    }
  };
  for_each_column(xr, w.k, [&](int64_t j, float v) {
    if (!om.outlier(j)) put(om.base_col(j), v, false);
  });
  for (int64_t c = w.kb + threadIdx.x; c < w.kbp; c += kActThreads) put(c, 0.0f, true);
  for (int64_t o = threadIdx.x; o < w.no; o += kActThreads) s.xo[t * w.no + o] = __float2half_rn(xr[w.outlier_idx[o]]);
  if (threadIdx.x == 0) {
    s.act[t] = {sa, lo};
    s.tsa[t] = sa;
    s.ta2[t] = kInt ? fmaf(static_cast<float>(1 << (w.abits - 1)), sa, lo) : 0.0f;
  }
}

// The scaled base product of one output, in fp64 (as quik_gemm_packed_ref), from its sum: integer activations' exact
// int32, the FP8 GEMV's int64 in units of 2^-9, the FP8 GEMM's fp32 in units of 1, A16's fp32.
template <ActForm F>
__device__ __forceinline__ double quik_main(const QuikDevice& w, int64_t r, RowAct a, double acc) {
  const double sw = __half2float(w.scale[r]);
  if constexpr (F == ActForm::Int8) {
    const double H = static_cast<double>(1 << (w.abits - 1));
    return static_cast<double>(a.sa) * sw * acc + (H * a.sa + a.mn) * static_cast<double>(w.wreduced[r]);
  } else if constexpr (F == ActForm::Fp8Int) {
    return static_cast<double>(a.sa) * sw * acc / 512.0;
  } else if constexpr (F == ActForm::Fp8Byte) {
    return static_cast<double>(a.sa) * sw * acc;
  } else {
    return sw * acc;
  }
}

// Sign-extends the 4-bit codes of a word (8 nibbles: base column 2i low, 2i + 1 high in byte i) into two words of
// int8: even columns, odd columns.
__device__ __forceinline__ void widen4(uint32_t u, int& even, int& odd) {
  even = static_cast<int>(__vsub4((u & 0x0F0F0F0Fu) ^ 0x08080808u, 0x08080808u));
  odd = static_cast<int>(__vsub4(((u >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u, 0x08080808u));
}

// The 16 codes of chunk j of row r as int8 in column order.
__device__ __forceinline__ uint4 codes16(const QuikDevice& w, int64_t r, int64_t j) {
  if (w.wbits == 8) return __ldg(reinterpret_cast<const uint4*>(w.wq8 + r * w.kbp) + j);
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(w.wq4 + r * (w.kbp / 2)) + j);
  int e0, o0, e1, o1;
  widen4(v.x, e0, o0);
  widen4(v.y, e1, o1);
  uint4 c;   // even / odd interleaved back into column order
  c.x = __byte_perm(e0, o0, 0x5140);
  c.y = __byte_perm(e0, o0, 0x7362);
  c.z = __byte_perm(e1, o1, 0x5140);
  c.w = __byte_perm(e1, o1, 0x7362);
  return c;
}

__device__ __forceinline__ int code_at(const uint4& c, int i) {   // signed byte i of 16
  const uint32_t word = i < 4 ? c.x : i < 8 ? c.y : i < 12 ? c.z : c.w;
  return static_cast<int8_t>((word >> (8 * (i & 3))) & 0xFFu);
}

template <ActForm F>
using GemvAcc = std::conditional_t<F == ActForm::Int8, int, std::conditional_t<F == ActForm::Fp8Int, long long, float>>;

template <int M, int WBITS, ActForm F>
__global__ void __launch_bounds__(kWarps * 32) quik_gemv_kernel(QuikDevice w, ActScratch s, float* __restrict__ y,
                                                                int64_t* __restrict__ acc_out) {
  using Acc = GemvAcc<F>;
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= w.n) return;   // whole warps
  Acc acc[M];
#pragma unroll
  for (int b = 0; b < M; ++b) acc[b] = 0;
  const int64_t chunks = w.kbp / 16;
#pragma unroll 2
  for (int64_t j = lane; j < chunks; j += 32) {
    if constexpr (F == ActForm::Int8 && WBITS == 8) {
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(w.wq8 + r * w.kbp) + j);
#pragma unroll
      for (int b = 0; b < M; ++b) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(static_cast<const int8_t*>(s.xq) + b * w.kbp) + j);
        acc[b] = __dp4a(static_cast<int>(xv.x), static_cast<int>(wv.x), acc[b]);
        acc[b] = __dp4a(static_cast<int>(xv.y), static_cast<int>(wv.y), acc[b]);
        acc[b] = __dp4a(static_cast<int>(xv.z), static_cast<int>(wv.z), acc[b]);
        acc[b] = __dp4a(static_cast<int>(xv.w), static_cast<int>(wv.w), acc[b]);
      }
    } else if constexpr (F == ActForm::Int8) {
      const uint2 wv = __ldg(reinterpret_cast<const uint2*>(w.wq4 + r * (w.kbp / 2)) + j);
      int e0, o0, e1, o1;
      widen4(wv.x, e0, o0);
      widen4(wv.y, e1, o1);
#pragma unroll
      for (int b = 0; b < M; ++b) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(static_cast<const int8_t*>(s.xq) + b * w.kbp) + j);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.x, xv.y, 0x6420)), e0, acc[b]);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.x, xv.y, 0x7531)), o0, acc[b]);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.z, xv.w, 0x6420)), e1, acc[b]);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.z, xv.w, 0x7531)), o1, acc[b]);
      }
    } else {
      const uint4 wc = codes16(w, r, j);
#pragma unroll
      for (int b = 0; b < M; ++b) {
        if constexpr (F == ActForm::Fp8Int) {
          const int4* xp = reinterpret_cast<const int4*>(static_cast<const int32_t*>(s.xq) + b * w.kbp) + 4 * j;
          int part = 0;   // 16 products of |v| <= 229376 and |code| <= 8: below 2^26
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int4 xv = __ldg(xp + q);
            part += xv.x * code_at(wc, 4 * q) + xv.y * code_at(wc, 4 * q + 1) + xv.z * code_at(wc, 4 * q + 2) +
                    xv.w * code_at(wc, 4 * q + 3);
          }
          acc[b] += part;
        } else {
          const float4* xp = reinterpret_cast<const float4*>(static_cast<const float*>(s.xq) + b * w.kbp) + 4 * j;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float4 xv = __ldg(xp + q);
            acc[b] = fmaf(xv.x, static_cast<float>(code_at(wc, 4 * q)), acc[b]);
            acc[b] = fmaf(xv.y, static_cast<float>(code_at(wc, 4 * q + 1)), acc[b]);
            acc[b] = fmaf(xv.z, static_cast<float>(code_at(wc, 4 * q + 2)), acc[b]);
            acc[b] = fmaf(xv.w, static_cast<float>(code_at(wc, 4 * q + 3)), acc[b]);
          }
        }
      }
    }
  }
  double outl[M];
#pragma unroll
  for (int b = 0; b < M; ++b) outl[b] = 0.0;
  for (int64_t o = lane; o < w.no; o += 32) {
    const double wo = __half2float(w.outlier_w[r * w.no + o]);
#pragma unroll
    for (int b = 0; b < M; ++b) outl[b] += static_cast<double>(__half2float(s.xo[b * w.no + o])) * wo;
  }
#pragma unroll
  for (int b = 0; b < M; ++b)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      acc[b] += __shfl_xor_sync(0xffffffffu, acc[b], off);
      outl[b] += __shfl_xor_sync(0xffffffffu, outl[b], off);
    }
  if (lane == 0)
#pragma unroll
    for (int b = 0; b < M; ++b) {
      y[b * w.n + r] = static_cast<float>(quik_main<F>(w, r, s.act[b], static_cast<double>(acc[b])) + outl[b]);
      if constexpr (F != ActForm::F32)
        if (acc_out != nullptr) acc_out[b * w.n + r] = static_cast<int64_t>(acc[b]);
    }
}

// The GEMM's epilogue, one thread per output: y = the scaled sum + the outliers (already in y from their GEMM, or
// summed here).
template <ActForm F, typename AccT>
__global__ void __launch_bounds__(kWarps * 32) quik_epilogue_kernel(QuikDevice w, ActScratch s, int64_t m,
                                                                    const AccT* __restrict__ acc, int64_t ldc,
                                                                    OutlierPass pass, float* __restrict__ y,
                                                                    int64_t* __restrict__ acc_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * w.n) return;
  const int64_t t = i / w.n, r = i - t * w.n;
  double outl = 0.0;
  if (pass == OutlierPass::Gemm) {
    if (w.no > 0) outl = y[i];
  } else {
    for (int64_t o = 0; o < w.no; ++o)
      outl += static_cast<double>(__half2float(s.xo[t * w.no + o])) * __half2float(w.outlier_w[r * w.no + o]);
  }
  const AccT a = acc[t * ldc + r];
  y[i] = static_cast<float>(quik_main<F>(w, r, s.act[t], static_cast<double>(a)) + outl);
  if constexpr (std::is_integral_v<AccT>)
    if (acc_out != nullptr) acc_out[i] = a;
}

// The codes [n, kbp] as the GEMM's operand T (int8, e4m3 or fp16), 16 codes per thread.
template <typename T>
__global__ void quik_widen_kernel(QuikDevice w, T* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;   // 16-code chunk
  const int64_t per_row = w.kbp / 16;
  if (i >= w.n * per_row) return;
  const uint4 c = codes16(w, i / per_row, i % per_row);
  if constexpr (sizeof(T) == 1 && std::is_signed_v<T>) {
    reinterpret_cast<uint4*>(out)[i] = c;
  } else if constexpr (sizeof(T) == 1) {   // e4m3: every code of 4 bits is exact
    uint8_t b[16];
#pragma unroll
    for (int q = 0; q < 16; ++q) b[q] = to_e4m3(static_cast<float>(code_at(c, q)));
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(b);
  } else {
    __half h[16];
#pragma unroll
    for (int q = 0; q < 16; ++q) h[q] = __int2half_rn(code_at(c, q));
    reinterpret_cast<uint4*>(out)[2 * i] = *reinterpret_cast<const uint4*>(h);
    reinterpret_cast<uint4*>(out)[2 * i + 1] = *reinterpret_cast<const uint4*>(h + 8);
  }
}

// x quantized into the context's activation scratch in form f, laid out for `rows` >= m tokens (the rows past m zero).
ActScratch quantize_activations(const QuikDevice& w, const float* x, int64_t m, int64_t rows, ActForm f,
                                GemmContext& ctx) {
  LOWBIT_CHECK(w.abits == 4 || w.abits == 8 || w.abits == 16, "quik GPU: abits ", w.abits);
  LOWBIT_CHECK(!w.act_fp8 || (w.wbits == 4 && w.abits == 8), "quik GPU: FP8 activations need W4A8");
  const ActScratch s = act_layout(w, rows, f, ctx.act_scratch((act_bytes(w, rows, f) + 1) / 2));
  if (rows > m)
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(s.xq) + m * w.kbp * act_elem_bytes(f), 0,
                                      static_cast<size_t>((rows - m) * w.kbp) * act_elem_bytes(f), ctx.stream()));
  const unsigned grid = static_cast<unsigned>(m);
  const size_t smem = outlier_map_bytes(w);
  LOWBIT_CHECK(smem <= 48 * 1024, "quik GPU: ", w.k, " input columns (at most 196608)");
  cudaStream_t st = ctx.stream();
  switch (f) {
    case ActForm::Int8: quik_act_kernel<ActForm::Int8><<<grid, kActThreads, smem, st>>>(w, x, s); break;
    case ActForm::Fp8Int: quik_act_kernel<ActForm::Fp8Int><<<grid, kActThreads, smem, st>>>(w, x, s); break;
    case ActForm::Fp8Byte: quik_act_kernel<ActForm::Fp8Byte><<<grid, kActThreads, smem, st>>>(w, x, s); break;
    case ActForm::F32: quik_act_kernel<ActForm::F32><<<grid, kActThreads, smem, st>>>(w, x, s); break;
    case ActForm::F16: quik_act_kernel<ActForm::F16><<<grid, kActThreads, smem, st>>>(w, x, s); break;
  }
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  return s;
}

template <int M, ActForm F>
void launch_gemv_form(const QuikDevice& w, const ActScratch& s, float* y, int64_t* acc_out, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>((w.n + kWarps - 1) / kWarps);
  if (w.wbits == 8) quik_gemv_kernel<M, 8, F><<<grid, kWarps * 32, 0, st>>>(w, s, y, acc_out);
  else quik_gemv_kernel<M, 4, F><<<grid, kWarps * 32, 0, st>>>(w, s, y, acc_out);
}

template <int M>
void launch_gemv(const QuikDevice& w, ActForm f, const ActScratch& s, float* y, int64_t* acc_out, cudaStream_t st) {
  switch (f) {
    case ActForm::Int8: return launch_gemv_form<M, ActForm::Int8>(w, s, y, acc_out, st);
    case ActForm::Fp8Int: return launch_gemv_form<M, ActForm::Fp8Int>(w, s, y, acc_out, st);
    default: return launch_gemv_form<M, ActForm::F32>(w, s, y, acc_out, st);
  }
}

// acc [m, n] fp32 (column-major [n, m]) = W8 [n, kbp] e4m3 · xq [m, kbp]ᵀ e4m3 by cuBLASLt, fp32 accumulation; n and
// m the padded sizes (multiples of 16).
void fp8_gemm(const QuikDevice& w, const uint8_t* wq, const uint8_t* xq, int64_t n, int64_t m, float* acc,
              GemmContext& ctx) {
  // A cuBLAS handle serves as a cuBLASLt handle.
  cublasLtHandle_t lt = reinterpret_cast<cublasLtHandle_t>(ctx.cublas());
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const auto ok = [](cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; };
  const bool ready =
      ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
      ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
      ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
      ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, static_cast<uint64_t>(w.kbp), static_cast<uint64_t>(n), w.kbp)) &&
      ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, static_cast<uint64_t>(w.kbp), static_cast<uint64_t>(m), w.kbp)) &&
      ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n)) &&
      ok(cublasLtMatmulPreferenceCreate(&pref)) &&
      ok(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found)) && found > 0;
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (ready) {
    const float one = 1.0f, zero = 0.0f;
    st = cublasLtMatmul(lt, op, &one, wq, la, xq, lb, &zero, acc, lc, acc, lc, &heur.algo, nullptr, 0, ctx.stream());
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  LOWBIT_CHECK(ready, "quik GPU: cuBLASLt has no FP8 GEMM for ", n, " x ", w.kbp, " at batch ", m);
  cublas_check(st, "quik FP8 GEMM (cuBLASLt)");
}

template <ActForm F, typename AccT>
void launch_epilogue(const QuikDevice& w, const ActScratch& s, int64_t m, const AccT* acc, int64_t ldc,
                     OutlierPass pass, float* y, int64_t* acc_out, cudaStream_t st) {
  const int64_t total = m * w.n;
  quik_epilogue_kernel<F, AccT><<<static_cast<unsigned>((total + kWarps * 32 - 1) / (kWarps * 32)), kWarps * 32, 0, st>>>(
      w, s, m, acc, ldc, pass, y, acc_out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
const T* widen(const QuikDevice& w, void* out, cudaStream_t st) {
  const int64_t chunks = w.n * (w.kbp / 16);
  if (chunks > 0) quik_widen_kernel<T><<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, st>>>(w, static_cast<T*>(out));
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  return static_cast<const T*>(out);
}

// y [m, n] = the outlier columns' product (beta 0), or y += it (beta 1): "TN", fp16 in, fp32 accumulation and out
// (y [m, n] is the column-major [n, m]; outlier_w [n, no], xo [m, no]).
void outlier_gemm(const QuikDevice& w, const ActScratch& s, int64_t m, float* y, float beta, GemmContext& ctx) {
  const float one = 1.0f;
  cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n), static_cast<int>(m),
                            static_cast<int>(w.no), &one, w.outlier_w, CUDA_R_16F, static_cast<int>(w.no), s.xo,
                            CUDA_R_16F, static_cast<int>(w.no), &beta, y, CUDA_R_32F, static_cast<int>(w.n),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "quik outlier GEMM");
}

// cuBLAS's int8 GEMM wants the sums' leading dimension a multiple of 4; cuBLASLt's FP8 GEMM finds algorithms only for
// dimensions that are multiples of 16, so its operands are padded with zero rows (weights) and zero tokens.
int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
int64_t acc_ld(const QuikDevice& w) { return gemm_form(w) == ActForm::Fp8Byte ? round_up(w.n, 16) : round_up(w.n, 4); }
int64_t gemm_rows(const QuikDevice& w, int64_t m) { return gemm_form(w) == ActForm::Fp8Byte ? round_up(m, 16) : m; }


// The fused Hopper GEMM (quik_fused.h) serves the integer and FP8 forms where it was built and fits, from
// kFusedMinTokens tokens: below, its 256-token tiles are mostly empty and the library GEMM + epilogue measured as fast
// or faster at W8A8 (H200, bench --kernels: 128 tokens on 28672x8192 144.0 against 120.6 us).
// LOWBIT_QUIK_FUSED=0 / 1 forces either; OutlierPass::Epilogue takes the library form.
constexpr int64_t kFusedMinTokens = 256;
bool fused_form(const QuikDevice& w, int64_t m) {
#if LOWBIT_WITH_CUTLASS
  const ActForm f = gemm_form(w);
  const int64_t knob = knob_int(Knob::QuikFused);
  return (f == ActForm::Int8 || f == ActForm::Fp8Byte) && knob != 0 && (knob == 1 || m >= kFusedMinTokens) &&
         quik_fused_available() && quik_fused_fits(w.n, w.kbp);
#else
  (void)w, (void)m;
  return false;
#endif
}

__global__ void sums_to_int64_kernel(const float* __restrict__ sums, int64_t count, int64_t* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = static_cast<int64_t>(sums[i]);
}

#if LOWBIT_WITH_CUTLASS
QuikFusedArgs fused_args(const QuikDevice& w, int64_t m) {
  QuikFusedArgs a;
  a.kind = gemm_form(w) == ActForm::Fp8Byte ? QuikFusedKind::W4Fp8 : w.wbits == 8 ? QuikFusedKind::W8A8 : QuikFusedKind::W4A8;
  a.m = m, a.n = w.n, a.k = w.kbp;
  return a;
}
#endif

size_t fused_workspace_bytes(const QuikDevice& w, int64_t m) {
#if LOWBIT_WITH_CUTLASS
  return align16(quik_fused_workspace_bytes(fused_args(w, m)));
#else
  (void)w, (void)m;
  return 0;
#endif
}

size_t widened_bytes(const QuikDevice& w) {
  const ActForm f = gemm_form(w);
  if (f == ActForm::F16) return static_cast<size_t>(w.n * w.kbp) * sizeof(__half);
  if (f == ActForm::Fp8Byte) return static_cast<size_t>(round_up(w.n, 16) * w.kbp);
  return w.wbits == 4 ? static_cast<size_t>(w.n * w.kbp) : 0;
}

size_t library_scratch_bytes(const QuikDevice& w, int64_t m) {
  return align16(static_cast<size_t>(gemm_rows(w, m) * acc_ld(w)) * 4) + widened_bytes(w);
}

size_t fused_scratch_bytes(const QuikDevice& w, int64_t m) {
  return (gemm_form(w) == ActForm::Fp8Byte ? align16(widened_bytes(w)) : 0) + fused_workspace_bytes(w, m);
}

#if LOWBIT_WITH_CUTLASS
// The fused form: the fused GEMM writes y (scales and zero-point term applied), then the outliers' fp16 GEMM adds into
// it. Integer activations read the 4- or 8-bit codes as stored; FP8 widens the 4-bit codes to e4m3 first.
// acc_out (tests, integer forms): the same kernel run again with unit scales and no zero-point term writes the sums as
// fp32, exact below 2^24.
void fused_gemm(const QuikDevice& w, const ActScratch& s, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out) {
  cudaStream_t st = ctx.stream();
  const ActForm f = gemm_form(w);
  const size_t base_bytes = fused_scratch_bytes(w, m), ws_bytes = fused_workspace_bytes(w, m);
  const size_t sums_bytes = acc_out != nullptr && f == ActForm::Int8 ? static_cast<size_t>(m * w.n) * sizeof(float) : 0;
  uint8_t* scratch = reinterpret_cast<uint8_t*>(ctx.weight_scratch((base_bytes + sums_bytes + 1) / 2));
  void* ws = scratch + (base_bytes - ws_bytes);
  QuikFusedArgs a = fused_args(w, m);
  if (f == ActForm::Fp8Byte) a.w = widen<uint8_t>(w, scratch, st);   // e4m3
  else a.w = w.wbits == 8 ? static_cast<const void*>(w.wq8) : static_cast<const void*>(w.wq4);
  a.x = s.xq;
  a.sa = s.tsa;
  a.a2 = f == ActForm::Int8 ? s.ta2 : nullptr;
  a.sw = w.scale;
  a.wred = f == ActForm::Int8 ? w.wreduced : nullptr;
  a.y = y;
  quik_fused_gemm(a, ws, ws_bytes, st);
  if (w.no > 0) outlier_gemm(w, s, m, y, 1.0f, ctx);
  if (sums_bytes > 0) {
    float* sums = reinterpret_cast<float*>(scratch + base_bytes);
    a.sa = a.a2 = nullptr;
    a.sw = nullptr;
    a.wred = nullptr;
    a.y = sums;
    quik_fused_gemm(a, ws, ws_bytes, st);
    const int64_t count = m * w.n;
    sums_to_int64_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, st>>>(sums, count, acc_out);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
  }
}
#endif

}  // namespace

size_t quik_act_scratch_bytes(const QuikDevice& w, int64_t m) {
  return m <= 8 ? act_bytes(w, m, gemv_form(w)) : act_bytes(w, gemm_rows(w, m), gemm_form(w));
}

size_t quik_gemm_scratch_bytes(const QuikDevice& w, int64_t m) {
  return fused_form(w, m) ? fused_scratch_bytes(w, m) : library_scratch_bytes(w, m);
}

bool quik_gemm_fused(const QuikDevice& w, int64_t m) { return m > 8 && fused_form(w, m); }

void quik_gemv(const QuikDevice& w, const float* x, int m, float* y, GemmContext& ctx, int64_t* acc_out) {
  LOWBIT_CHECK(m >= 1 && m <= 8, "quik_gemv: batch ", m, " (1..8 served; above, quik_gemm)");
  const ActForm f = gemv_form(w);
  const ActScratch s = quantize_activations(w, x, m, m, f, ctx);
  switch (m) {
    case 1: launch_gemv<1>(w, f, s, y, acc_out, ctx.stream()); break;
    case 2: launch_gemv<2>(w, f, s, y, acc_out, ctx.stream()); break;
    case 3: launch_gemv<3>(w, f, s, y, acc_out, ctx.stream()); break;
    case 4: launch_gemv<4>(w, f, s, y, acc_out, ctx.stream()); break;
    case 5: launch_gemv<5>(w, f, s, y, acc_out, ctx.stream()); break;
    case 6: launch_gemv<6>(w, f, s, y, acc_out, ctx.stream()); break;
    case 7: launch_gemv<7>(w, f, s, y, acc_out, ctx.stream()); break;
    default: launch_gemv<8>(w, f, s, y, acc_out, ctx.stream()); break;
  }
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void quik_gemm(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out,
               OutlierPass pass) {
  LOWBIT_CHECK(m >= 1 && m <= INT32_MAX && w.n <= INT32_MAX, "quik_gemm: ", m, " x ", w.n, " outputs");
  const ActForm f = gemm_form(w);
  const int64_t rows = gemm_rows(w, m);
  const ActScratch s = quantize_activations(w, x, m, rows, f, ctx);
  cudaStream_t st = ctx.stream();
#if LOWBIT_WITH_CUTLASS
  if (pass == OutlierPass::Gemm && fused_form(w, m) && reinterpret_cast<uintptr_t>(y) % 16 == 0)
    return fused_gemm(w, s, m, y, ctx, acc_out);
#endif
  uint8_t* ws = reinterpret_cast<uint8_t*>(ctx.weight_scratch((library_scratch_bytes(w, m) + 1) / 2));
  const int64_t ldc = acc_ld(w);
  void* acc = ws;   // the sums [rows, ldc]: int32 or fp32
  void* wide = ws + align16(static_cast<size_t>(rows * ldc) * 4);
  const int N = static_cast<int>(w.n), Mi = static_cast<int>(m), K = static_cast<int>(w.kbp);
  if (w.no > 0 && pass == OutlierPass::Gemm) outlier_gemm(w, s, m, y, 0.0f, ctx);
  if (w.kbp == 0) LOWBIT_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(rows * ldc) * 4, st));
  if (f == ActForm::Int8) {
    if (w.kbp > 0) {
      const int8_t* wq = w.wbits == 8 ? w.wq8 : widen<int8_t>(w, wide, st);
      const int32_t one = 1, zero = 0;
      cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, N, Mi, K, &one, wq, CUDA_R_8I, K, s.xq,
                                CUDA_R_8I, K, &zero, acc, CUDA_R_32I, static_cast<int>(ldc), CUBLAS_COMPUTE_32I,
                                CUBLAS_GEMM_DEFAULT),
                   "quik int8 GEMM");
    }
    launch_epilogue<ActForm::Int8>(w, s, m, static_cast<const int32_t*>(acc), ldc, pass, y, acc_out, st);
  } else if (f == ActForm::Fp8Byte) {
    if (w.kbp > 0) {
      if (ldc > w.n)   // the padding rows of the widened weight: e4m3 zeros
        LOWBIT_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(wide) + w.n * w.kbp, 0, static_cast<size_t>((ldc - w.n) * w.kbp), st));
      fp8_gemm(w, widen<uint8_t>(w, wide, st), static_cast<const uint8_t*>(s.xq), ldc, rows, static_cast<float*>(acc), ctx);
    }
    launch_epilogue<ActForm::Fp8Byte>(w, s, m, static_cast<const float*>(acc), ldc, pass, y, nullptr, st);
  } else {
    if (w.kbp > 0) {
      const __half* wq = widen<__half>(w, wide, st);
      const float one = 1.0f, zero = 0.0f;
      cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, N, Mi, K, &one, wq, CUDA_R_16F, K, s.xq,
                                CUDA_R_16F, K, &zero, acc, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "quik A16 GEMM");
    }
    launch_epilogue<ActForm::F16>(w, s, m, static_cast<const float*>(acc), ldc, pass, y, nullptr, st);
  }
}

void quik_matmul(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out) {
  if (m <= 8) return quik_gemv(w, x, static_cast<int>(m), y, ctx, acc_out);
  quik_gemm(w, x, m, y, ctx, acc_out);
}

}  // namespace lowbit::cuda
