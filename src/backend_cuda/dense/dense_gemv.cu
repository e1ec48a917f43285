// The fp16 dense GEMV for batch 1..8 (decode): y [m, n] fp32 = x [m, k] · Wᵀ with W [n, k] fp16 row-major, x fp32
// or fp16, fp32 accumulation on the CUDA cores, the bias added in the epilogue. Why not cuBLAS: at batch 1 cuBLAS
// reads the 4096-wide Llama-7B matrices at 0.58-0.75 of the copy bandwidth (TARGETS.md: 4096x4096 13.6 us), its
// fp16-only inputs cost a conversion kernel per linear, and it cannot take programmatic dependent launch, so every
// decode linear waits for the kernel before it to drain. This kernel loads its first weights before pdl_wait().
// Its CPU twin is the fp64 product of the same fp16 weights (tests/test_cuda_kernels.cpp).
#include <cstdint>

#include "core/knobs.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/dense/dense.h"

namespace lowbit::cuda {
namespace {

constexpr int kDenseWarps = 8;    // warps per CTA
constexpr int kDenseLoads = 8;    // 16-byte weight loads in flight per lane (U chunks x R rows)

__device__ __forceinline__ void load_x8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void load_x8(const __half* p, float (&v)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __half22float2(h[e]);
    v[2 * e] = f.x, v[2 * e + 1] = f.y;
  }
}

// Warp w of CTA b owns rows (b * kDenseWarps + w) * R .. + R - 1; lane l reads the 16-byte chunks l, l + 32, ... of
// each (8 weights each), U = kDenseLoads / R chunks per row in flight, x chunks shared by the R rows. Rows past n
// read row n - 1 and write nothing. The first loads are weights only and are issued before pdl_wait().
template <int M, int R, typename XT>
__global__ void __launch_bounds__(kDenseWarps * 32) dense_gemv_kernel(const __half* __restrict__ w, int n, int k,
                                                                    const XT* __restrict__ x,
                                                                    const float* __restrict__ bias,
                                                                    float* __restrict__ y) {
  constexpr int U = kDenseLoads / R;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int row0 = (static_cast<int>(blockIdx.x) * kDenseWarps + static_cast<int>(threadIdx.x / 32)) * R;
  const int k8 = k / 8;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(min(row0 + r, n - 1)) * k8;
  uint4 wv[U][R];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = c < k8 ? __ldcs(wr[r] + c) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int mm = 0; mm < M; ++mm) acc[r][mm] = 0.0f;
  load(0);
  pdl_wait();
  for (int c0 = 0; c0 < k8; c0 += 32 * U) {
    if (c0 > 0) load(c0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u + lane;
      if (c >= k8) break;
#pragma unroll
      for (int mm = 0; mm < M; ++mm) {
        float xv[8];
        load_x8(x + static_cast<int64_t>(mm) * k + 8 * c, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const __half2* h = reinterpret_cast<const __half2*>(&wv[u][r]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(h[e]);
            acc[r][mm] = fmaf(f.x, xv[2 * e], acc[r][mm]);
            acc[r][mm] = fmaf(f.y, xv[2 * e + 1], acc[r][mm]);
          }
        }
      }
    }
  }
  // The next kernel of the chain is scheduled once every CTA is past its loads (the last wave's tail), not at the
  // start: its CTAs would sit resident in pdl_wait() through this kernel's waves.
  pdl_launch_dependents();
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int mm = 0; mm < M; ++mm)
#pragma unroll
      for (int o = 16; o > 0; o /= 2) acc[r][mm] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][mm], o);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = row0 + r;
      if (row >= n) break;
      const float b = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
      for (int mm = 0; mm < M; ++mm) y[static_cast<int64_t>(mm) * n + row] = acc[r][mm] + b;
    }
  }
}

template <int M, typename XT>
void launch_rows(int R, const __half* w, int64_t n, int64_t k, const XT* x, const float* bias, float* y, cudaStream_t s) {
  const dim3 block(kDenseWarps * 32);
  const int n32 = static_cast<int>(n), k32 = static_cast<int>(k);
  const bool known = dispatch_int<1, 2, 4>(R, [&](auto rows) {
    constexpr int RR = decltype(rows)::value;
    const dim3 grid(static_cast<unsigned>((n + kDenseWarps * RR - 1) / (kDenseWarps * RR)));
    launch_pdl(kPdlDense, dense_gemv_kernel<M, RR, XT>, grid, block, 0, s, w, n32, k32, x, bias, y);
  });
  if (!known) fail("dense_f16_gemv: rows per warp must be 1, 2 or 4 (got ", R, ")");
}

template <typename XT>
void dense_gemv_dispatch(const __half* w, int64_t n, int64_t k, const XT* x, int m, const float* bias, float* y,
                         cudaStream_t s, int rows_per_warp) {
  LOWBIT_CHECK(dense_gemv_fits(w, n, k, m, x), "dense_f16_gemv: cannot run ", n, "x", k, " at batch ", m,
               " (needs batch 1..", kMaxGemvBatch, ", k a positive multiple of 8, 16-byte aligned W and x)");
  const int R = rows_per_warp > 0 ? rows_per_warp : dense_gemv_rows_per_warp(n, m);
  dispatch_int<1, 2, 3, 4, 5, 6, 7, 8>(m, [&](auto mm) { launch_rows<decltype(mm)::value>(R, w, n, k, x, bias, y, s); });
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool dense_gemv_fits(const __half* w, int64_t n, int64_t k, int64_t m, const void* x) {
  return m >= 1 && m <= kMaxGemvBatch && n >= 1 && n <= INT32_MAX && k >= 8 && k % 8 == 0 && k <= INT32_MAX &&
         aligned16(w) && aligned16(x);
}

// Rows per warp when the caller leaves it to us (rows_per_warp = 0). H200, `lowbit bench --kernels --formats fp16`
// (docs/PERF.md): 4 rows per warp is the fastest form at every batch 1..8 on all nine Llama shapes, e.g. 12288x4096
// batch 1 26.8 us against 33.0 (1 row) and 34.2 (2 rows). 16 loads in flight per lane, or two batches of 8, measured
// slower or even.
int dense_gemv_rows_per_warp(int64_t n, int m) {
  (void)n;
  (void)m;
  return 4;
}

// Where it runs instead of cuBLAS (batch 1..2, measured against cuBLAS as the runtime calls it): kernel_choice.cpp.
// From batch 4 cuBLAS's tensor cores win (22016x4096 batch 4 52.7 against 50.0 us, batch 8 90.8 against 50.1): this
// kernel reloads x per 8 weights and batch column.
// The switch kernel_choice.h reads: the knob itself, so an override is seen by the choice.
bool dense_gemv_enabled() { return knob_bool(Knob::DenseGemv); }
void set_dense_gemv(bool on) { set_knob(Knob::DenseGemv, on); }

void dense_f16_gemv(const __half* w, int64_t n, int64_t k, const float* x, int m, const float* bias, float* y,
                    cudaStream_t s, int rows_per_warp) {
  dense_gemv_dispatch(w, n, k, x, m, bias, y, s, rows_per_warp);
}

void dense_f16_gemv(const __half* w, int64_t n, int64_t k, const __half* x, int m, const float* bias, float* y,
                    cudaStream_t s, int rows_per_warp) {
  dense_gemv_dispatch(w, n, k, x, m, bias, y, s, rows_per_warp);
}

}  // namespace lowbit::cuda
