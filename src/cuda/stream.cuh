// Helpers of the streamed (persistent, cp.async-fed) GEMV kernels: shared-memory vector loads at 32-bit shared-window
// addresses, cp.async copies and their groups, and the resident-CTA count that sizes a persistent grid.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "cuda/common.h"

namespace lowbit::cuda {

__device__ __forceinline__ void lds_u32x2(uint32_t addr, uint32_t (&v)[2]) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "r"(addr));
}
__device__ __forceinline__ void lds_u32x4(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr));
}

// bytes: 16, 8 or 4 (a compile-time constant at every call); ok = false writes zeros instead of reading src.
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, int bytes, bool ok = true) {
  if (bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
  else if (bytes == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(ok ? 8 : 0) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// CTAs of a persistent kernel resident per SM (its one wave), per instantiation (cached; sets the kernel's dynamic
// shared-memory limit first when it needs more than 48 KB).
template <typename Kernel>
int stream_blocks_per_sm(Kernel kern, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<const void*, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(reinterpret_cast<const void*>(kern));
  if (it != cache.end()) return it->second;
  if (smem > 48 * 1024)
    LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int blocks = 0;
  LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, threads, smem));
  LOWBIT_CHECK(blocks >= 1, "a persistent GEMV kernel does not fit an SM");
  cache[reinterpret_cast<const void*>(kern)] = blocks;
  return blocks;
}

}  // namespace lowbit::cuda
