// Kernel launches with programmatic dependent launch (PDL, sm_90+): a kernel of the decode chain may be launched
// while the kernel before it is still running, so the launch latency and the prologue that reads only weights
// (plane words, LUTs) overlap the previous kernel's tail instead of following it.
//
// Contract for every kernel launched through launch_pdl():
//   - it calls pdl_wait() before its first read of anything an earlier kernel wrote (activations, the KV cache,
//     scratch) and before its first global write (an earlier kernel may still read what it overwrites); the one
//     exception is what was written before the last copy, event or plain launch in the stream, which serialise
//     fully: decode attention reads the earlier steps' keys, and RoPE the positions, before their wait (gpu_ops.cu);
//   - every thread block reaches pdl_wait() before it exits (early returns come after it), so the grid cannot
//     complete before the grid it depends on: completion stays transitive along the chain, and a kernel two steps
//     downstream may read what this one's predecessor wrote;
//   - it may call pdl_launch_dependents() early: the next kernel's blocks are then scheduled once every block of
//     this grid has called it (or exited), i.e. once this grid's last wave is resident, and they wait in pdl_wait().
// Kernels launched with <<<>>> (and cuBLAS, copies, events) keep full stream serialisation; pdl_wait() in them
// returns at once. On GPUs below sm_90, or with LOWBIT_PDL=0 in the environment, launch_pdl() is a plain launch.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backend_cuda/common/common.h"

namespace lowbit::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// pdl_enabled() / set_pdl(): cuda/common.h.

// cluster: thread-block clusters of that shape (sm_90; 1 x 1 x 1 = none).
template <typename... Params, typename... Args>
void launch_pdl(PdlClass cls, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, dim3 cluster,
                Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled(cls)) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n++].val.clusterDim.z = cluster.z;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  LOWBIT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_pdl(PdlClass cls, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_pdl(cls, kernel, grid, block, smem, s, dim3(1, 1, 1), std::forward<Args>(args)...);
}

}  // namespace lowbit::cuda
