// The 2/4/16-bit intra-matrix mixed-precision quantizer (Li et al., ICCAD 2024) on the GPU, aligned layout
// (mixed24a): the device twin of mixed24a_quantize (quantize/mixed24.h), which is its reference and its test oracle
// (tests/test_mixed24_gpu.cpp). Every step of one linear runs on the device; the host only sorts the G group scores
// (mixed24a_permutation) and steers the outlier threshold search (one 256-bin histogram per pass):
//   eq. 9 sensitivity from diag((H + λI)⁻¹) (the identity-order factor of gptq_gpu.h) and the column sums of W²;
//   the stored group order (units [2, 2, 2, 4]) and GPTQ's factor refactored in that order (perm_override);
//   outliers: the exact top `outlier_fraction · n k` of the RTN saliency, ties broken by index as the CPU does;
//   GPTQ over the mixed grid with two-order scales per 16-row block, lazy updates, one cuBLAS sgemm per block.
// The result struct is the CPU's (formats/mixed24a/layout.h), so pack_mixed24a takes either.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/mixed24a/layout.h"
#include "quantize/mixed24.h"

namespace lowbit::cuda {

// The largest GPTQ block the solver takes: U's diagonal block [B, B] fp32 lives in shared memory (64 KB at 128).
inline constexpr int kMixed24GpuMaxBlock = 128;

// w: device [n, k] fp32, left unchanged; h: device [k, k] fp64 symmetric (both triangles) in the original column
// order, left unchanged. Same options and checks as mixed24a_quantize (mixed24_aligned_fits), plus
// o.block_size <= kMixed24GpuMaxBlock and n · k < 2^32.
// deq (optional): device [n, k] receives exactly the weight the result encodes, original column order
// (Mixed24AQuantized::dequantize's values). stats (optional): hessian_error and outliers as the CPU computes them.
// Synchronises `stream` before it returns.
Mixed24AQuantized mixed24a_quantize_gpu(const float* w, int64_t n, int64_t k, const double* h,
                                        const Mixed24Options& o, cudaStream_t stream, float* deq = nullptr,
                                        Mixed24Stats* stats = nullptr);

}  // namespace lowbit::cuda
