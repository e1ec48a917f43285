// max |x| over one row of an activation kernel's batch column, every block of the kernel reducing the whole row
// itself (so the blocks of a column agree without a second kernel): the int8 activation kernels of the any-precision
// int8 GEMV (anyprec_gemv_i8.cu) and the 2/4/16 integer-dot GEMV (mixed24a_gemv.cu), when the kernel that produced x did
// not hand its rows' maxima over (their xmax argument).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/anyprec/int8_tables.h"

namespace lowbit::cuda {

// The block's max |xr[0 .. k)| (i8_absmax_step: NaN propagates), returned to every thread; kThreads threads, all of
// the block calling it. vec: xr is 16-byte aligned and k % 4 == 0 (8 float4 loads in flight per thread: a loop waiting
// on one load per iteration took k / 1024 round trips). live = false: the row is not read, the result is 0.
template <int kThreads>
__device__ __forceinline__ float block_row_absmax(const float* __restrict__ xr, int64_t k, bool vec, bool live) {
  __shared__ float red[kThreads / 32];
  float mx = 0.0f;
  if (live) {
    const int64_t n4 = vec ? k / 4 : 0;
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t base = threadIdx.x; base < n4; base += 8 * kThreads) {
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t i = base + u * kThreads;
        v[u] = i < n4 ? __ldg(x4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) mx = i8_absmax_step(i8_absmax_step(i8_absmax_step(i8_absmax_step(mx, v[u].x), v[u].y), v[u].z), v[u].w);
    }
    if (!vec)
      for (int64_t i = threadIdx.x; i < k; i += kThreads) mx = i8_absmax_step(mx, __ldg(xr + i));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = i8_absmax_step(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = 0.0f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) mx = i8_absmax_step(mx, red[i]);
  return mx;
}

}  // namespace lowbit::cuda
