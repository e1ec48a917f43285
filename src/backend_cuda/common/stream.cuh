// Helpers of the streamed (persistent, cp.async-fed) GEMV kernels: shared-memory loads at 32-bit shared-window
// addresses, cp.async copies and their groups, a warp's ring of stages over its work items, and the persistent grid.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "backend_cuda/common/common.h"
#include "backend_cuda/common/launch.cuh"

namespace lowbit::cuda {

__device__ __forceinline__ uint32_t lds_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
// One fp32 from shared memory at a 32-bit shared-window byte address: a table lookup's address is then one IMAD/LEA
// (code * entry stride + the row's base), not a generic-pointer computation per lookup.
__device__ __forceinline__ float lds_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds_u8(uint32_t addr) {
  unsigned short v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float lds_half(uint32_t addr) { return __half2float(__ushort_as_half(static_cast<unsigned short>(lds_u16(addr)))); }
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

// CTAs of a persistent kernel resident per SM (its one wave), per kernel, block size and dynamic shared memory (cached;
// raises the kernel's dynamic shared-memory limit to smem when smem and its static shared memory, e.g. the tensor-core
// epilogue's scratch, pass the default 48 KB together and smem is above what the kernel was allowed before: a kernel
// launched with several sizes, such as the 2/4/16 dequantize's row of k halves, keeps the largest).
template <typename Kernel>
int stream_blocks_per_sm(Kernel kern, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int> cache;
  static std::map<const void*, size_t> allowed;   // the dynamic shared memory each kernel was allowed so far
  std::lock_guard<std::mutex> lock(mu);
  const void* f = reinterpret_cast<const void*>(kern);
  auto it = cache.find({f, threads, smem});
  if (it != cache.end()) return it->second;
  cudaFuncAttributes attr{};
  LOWBIT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kern));
  size_t& lim = allowed[f];
  if (smem + attr.sharedSizeBytes > 48 * 1024 && smem > lim) {
    LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    lim = smem;
  }
  int blocks = 0;
  LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, threads, smem));
  LOWBIT_CHECK(blocks >= 1, "a persistent kernel of ", threads, " threads and ", smem, " bytes of shared memory does not fit an SM");
  cache[{f, threads, smem}] = blocks;
  return blocks;
}

// The grid of a persistent kernel over `tiles` tiles: at most ceil(tiles / SMs) CTAs per SM, the same number on every
// SM, so that no SM holds more CTAs than the work spreads to (measured neutral against as many CTAs as fit: the streamed
// register-table GEMV on 8192x28672 58.6 against 58.7 us). CTAs past the last tile exit after their prologue.
template <typename Kernel>
unsigned persistent_grid(Kernel kern, int threads, size_t smem, int64_t tiles) {
  static const int sms = device_sm_count();
  const int64_t per_sm = std::min<int64_t>(stream_blocks_per_sm(kern, threads, smem), (tiles + sms - 1) / sms);
  return static_cast<unsigned>(per_sm * sms);
}

// A warp's ring of kStages shared-memory stages (stage_bytes each from base) over its work items: for tiles
// blockIdx.x, + gridDim.x, ... < tiles, items warp, + kWarps, ... < items. The issue cursor (it_tile, it_item, its
// stage) runs kStages - 1 items ahead of the item being computed, across tile boundaries. The kernel's copy functions
// read the cursor: weights() the item's weights, x() its activations; they are called only while items remain.
template <int kStages, int kWarps>
struct StreamRing {
  // The cursor in 32 bits (tiles = n / 16 and items = groups per tile are far below 2^31; the 64-bit form cost the
  // int8 GEMV ~20 of its ~90 bookkeeping instructions per item).
  uint32_t base, stage_bytes;
  int32_t tiles, items;
  int warp;
  int32_t it_tile, it_item;
  int it_stage = 0, stage = 0;
  // pair > 0: the tiles come in pairs (u, u + pair) for units u = blockIdx.x, + gridDim.x, ... < pair (the int8 GEMV's
  // SwiGLU epilogue: a gate tile, then its up tile); it_half: which of the pair the cursor is on.
  int32_t pair = 0;
  int it_half = 0;
  __device__ __forceinline__ bool live() const { return pair > 0 ? it_tile - it_half * pair < pair : it_tile < tiles; }
  __device__ __forceinline__ StreamRing(uint32_t base_, uint32_t stage_bytes_, int64_t tiles_, int64_t items_, int warp_)
      : base(base_), stage_bytes(stage_bytes_), tiles(static_cast<int32_t>(tiles_)), items(static_cast<int32_t>(items_)), warp(warp_),
        it_tile(static_cast<int32_t>(blockIdx.x)), it_item(warp_) {}
  __device__ __forceinline__ uint32_t issue_stage() const { return base + it_stage * stage_bytes; }
  __device__ __forceinline__ void advance() {
    it_item += kWarps;
    if (it_item >= items) {
      it_item = warp;
      if (pair > 0 && it_half == 0) {
        it_tile += pair;
        it_half = 1;
      } else {
        it_tile += static_cast<int32_t>(gridDim.x) - it_half * pair;
        it_half = 0;
      }
    }
    it_stage = it_stage + 1 == kStages ? 0 : it_stage + 1;
  }
  // The first kStages - 1 items: their weights before the previous kernel's end (pdl_wait), their activations after
  // it, one cp.async group per item.
  template <typename Weights, typename X>
  __device__ __forceinline__ void prologue(Weights weights, X x) {
    const int32_t t0 = it_tile, i0 = it_item;
    const int h0 = it_half;
    for (int p = 0; p + 1 < kStages; ++p) { if (live()) weights(); advance(); }
    pdl_wait();
    it_tile = t0; it_item = i0; it_half = h0; it_stage = 0;
    for (int p = 0; p + 1 < kStages; ++p) { if (live()) x(); cp_async_commit(); advance(); }
  }
  // Before computing the next item: the copies of the item kStages - 1 ahead go out, the next item's have arrived
  // (all lanes' copies visible to the warp); returns its stage's address.
  template <typename Weights, typename X>
  __device__ __forceinline__ uint32_t next(Weights weights, X x) {
    __syncwarp();   // every lane is done with the stage the next copies overwrite
    if (live()) { weights(); x(); }
    cp_async_commit();
    advance();
    cp_async_wait<kStages - 1>();
    __syncwarp();   // the other lanes' copies are visible
    const uint32_t st = base + stage * stage_bytes;
    stage = stage + 1 == kStages ? 0 : stage + 1;
    return st;
  }
};

}  // namespace lowbit::cuda
