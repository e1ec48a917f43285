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
//   The outlier columns are summed in fp64 by the same warp. At batch 1..2 integer activations take a 32-code form
//   (LOWBIT_QUIK_GEMV_CHUNK): four chunks' codes loaded per lane before any is summed.
//   GEMM (batch > 8): the library's tensor-core GEMM, "TN" (both operands K-contiguous, as the format stores them):
//   cuBLAS int8 -> int32 (exact), cuBLASLt e4m3 x e4m3 -> fp32 (4-bit codes are exact e4m3 values), cuBLAS fp16 ->
//   fp32 (A16; codes exact in fp16, x rounded to fp16). 4-bit codes are widened into the weight scratch per call, so
//   no wider copy of a weight is kept. The outliers' product is a fp16 cuBLAS GEMM written straight into y; then one
//   element-wise epilogue adds the scaled sums. (The outliers summed by each epilogue thread instead, OutlierPass::
//   Epilogue, reads outlier_w once per token: bench --kernels times both.)
#include "backend_cuda/quik/quik.h"

#include <cublasLt.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <type_traits>

#include "backend_cuda/common/common.h"
#include "backend_cuda/quik/quik_act.cuh"
#include "backend_cuda/quik/quik_fused.h"
#include "core/error.h"
#include "core/knobs.h"

namespace lowbit::cuda {
namespace {

using namespace quik_act;

constexpr int kActThreads = 256;
constexpr int kWarps = 8;   // rows per CTA of the GEMV and of the epilogue

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
  extern __shared__ uint32_t act_smem[];
  const OutlierMap om = build_outlier_map(w, act_smem);
  const int64_t t = blockIdx.x;
  const float* xr = x + t * w.k;
  float mn = FLT_MAX, mx = -FLT_MAX;
  if constexpr (kQuantized<F>) {
    for_each_column(xr, w.k, [&](int64_t j, float v) {
      if (!om.outlier(j)) mn = fminf(mn, v), mx = fmaxf(mx, v);
    });
    block_min_max(mn, mx);
  }
  float sa, lo;
  row_params<F>(w, mn, mx, sa, lo);
  for_each_column(xr, w.k, [&](int64_t j, float v) { put_column<F>(w, om, s, t, j, v, sa, lo); });
  finish_row<F>(w, s, t, sa, lo);
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

// The end of a GEMV warp's row r: the outlier columns in fp64, the warp's sums reduced, y (and the raw sums) written.
template <int M, ActForm F>
__device__ __forceinline__ void gemv_row_tail(const QuikDevice& w, const ActScratch& s, int64_t r, int lane,
                                              GemvAcc<F> (&acc)[M], float* __restrict__ y,
                                              int64_t* __restrict__ acc_out) {
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
  gemv_row_tail<M, F>(w, s, r, lane, acc, y, acc_out);
}

// The integer-activation GEMV with 32-code chunks (batch 1..2; LOWBIT_QUIK_GEMV_CHUNK): lane L takes chunks L, L + 32, ...,
// kUnroll of them loaded before any is summed, so a lane has 64 bytes of 4-bit codes (128 of 8-bit) in flight instead
// of the 16-code form's 16. The same int32 sums (exact, in any order), so y is bit-identical to the 16-code form's.
template <int M, int WBITS>
__global__ void __launch_bounds__(kWarps * 32) quik_gemv_wide_kernel(QuikDevice w, ActScratch s, float* __restrict__ y,
                                                                     int64_t* __restrict__ acc_out) {
  constexpr int kUnroll = 4;
  constexpr int kWords = WBITS == 8 ? 2 : 1;   // uint4 words of codes per 32-code chunk
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= w.n) return;   // whole warps
  int acc[M];
#pragma unroll
  for (int b = 0; b < M; ++b) acc[b] = 0;
  const int64_t chunks = w.kbp / 32;
  const uint4* wrow = WBITS == 8 ? reinterpret_cast<const uint4*>(w.wq8 + r * w.kbp)
                                  : reinterpret_cast<const uint4*>(w.wq4 + r * (w.kbp / 2));
  const uint4* xq = static_cast<const uint4*>(s.xq);   // row b's chunk j: words 2 (b kbp / 32 + j), + 1
  for (int64_t j0 = lane; j0 < chunks; j0 += 32 * kUnroll) {
    uint4 wv[kUnroll][kWords];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + 32 * u;
#pragma unroll
      for (int q = 0; q < kWords; ++q) wv[u][q] = j < chunks ? __ldg(wrow + kWords * j + q) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + 32 * u;
      if (j >= chunks) break;
#pragma unroll
      for (int b = 0; b < M; ++b) {
        const uint4 xa = __ldg(xq + 2 * (b * chunks + j)), xb = __ldg(xq + 2 * (b * chunks + j) + 1);
        if constexpr (WBITS == 8) {
          acc[b] = __dp4a(static_cast<int>(xa.x), static_cast<int>(wv[u][0].x), acc[b]);
          acc[b] = __dp4a(static_cast<int>(xa.y), static_cast<int>(wv[u][0].y), acc[b]);
          acc[b] = __dp4a(static_cast<int>(xa.z), static_cast<int>(wv[u][0].z), acc[b]);
          acc[b] = __dp4a(static_cast<int>(xa.w), static_cast<int>(wv[u][0].w), acc[b]);
          acc[b] = __dp4a(static_cast<int>(xb.x), static_cast<int>(wv[u][1].x), acc[b]);
          acc[b] = __dp4a(static_cast<int>(xb.y), static_cast<int>(wv[u][1].y), acc[b]);
          acc[b] = __dp4a(static_cast<int>(xb.z), static_cast<int>(wv[u][1].z), acc[b]);
          acc[b] = __dp4a(static_cast<int>(xb.w), static_cast<int>(wv[u][1].w), acc[b]);
        } else {
          const uint32_t words[4] = {wv[u][0].x, wv[u][0].y, wv[u][0].z, wv[u][0].w};
          const uint32_t xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {   // word q: columns 8q .. 8q + 7, even nibbles then odd
            int even, odd;
            widen4(words[q], even, odd);
            acc[b] = __dp4a(static_cast<int>(__byte_perm(xs[2 * q], xs[2 * q + 1], 0x6420)), even, acc[b]);
            acc[b] = __dp4a(static_cast<int>(__byte_perm(xs[2 * q], xs[2 * q + 1], 0x7531)), odd, acc[b]);
          }
        }
      }
    }
  }
  gemv_row_tail<M, ActForm::Int8>(w, s, r, lane, acc, y, acc_out);
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
  zero_padding_rows(w, s, m, rows, f, ctx.stream());
  const unsigned grid = static_cast<unsigned>(m);
  const size_t smem = outlier_map_bytes(w);
  LOWBIT_CHECK(smem <= 48 * 1024, "quik GPU: ", w.k, " input columns (at most 196608)");
  cudaStream_t st = ctx.stream();
  by_form(f, [&](auto form) {
    quik_act_kernel<decltype(form)::value><<<grid, kActThreads, smem, st>>>(w, x, s);
  });
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  return s;
}

template <int M, ActForm F>
void launch_gemv_form(const QuikDevice& w, const ActScratch& s, float* y, int64_t* acc_out, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>((w.n + kWarps - 1) / kWarps);
  // 32-code chunks at batch 1..2, where the loads in flight pay (W4A8 7B decode 306.3 -> 320.6 tok/s, H200); from
  // batch 3 the wider form's registers cost more than they bring (W8A8 at batch 8: 164 registers, 1.6x slower).
  const int64_t chunk = knob_int(Knob::QuikGemvChunk);
  if constexpr (F == ActForm::Int8)
    if (chunk == 32 || (chunk == 0 && M <= 2)) {
      if (w.wbits == 8) quik_gemv_wide_kernel<M, 8><<<grid, kWarps * 32, 0, st>>>(w, s, y, acc_out);
      else quik_gemv_wide_kernel<M, 4><<<grid, kWarps * 32, 0, st>>>(w, s, y, acc_out);
      return;
    }
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

// The e4m3 codes (FP8) and then the kernel's workspace (ws_bytes, fused_workspace_bytes).
size_t fused_scratch_bytes(const QuikDevice& w, size_t ws_bytes) {
  return (gemm_form(w) == ActForm::Fp8Byte ? align16(widened_bytes(w)) : 0) + ws_bytes;
}

#if LOWBIT_WITH_CUTLASS
// The fused form: the fused GEMM writes y (scales and zero-point term applied), then the outliers' fp16 GEMM adds into
// it. Integer activations read the 4- or 8-bit codes as stored; FP8 widens the 4-bit codes to e4m3 first.
// acc_out (tests, integer forms): the same kernel run again with unit scales and no zero-point term writes the sums as
// fp32, exact below 2^24.
void fused_gemm(const QuikDevice& w, const ActScratch& s, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out) {
  cudaStream_t st = ctx.stream();
  const ActForm f = gemm_form(w);
  const size_t ws_bytes = fused_workspace_bytes(w, m), base_bytes = fused_scratch_bytes(w, ws_bytes);
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
  return act_bytes(w, act_rows(w, m), form_at(w, m));
}

size_t quik_gemm_scratch_bytes(const QuikDevice& w, int64_t m) {
  return fused_form(w, m) ? fused_scratch_bytes(w, fused_workspace_bytes(w, m)) : library_scratch_bytes(w, m);
}

bool quik_gemm_fused(const QuikDevice& w, int64_t m) { return m > 8 && fused_form(w, m); }

namespace {
// The GEMV over activations already quantized into s.
void gemv_from(const QuikDevice& w, const ActScratch& s, int m, float* y, GemmContext& ctx, int64_t* acc_out) {
  const ActForm f = gemv_form(w);
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

// The GEMM over activations already quantized into s ([gemm_rows(w, m), kbp], the padding rows zero).
void gemm_from(const QuikDevice& w, const ActScratch& s, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out,
               OutlierPass pass) {
  const ActForm f = gemm_form(w);
  const int64_t rows = gemm_rows(w, m);
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

}  // namespace

void quik_gemv(const QuikDevice& w, const float* x, int m, float* y, GemmContext& ctx, int64_t* acc_out) {
  LOWBIT_CHECK(m >= 1 && m <= 8, "quik_gemv: batch ", m, " (1..8 served; above, quik_gemm)");
  gemv_from(w, quantize_activations(w, x, m, m, gemv_form(w), ctx), m, y, ctx, acc_out);
}

void quik_gemm(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out,
               OutlierPass pass) {
  LOWBIT_CHECK(m >= 1 && m <= INT32_MAX && w.n <= INT32_MAX, "quik_gemm: ", m, " x ", w.n, " outputs");
  gemm_from(w, quantize_activations(w, x, m, gemm_rows(w, m), gemm_form(w), ctx), m, y, ctx, acc_out, pass);
}

void quik_matmul(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out) {
  if (m <= 8) return quik_gemv(w, x, static_cast<int>(m), y, ctx, acc_out);
  quik_gemm(w, x, m, y, ctx, acc_out);
}

void quik_matmul_quantized(const QuikDevice& w, const void* acts, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out) {
  LOWBIT_CHECK(acts != nullptr && m >= 1 && m <= INT32_MAX && w.n <= INT32_MAX, "quik_matmul_quantized: ", m, " x ", w.n,
               " outputs");
  const ActScratch s = act_layout(w, act_rows(w, m), form_at(w, m), const_cast<void*>(acts));
  if (m <= 8) return gemv_from(w, s, static_cast<int>(m), y, ctx, acc_out);
  gemm_from(w, s, m, y, ctx, acc_out, OutlierPass::Gemm);
}

}  // namespace lowbit::cuda
