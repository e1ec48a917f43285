// Hopper (sm_90a) building blocks of the wgmma GEMM (anyprec_wgmma_ws.cu): shared-memory matrix descriptors for the
// K-major 128-byte-swizzled layout, the wgmma fences / commit / wait, the generic-to-async proxy fence, mbarriers, the
// TMA 2-D tile load, the wgmma forms with both operands in shared memory.
// Only the sm_90a-only sources include this; their kernels guard every use with __CUDA_ARCH_FEAT_SM90_ALL.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda {

// The 128-byte swizzle's atom: 8 rows of 128 bytes (64 fp16 of K), chunk c of row r stored in slot c ^ r.
constexpr int kAtomBytes = 1024;

// Byte offset of 16-byte chunk c (0..7) of row r in a K-major 128-byte-swizzled tile of 64 columns whose rows are
// consecutive (atoms of 8 rows at 1 KB strides): what TMA's 128-byte swizzle writes and wgmma reads.
__host__ __device__ constexpr uint32_t sw128_offset(int r, int c) {
  return static_cast<uint32_t>((r / 8) * kAtomBytes + (r % 8) * 128 + ((c ^ (r % 8)) * 16));
}

// Shared-memory matrix descriptor, K-major, 128-byte swizzle: start address, the stride between 8-row groups
// (1 KB), leading byte offset unused (1), layout type 1 in bits 62..63. A k16 step inside the atom adds 32 bytes to
// the start address.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (static_cast<uint64_t>(kAtomBytes >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// mbarriers at 32-bit shared-window addresses.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// The inits visible to the other threads and to the async proxy (TMA's complete_tx) before first use.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// One arrival that also expects `bytes` of asynchronous copies (TMA) to complete on this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Blocks until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// TMA: the box of `map` at coordinates (c0 innermost, c1) into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The accumulator operands d[b] .. d[b + 7] of the wgmma asm statements below.
#define LOWBIT_ACC8(b) \
  "+f"(d[(b)]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]), "+f"(d[(b) + 5]), "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
// D [64 x N] += A [64 x 16] · B [16 x N], both fp16 in shared memory (K-major descriptors), fp32 accumulation.
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b);
template <>
__device__ __forceinline__ void wgmma_ss<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, 1, 1, 1, 0, 0;\n"
      : LOWBIT_ACC8(0), LOWBIT_ACC8(8), LOWBIT_ACC8(16), LOWBIT_ACC8(24), LOWBIT_ACC8(32), LOWBIT_ACC8(40),
        LOWBIT_ACC8(48), LOWBIT_ACC8(56)
      : "l"(desc_a), "l"(desc_b));
}
template <>
__device__ __forceinline__ void wgmma_ss<256>(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, 1, 1, 1, 0, 0;\n"
      : LOWBIT_ACC8(0), LOWBIT_ACC8(8), LOWBIT_ACC8(16), LOWBIT_ACC8(24), LOWBIT_ACC8(32), LOWBIT_ACC8(40),
        LOWBIT_ACC8(48), LOWBIT_ACC8(56), LOWBIT_ACC8(64), LOWBIT_ACC8(72), LOWBIT_ACC8(80), LOWBIT_ACC8(88),
        LOWBIT_ACC8(96), LOWBIT_ACC8(104), LOWBIT_ACC8(112), LOWBIT_ACC8(120)
      : "l"(desc_a), "l"(desc_b));
}
#undef LOWBIT_ACC8

}  // namespace lowbit::cuda
