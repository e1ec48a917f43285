// Block reductions of the row kernels: the RMSNorm's 1 / rms, one arithmetic for every kernel that normalises a row
// (gpu_ops.cu's rmsnorm, the QUIK RMSNorm that quantizes on the way out), so that they give the same bits.
#pragma once
#include <cuda_runtime.h>

namespace lowbit::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// 1 / rms of a row from each thread's partial sum of squares: summed over the block (<= 32 warps), then
// rsqrt(sum / dim + eps), the same value returned to every thread.
__device__ __forceinline__ float block_rms_inv(float ss, int dim, float eps) {
  __shared__ float part[32];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
    t = warp_sum(t);
    if (threadIdx.x == 0) part[0] = rsqrtf(t / static_cast<float>(dim) + eps);
  }
  __syncthreads();
  return part[0];
}

}  // namespace lowbit::cuda
