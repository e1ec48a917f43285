// QUIK's fused Hopper GEMM (quik_fused.cu): the base product on the tensor cores with QUIK's scales and zero-point term
// applied to the accumulators before they leave the kernel, so no sums are written to memory and read back:
//   y[t, r] = sa[t] sw[r] acc[t, r] + a2[t] wred[r]
// acc: int32 (int8 activations x int8 or int4 codes, exact) or fp32 (e4m3 x e4m3). sa / a2 per token, sw / wred per
// output row. The outlier columns' product is added after it by a fp16 GEMM accumulating into y (quik_gemm.cu).
// The weights are the A operand ([n, k], K-major as the format stores them), the tokens B ([m, k], K-major), and D is
// y [m, n] row-major (the GEMM's column-major [n, m]). 4-bit codes are read packed and widened in registers (CUTLASS's
// mixed-input mainloop) at A8: no wider copy of a weight is written.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lowbit::cuda {

enum class QuikFusedKind {
  W8A8,    // int8 codes x int8 activations -> int32
  W4A8,    // packed int4 codes x int8 activations -> int32
  W4Fp8,   // e4m3 codes (4-bit codes widened per call) x e4m3 activations -> fp32
};

struct QuikFusedArgs {
  QuikFusedKind kind = QuikFusedKind::W8A8;
  const void* w = nullptr;     // [n, k] int8 or e4m3, or [n, k / 2] packed int4 (column 2j in the low nibble of byte j)
  const void* x = nullptr;     // [m, k] int8 or e4m3
  int64_t m = 0, n = 0, k = 0;
  const float* sa = nullptr;   // [m]; nullptr: 1
  const float* a2 = nullptr;   // [m]; nullptr: 0 (no zero-point term)
  const __half* sw = nullptr;  // [n]; nullptr: 1
  const float* wred = nullptr; // [n]; nullptr: 0
  float* y = nullptr;          // [m, n]
};

// Whether the fused GEMM was built (CUTLASS found at configure time) and this device runs it (compute capability 9.0).
bool quik_fused_available();
// Whether a problem fits the kernel: n a multiple of 4 (16-byte rows of y), k a positive multiple of 32.
bool quik_fused_fits(int64_t n, int64_t k);
// Device workspace the kernel needs for these sizes (its tile scheduler's), bytes.
size_t quik_fused_workspace_bytes(const QuikFusedArgs& a);
void quik_fused_gemm(const QuikFusedArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace lowbit::cuda
