// Uniform (RTN / GPTQ) GEMV and dequantize kernels (uniform.h).
//
// Design
//   Memory bound at batch 1..8: the kernel reads each packed byte once.
//   Chunked form: two rows per warp, 8 warps per CTA; lane L takes the 32-column chunks L, L + 32, ... of both rows,
//   so each x element it loads (through the read-only cache: every warp of the GPU reads the same x) serves two rows.
//   A chunk's 32 codes are exactly `bits` consecutive 32-bit words of the row's stream (32 x bits bits), so a warp's
//   step reads 32 x bits x 4 contiguous bytes per row (16-byte loads at 4 and 8 bits, 8-byte at 2), and the codes come
//   out of registers with compile-time shifts (a code that straddles two words takes one funnel of the pair). A code
//   becomes a float by OR-ing it into the mantissa of 2^23 (exact; no int-to-float conversion, a quarter-rate
//   instruction), and (2^23 + q) - (2^23 + z) is exactly float(q) - z. Without g_idx a chunk lies in one group (group
//   size a multiple of 32): the lane sums (q - z) x over the chunk and multiplies by the scale once; with g_idx
//   (act-order) each weight is (q - z) * scale, the format's definition, its group looked up per column (a row's
//   scales are a few cache lines).
//   Per-column form (k not a multiple of 32, or groups that are not): lane L takes columns L, L + 32, ..., each code
//   read from the one or two words holding it.
//   Each lane's partial sums are reduced across the warp with shuffles, in the same order for every batch row.
#include "backend_cuda/uniform/uniform.h"

#include "backend_cuda/common/common.h"
#include "core/error.h"

namespace lowbit::cuda {
namespace {

constexpr int kWarps = 8;   // warps per CTA

__device__ __forceinline__ float group_scale(const UniformDevice& w, int64_t r, int64_t g) {
  return __half2float(w.scales[r * w.G + g]);
}
__device__ __forceinline__ float group_zero(const UniformDevice& w, int64_t r, int64_t g) {
  return w.zeros != nullptr ? static_cast<float>(w.zeros[r * w.G + g]) : static_cast<float>(1 << (w.bits - 1));
}

// Code c of a row's bit stream (any bits 2..8; reads the second word only when the code straddles it).
__device__ __forceinline__ uint32_t code_at(const uint32_t* row, int64_t c, int bits) {
  const int64_t o = c * bits;
  const int64_t wi = o >> 5;
  const int s = static_cast<int>(o & 31);
  uint32_t v = __ldg(row + wi) >> s;
  if (s + bits > 32) v |= __ldg(row + wi + 1) << (32 - s);
  return v & ((1u << bits) - 1u);
}

template <int BITS>
__device__ __forceinline__ void load_chunk(const uint32_t* p, uint32_t (&v)[BITS]) {
  if constexpr (BITS == 4) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else if constexpr (BITS == 8) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else if constexpr (BITS == 2) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < BITS; ++i) v[i] = __ldg(p + i);
  }
}

// Code i (0..31) of a chunk held in BITS words: shifts known at compile time once the loop is unrolled.
template <int BITS>
__device__ __forceinline__ uint32_t chunk_code(const uint32_t (&v)[BITS], int i) {
  const int o = i * BITS, wi = o >> 5, s = o & 31;
  uint32_t c = v[wi] >> s;
  if (s + BITS > 32) c |= v[wi + 1] << (32 - s);
  return c & ((1u << BITS) - 1u);
}

template <int M>
__device__ __forceinline__ void reduce_and_store(float (&acc)[M], int64_t r, int64_t n, float* __restrict__ y) {
#pragma unroll
  for (int b = 0; b < M; ++b)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[b] += __shfl_xor_sync(0xffffffffu, acc[b], off);
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int b = 0; b < M; ++b) y[b * n + r] = acc[b];
}

// 2^23 + q as a float from the code's bits (q < 2^8): one OR in place of an int-to-float conversion, which runs at a
// quarter of the FP32 rate. (2^23 + q) - (2^23 + z) is then exactly float(q) - z.
constexpr uint32_t kMagic = 0x4B000000u;   // 2^23
constexpr float kMagicF = 8388608.0f;

// kRows rows per warp: each x element loaded is used for kRows rows (the x reads, not the weights, would otherwise
// be most of the traffic from L1 at batch 1: 4 bytes of x per weight of half a byte).
constexpr int kRows = 2;

template <int BITS, int M, bool GIDX>
__global__ void __launch_bounds__(kWarps * 32) uniform_gemv_chunked_kernel(UniformDevice w, const float* __restrict__ x,
                                                                           float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kRows;
  if (r0 >= w.n) return;   // whole warps
  const int rows = w.n - r0 < kRows ? static_cast<int>(w.n - r0) : kRows;
  const int64_t chunks = w.k >> 5;
  float acc[kRows][M];
#pragma unroll
  for (int q = 0; q < kRows; ++q)
#pragma unroll
    for (int b = 0; b < M; ++b) acc[q][b] = 0.0f;
  for (int64_t j = lane; j < chunks; j += 32) {
    const int64_t c0 = j << 5;
    uint32_t v[kRows][BITS];
    float scale[kRows], zero[kRows];   // zero: 2^23 + z
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      const int64_t r = q < rows ? r0 + q : r0;   // a missing last row repeats the first (never stored)
      load_chunk<BITS>(w.qweight + r * w.words + j * BITS, v[q]);
      if constexpr (!GIDX) {
        const int64_t g = c0 / w.gs;
        scale[q] = group_scale(w, r, g);
        zero[q] = kMagicF + group_zero(w, r, g);
      }
    }
    // Without g_idx the chunk is one group: sum (q - z) x over it, then one multiply by the scale.
    float part[kRows][M];
#pragma unroll
    for (int q = 0; q < kRows; ++q)
#pragma unroll
      for (int b = 0; b < M; ++b) part[q][b] = 0.0f;
#pragma unroll
    for (int q4 = 0; q4 < 8; ++q4) {   // 4 columns at a time: one 16-byte load of x per batch row
      float wv[kRows][4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int i = q4 * 4 + t;
        int64_t g = 0;
        if constexpr (GIDX) g = __ldg(w.g_idx + c0 + i);
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          const float qf = __uint_as_float(kMagic | chunk_code<BITS>(v[q], i));
          if constexpr (GIDX) {
            const int64_t r = q < rows ? r0 + q : r0;
            wv[q][t] = (qf - (kMagicF + group_zero(w, r, g))) * group_scale(w, r, g);   // the format's value, exactly
          } else {
            wv[q][t] = qf - zero[q];
          }
        }
      }
#pragma unroll
      for (int b = 0; b < M; ++b) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(x + b * w.k + c0) + q4);
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          float& a = GIDX ? acc[q][b] : part[q][b];
          a = fmaf(wv[q][0], xv.x, a);
          a = fmaf(wv[q][1], xv.y, a);
          a = fmaf(wv[q][2], xv.z, a);
          a = fmaf(wv[q][3], xv.w, a);
        }
      }
    }
    if constexpr (!GIDX)
#pragma unroll
      for (int q = 0; q < kRows; ++q)
#pragma unroll
        for (int b = 0; b < M; ++b) acc[q][b] = fmaf(scale[q], part[q][b], acc[q][b]);
  }
#pragma unroll
  for (int q = 0; q < kRows; ++q)
    if (q < rows) reduce_and_store<M>(acc[q], r0 + q, w.n, y);
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32) uniform_gemv_columns_kernel(UniformDevice w, const float* __restrict__ x,
                                                                           float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= w.n) return;
  const uint32_t* row = w.qweight + r * w.words;
  float acc[M];
#pragma unroll
  for (int b = 0; b < M; ++b) acc[b] = 0.0f;
  for (int64_t c = lane; c < w.k; c += 32) {
    const int64_t g = w.g_idx != nullptr ? static_cast<int64_t>(__ldg(w.g_idx + c)) : c / w.gs;
    const float wv = (static_cast<float>(code_at(row, c, w.bits)) - group_zero(w, r, g)) * group_scale(w, r, g);
#pragma unroll
    for (int b = 0; b < M; ++b) acc[b] = fmaf(wv, __ldg(x + b * w.k + c), acc[b]);
  }
  reduce_and_store<M>(acc, r, w.n, y);
}

__global__ void uniform_dequant_kernel(UniformDevice w, __half* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= w.n * w.k) return;
  const int64_t r = i / w.k, c = i - r * w.k;
  const int64_t g = w.g_idx != nullptr ? static_cast<int64_t>(w.g_idx[c]) : c / w.gs;
  const float v = (static_cast<float>(code_at(w.qweight + r * w.words, c, w.bits)) - group_zero(w, r, g)) *
                  group_scale(w, r, g);
  out[i] = __float2half_rn(v);
}

template <int BITS, int M>
void launch_chunked(const UniformDevice& w, const float* x, float* y, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((w.n + kWarps * kRows - 1) / (kWarps * kRows)));
  if (w.g_idx != nullptr) uniform_gemv_chunked_kernel<BITS, M, true><<<grid, kWarps * 32, 0, s>>>(w, x, y);
  else uniform_gemv_chunked_kernel<BITS, M, false><<<grid, kWarps * 32, 0, s>>>(w, x, y);
}

template <int M>
void launch_m(const UniformDevice& w, const float* x, float* y, cudaStream_t s) {
  if (!uniform_gemv_chunked(w)) {
    uniform_gemv_columns_kernel<M><<<static_cast<unsigned>((w.n + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(w, x, y);
    return;
  }
  switch (w.bits) {
    case 2: return launch_chunked<2, M>(w, x, y, s);
    case 3: return launch_chunked<3, M>(w, x, y, s);
    case 4: return launch_chunked<4, M>(w, x, y, s);
    case 5: return launch_chunked<5, M>(w, x, y, s);
    case 6: return launch_chunked<6, M>(w, x, y, s);
    case 7: return launch_chunked<7, M>(w, x, y, s);
    case 8: return launch_chunked<8, M>(w, x, y, s);
    default: fail("uniform_gemv: ", w.bits, " bits (2..8 served)");
  }
}

}  // namespace

bool uniform_gemv_chunked(const UniformDevice& w) {
  return w.k % 32 == 0 && (w.g_idx != nullptr || w.gs % 32 == 0);
}

void uniform_gemv(const UniformDevice& w, const float* x, int m, float* y, cudaStream_t s) {
  LOWBIT_CHECK(m >= 1 && m <= 8, "uniform_gemv: batch ", m, " (1..8 served; above, dequantize + cuBLAS)");
  LOWBIT_CHECK(!uniform_gemv_chunked(w) || reinterpret_cast<uintptr_t>(x) % 16 == 0,
               "uniform_gemv: x must be 16-byte aligned");
  switch (m) {
    case 1: launch_m<1>(w, x, y, s); break;
    case 2: launch_m<2>(w, x, y, s); break;
    case 3: launch_m<3>(w, x, y, s); break;
    case 4: launch_m<4>(w, x, y, s); break;
    case 5: launch_m<5>(w, x, y, s); break;
    case 6: launch_m<6>(w, x, y, s); break;
    case 7: launch_m<7>(w, x, y, s); break;
    default: launch_m<8>(w, x, y, s); break;
  }
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void uniform_dequant_f16(const UniformDevice& w, __half* out, cudaStream_t s) {
  const int64_t total = w.n * w.k;
  uniform_dequant_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, s>>>(w, out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
