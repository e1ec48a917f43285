// QUIK on the GPU (quik.h): activation quantization, the dp4a GEMV, the cuBLAS int8 GEMM and its epilogue.
//
// Design
//   Activations: one CTA per token row; a block reduction of min / max over the base columns (gathered through
//   base_idx), then the codes by quik_quantize_activations' own fp32 operations (IEEE division, round half to even,
//   clamp), written as int8 with each row padded to kbp with zero codes; the outlier columns' activations rounded to
//   fp16 beside them. The kernels of a later step read these, so the quantization runs once per linear call (fusing it
//   into the kernels that produce x, as QUIK does, is the next step).
//   GEMV (batch 1..8): one warp per output row, lane L taking the 16-code chunks L, L + 32, ... of the row: 16 bytes of
//   8-bit codes, or 8 bytes of 4-bit ones whose even and odd nibbles are sign-extended into two words of int8 (the
//   activations' even and odd bytes gathered to match with byte permutes), then __dp4a into int32 per batch row. The
//   sums are exact (|code| <= 128, kb < 2^17: below 2^31), so any order gives the reference's integers.
//   GEMM (batch > 8): cuBLAS's int8 GEMM (int8 tensor cores, int32 output, "TN": both operands K-contiguous, as the
//   format stores them) over the padded codes; 4-bit codes are widened into the weight scratch per call, so no int8
//   copy of a 4-bit weight is kept. Then one epilogue kernel per output.
//   Epilogue: y = sa sw acc + (H sa + mn) wReduced + Σ_o fp16(x_o) w_out[o] in fp64 from the fp32 / fp16 values, as the
//   reference does, the outlier sum in another order (fp64, so the difference is far below fp32's rounding).
#include "backend_cuda/quik/quik.h"

#include <cfloat>

#include "backend_cuda/common/common.h"
#include "core/error.h"

namespace lowbit::cuda {
namespace {

constexpr int kActThreads = 256;
constexpr int kWarps = 8;   // rows per CTA of the GEMV and of the epilogue

struct RowAct {
  float sa, mn;
};

size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// The activation scratch: codes [m, kbp] int8, then (sa, mn) [m], then fp16 outlier activations [m, no].
struct ActScratch {
  int8_t* xq;
  RowAct* act;
  __half* xo;
};
ActScratch act_layout(const QuikDevice& w, int64_t m, void* base) {
  uint8_t* p = static_cast<uint8_t*>(base);
  ActScratch s;
  s.xq = reinterpret_cast<int8_t*>(p);
  p += align16(static_cast<size_t>(m * w.kbp));
  s.act = reinterpret_cast<RowAct*>(p);
  p += align16(static_cast<size_t>(m) * sizeof(RowAct));
  s.xo = reinterpret_cast<__half*>(p);
  return s;
}

__global__ void __launch_bounds__(kActThreads) quik_act_kernel(QuikDevice w, const float* __restrict__ x, ActScratch s) {
  const int64_t t = blockIdx.x;
  const float* xr = x + t * w.k;
  float mn = FLT_MAX, mx = -FLT_MAX;
  for (int64_t c = threadIdx.x; c < w.kb; c += kActThreads) {
    const float v = xr[w.base_idx[c]];
    mn = fminf(mn, v);
    mx = fmaxf(mx, v);
  }
  __shared__ float smn[kActThreads / 32], smx[kActThreads / 32];
  for (int off = 16; off > 0; off >>= 1) {
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  }
  if ((threadIdx.x & 31) == 0) smn[threadIdx.x >> 5] = mn, smx[threadIdx.x >> 5] = mx;
  __syncthreads();
  mn = smn[0], mx = smx[0];
  for (int i = 1; i < kActThreads / 32; ++i) mn = fminf(mn, smn[i]), mx = fmaxf(mx, smx[i]);
  const int L = (1 << w.abits) - 1, H = 1 << (w.abits - 1);
  float sa = 1.0f, lo = 0.0f;   // no base column: the reference's defaults
  if (w.kb > 0) {
    lo = mn;
    sa = (mx - mn) / static_cast<float>(L);
    if (!(sa > 0.0f)) sa = 1.0f;   // a constant row: every code is -H, which decodes to mn exactly
  }
  int8_t* q = s.xq + t * w.kbp;
  for (int64_t c = threadIdx.x; c < w.kbp; c += kActThreads) {
    int code = 0;
    if (c < w.kb) {
      const float v = rintf(__fdiv_rn(xr[w.base_idx[c]] - lo, sa));
      code = static_cast<int>(fminf(fmaxf(v, 0.0f), static_cast<float>(L))) - H;
    }
    q[c] = static_cast<int8_t>(code);
  }
  for (int64_t o = threadIdx.x; o < w.no; o += kActThreads) s.xo[t * w.no + o] = __float2half_rn(xr[w.outlier_idx[o]]);
  if (threadIdx.x == 0) s.act[t] = {sa, lo};
}

// y for one output from its exact integer sum and the outlier sum (fp64, as quik_gemm_packed_ref).
__device__ __forceinline__ float quik_epilogue(const QuikDevice& w, int64_t r, RowAct a, int32_t acc, double outl) {
  const double sw = __half2float(w.scale[r]);
  const double H = static_cast<double>(1 << (w.abits - 1));
  const double main = static_cast<double>(a.sa) * sw * static_cast<double>(acc) +
                      (H * a.sa + a.mn) * static_cast<double>(w.wreduced[r]);
  return static_cast<float>(main + outl);
}

// Sign-extends the 4-bit codes of a word (8 nibbles: base column 2i low, 2i + 1 high in byte i) into two words of
// int8: even columns, odd columns.
__device__ __forceinline__ void widen4(uint32_t u, int& even, int& odd) {
  even = static_cast<int>(__vsub4((u & 0x0F0F0F0Fu) ^ 0x08080808u, 0x08080808u));
  odd = static_cast<int>(__vsub4(((u >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u, 0x08080808u));
}

template <int M, int WBITS>
__global__ void __launch_bounds__(kWarps * 32) quik_gemv_kernel(QuikDevice w, ActScratch s, float* __restrict__ y,
                                                                int32_t* __restrict__ acc_out) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= w.n) return;   // whole warps
  int acc[M];
#pragma unroll
  for (int b = 0; b < M; ++b) acc[b] = 0;
  const int64_t chunks = w.kbp / 16;
  for (int64_t j = lane; j < chunks; j += 32) {
    if constexpr (WBITS == 8) {
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(w.wq8 + r * w.kbp) + j);
#pragma unroll
      for (int b = 0; b < M; ++b) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(s.xq + b * w.kbp) + j);
        acc[b] = __dp4a(static_cast<int>(xv.x), static_cast<int>(wv.x), acc[b]);
        acc[b] = __dp4a(static_cast<int>(xv.y), static_cast<int>(wv.y), acc[b]);
        acc[b] = __dp4a(static_cast<int>(xv.z), static_cast<int>(wv.z), acc[b]);
        acc[b] = __dp4a(static_cast<int>(xv.w), static_cast<int>(wv.w), acc[b]);
      }
    } else {
      const uint2 wv = __ldg(reinterpret_cast<const uint2*>(w.wq4 + r * (w.kbp / 2)) + j);
      int e0, o0, e1, o1;
      widen4(wv.x, e0, o0);
      widen4(wv.y, e1, o1);
#pragma unroll
      for (int b = 0; b < M; ++b) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(s.xq + b * w.kbp) + j);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.x, xv.y, 0x6420)), e0, acc[b]);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.x, xv.y, 0x7531)), o0, acc[b]);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.z, xv.w, 0x6420)), e1, acc[b]);
        acc[b] = __dp4a(static_cast<int>(__byte_perm(xv.z, xv.w, 0x7531)), o1, acc[b]);
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
      y[b * w.n + r] = quik_epilogue(w, r, s.act[b], acc[b], outl[b]);
      if (acc_out != nullptr) acc_out[b * w.n + r] = acc[b];
    }
}

// The GEMM's epilogue: one thread per output.
__global__ void __launch_bounds__(kWarps * 32) quik_epilogue_kernel(QuikDevice w, ActScratch s, int64_t m,
                                                                    const int32_t* __restrict__ acc, int64_t ldc,
                                                                    float* __restrict__ y, int32_t* __restrict__ acc_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * w.n) return;
  const int64_t t = i / w.n, r = i - t * w.n;
  double outl = 0.0;
  for (int64_t o = 0; o < w.no; ++o)
    outl += static_cast<double>(__half2float(s.xo[t * w.no + o])) * __half2float(w.outlier_w[r * w.no + o]);
  const int32_t a = acc[t * ldc + r];
  y[i] = quik_epilogue(w, r, s.act[t], a, outl);
  if (acc_out != nullptr) acc_out[i] = a;
}

// 4-bit codes [n, kbp / 2] to int8 [n, kbp] (the GEMM's operand), 16 codes per thread.
__global__ void quik_widen4_kernel(QuikDevice w, int8_t* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;   // 16-code chunk
  if (i >= w.n * (w.kbp / 16)) return;
  const uint2 v = reinterpret_cast<const uint2*>(w.wq4)[i];
  int e0, o0, e1, o1;
  widen4(v.x, e0, o0);
  widen4(v.y, e1, o1);
  // Interleave even / odd back into column order.
  uint4 r;
  r.x = __byte_perm(e0, o0, 0x5140);
  r.y = __byte_perm(e0, o0, 0x7362);
  r.z = __byte_perm(e1, o1, 0x5140);
  r.w = __byte_perm(e1, o1, 0x7362);
  reinterpret_cast<uint4*>(out)[i] = r;
}

// x quantized into the context's activation scratch (codes, row parameters, outlier activations).
ActScratch quantize_activations(const QuikDevice& w, const float* x, int64_t m, GemmContext& ctx) {
  LOWBIT_CHECK(w.abits == 4 || w.abits == 8, "quik GPU: abits ", w.abits, " (integer activations 4 or 8 only)");
  const ActScratch s = act_layout(w, m, ctx.act_scratch((quik_act_scratch_bytes(w, m) + 1) / 2));
  quik_act_kernel<<<static_cast<unsigned>(m), kActThreads, 0, ctx.stream()>>>(w, x, s);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  return s;
}

template <int M>
void launch_gemv(const QuikDevice& w, const ActScratch& s, float* y, int32_t* acc_out, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>((w.n + kWarps - 1) / kWarps);
  if (w.wbits == 8) quik_gemv_kernel<M, 8><<<grid, kWarps * 32, 0, st>>>(w, s, y, acc_out);
  else quik_gemv_kernel<M, 4><<<grid, kWarps * 32, 0, st>>>(w, s, y, acc_out);
}

}  // namespace

size_t quik_act_scratch_bytes(const QuikDevice& w, int64_t m) {
  return align16(static_cast<size_t>(m * w.kbp)) + align16(static_cast<size_t>(m) * sizeof(RowAct)) +
         static_cast<size_t>(m * w.no) * sizeof(__half);
}

size_t quik_gemm_scratch_bytes(const QuikDevice& w, int64_t m) {
  return align16(static_cast<size_t>(m * ((w.n + 3) / 4 * 4)) * sizeof(int32_t)) +
         (w.wbits == 4 ? static_cast<size_t>(w.n * w.kbp) : 0);
}

void quik_gemv(const QuikDevice& w, const float* x, int m, float* y, GemmContext& ctx, int32_t* acc_out) {
  LOWBIT_CHECK(m >= 1 && m <= 8, "quik_gemv: batch ", m, " (1..8 served; above, quik_gemm_cublas)");
  const ActScratch s = quantize_activations(w, x, m, ctx);
  switch (m) {
    case 1: launch_gemv<1>(w, s, y, acc_out, ctx.stream()); break;
    case 2: launch_gemv<2>(w, s, y, acc_out, ctx.stream()); break;
    case 3: launch_gemv<3>(w, s, y, acc_out, ctx.stream()); break;
    case 4: launch_gemv<4>(w, s, y, acc_out, ctx.stream()); break;
    case 5: launch_gemv<5>(w, s, y, acc_out, ctx.stream()); break;
    case 6: launch_gemv<6>(w, s, y, acc_out, ctx.stream()); break;
    case 7: launch_gemv<7>(w, s, y, acc_out, ctx.stream()); break;
    default: launch_gemv<8>(w, s, y, acc_out, ctx.stream()); break;
  }
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void quik_gemm_cublas(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int32_t* acc_out) {
  LOWBIT_CHECK(m >= 1 && m <= INT32_MAX && w.n <= INT32_MAX, "quik_gemm_cublas: ", m, " x ", w.n, " outputs");
  const ActScratch s = quantize_activations(w, x, m, ctx);
  uint8_t* ws = reinterpret_cast<uint8_t*>(ctx.weight_scratch((quik_gemm_scratch_bytes(w, m) + 1) / 2));
  // The int32 sums [m, ldc], ldc = n rounded up to 4 (cuBLAS's int8 GEMM wants the leading dimensions so).
  const int64_t ldc = (w.n + 3) / 4 * 4;
  int32_t* acc = reinterpret_cast<int32_t*>(ws);
  const int8_t* wq = w.wq8;
  if (w.wbits == 4) {
    int8_t* wide = reinterpret_cast<int8_t*>(ws + align16(static_cast<size_t>(m * ldc) * sizeof(int32_t)));
    const int64_t chunks = w.n * (w.kbp / 16);
    if (chunks > 0) quik_widen4_kernel<<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, ctx.stream()>>>(w, wide);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    wq = wide;
  }
  if (w.kbp == 0) {
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(m * ldc) * sizeof(int32_t), ctx.stream()));
  } else {
    // acc [m, n] (column-major [n, m]) = W [n, kbp] · xq [m, kbp]ᵀ: "TN", both K-contiguous.
    const int32_t one = 1, zero = 0;
    cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n), static_cast<int>(m),
                              static_cast<int>(w.kbp), &one, wq, CUDA_R_8I, static_cast<int>(w.kbp), s.xq, CUDA_R_8I,
                              static_cast<int>(w.kbp), &zero, acc, CUDA_R_32I, static_cast<int>(ldc), CUBLAS_COMPUTE_32I,
                              CUBLAS_GEMM_DEFAULT),
                 "quik int8 GEMM");
  }
  const int64_t total = m * w.n;
  quik_epilogue_kernel<<<static_cast<unsigned>((total + kWarps * 32 - 1) / (kWarps * 32)), kWarps * 32, 0, ctx.stream()>>>(
      w, s, m, acc, ldc, y, acc_out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void quik_matmul(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int32_t* acc_out) {
  if (m <= 8) return quik_gemv(w, x, static_cast<int>(m), y, ctx, acc_out);
  quik_gemm_cublas(w, x, m, y, ctx, acc_out);
}

}  // namespace lowbit::cuda
