// SwiGLU's element-wise step, one expression for every kernel that computes it (gpu_ops.cu's swiglu_kernel and the int8
// GEMV's SwiGLU epilogue), so that both give the same bits.
#pragma once
#include <cuda_runtime.h>

namespace lowbit::cuda {

__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

}  // namespace lowbit::cuda
