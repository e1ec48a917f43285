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

// The row's float4s q = threadIdx.x + i blockDim.x (q < n4) into v, with the residual dr added and written back to xr
// when dr != nullptr; returns this thread's sum of squares (the fmaf chain every RMSNorm kernel uses).
template <int kVec>
__device__ __forceinline__ float load_residual_row(float4* xr, const float4* dr, int n4, float4 (&v)[kVec]) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int q = static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x);
    if (q < n4) {
      v[i] = xr[q];
      if (dr != nullptr) {
        const float4 d = dr[q];
        v[i].x += d.x, v[i].y += d.y, v[i].z += d.z, v[i].w += d.w;
        xr[q] = v[i];
      }
      ss = fmaf(v[i].x, v[i].x, fmaf(v[i].y, v[i].y, fmaf(v[i].z, v[i].z, fmaf(v[i].w, v[i].w, ss))));
    }
  }
  return ss;
}

// Four normalised values: g (v inv), in that order.
__device__ __forceinline__ float4 rms_scale(float4 v, float4 g, float inv) {
  return make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
}

}  // namespace lowbit::cuda
