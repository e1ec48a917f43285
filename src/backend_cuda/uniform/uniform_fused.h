// The uniform (RTN / GPTQ) GEMM above batch 8 on Hopper (uniform_fused.cu): the packed codes are read as stored and
// widened to fp16 in registers by CUTLASS's mixed-input mainloop (TMA + warp-specialized wgmma, A from registers),
// with the group's scale and zero point applied on the way, so no fp16 copy of the weights is written:
//   y[t, r] = sum_c fp16(q[r, c] * s[r, g(c)] + zs[r, g(c)]) * fp16(x[t, c]),   zs = fp16(-z * s)
// The codes are CUTLASS's unsigned 4- or 8-bit elements exactly as the format stores them (column 2j in the low nibble
// of byte j at 4 bits), so the GEMV and this GEMM read the same bytes. The mainloop wants the scales and zero terms
// MN-major ([groups, n]); those two arrays (4 bytes per row and group: 6% over a 4-bit g128 weight's codes, 0.2 GB on
// Llama-2-7B) are derived at upload (UniformDevice::scales_mn / zero_terms_mn).
// Rounding: CUTLASS's multiply and add of fp16 values compile to one fused multiply-add, so each widened weight is
// rounded once, from (q - z) * s off by the zero term's own rounding (half an fp16 unit of |z s|); the dequantize +
// cuBLAS path rounds (q - z) * s once. Both multiply fp16 activations and sum in fp32 (tests/test_cuda_kernels.cpp
// checks the kernel against exactly this arithmetic).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lowbit::cuda {

// The kernel's token tile: 128 tokens, or 256 (each widened weight serves twice the tokens, for twice the accumulator
// registers). Auto: uniform_fused_tile(m, n).
enum class UniformFusedTile { Auto, T128, T256 };

struct UniformFusedArgs {
  UniformFusedTile tile = UniformFusedTile::Auto;
  int bits = 4;                     // 4 or 8
  int64_t m = 0, n = 0, k = 0, group = 0;   // group: a multiple of 64 columns, or k (per channel)
  const void* codes = nullptr;      // [n, k * bits / 8] as stored
  const __half* scales_mn = nullptr;       // [groups, n]
  const __half* zero_terms_mn = nullptr;   // [groups, n]: fp16(-z * s)
  const __half* x = nullptr;        // [m, k]
  float* y = nullptr;               // [m, n]
};

// Whether the GEMM was built (CUTLASS found at configure time) and this device runs it (compute capability 9.0).
bool uniform_fused_available();
// The tile Auto takes for m tokens and n weight rows: 256 from 1024 tokens, and from 512 on matrices of 8192 rows or
// more; 128 below (H200, bench --kernels: 8192x28672 at 512 tokens 408.6 against 517.1 us, 4096x11008 124.9 against
// 147.4; at 2048 tokens 256 was 1.17-1.29x faster on all six 7B / 70B shapes). Two CTAs sharing each token tile by
// multicast measured 1-10% slower than the 256-token tile alone, so it is not built.
UniformFusedTile uniform_fused_tile(int64_t m, int64_t n);
// Device workspace the kernel needs for these sizes (its tile scheduler's), bytes.
size_t uniform_fused_workspace_bytes(const UniformFusedArgs& a);
void uniform_fused_gemm(const UniformFusedArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace lowbit::cuda
