// The 2/4/16 kernels over the memory-aligned layout (Li et al., ICCAD 2024; formats/mixed24a/layout.h): GEMVs at
// batch 1..8 (integer dot products, int8 and fp16 tensor cores, CUDA cores), the two-tile GEMV at 9..16, dequantize to
// fp16. Each kernel's CPU twin is the format's reference GEMM: tests/test_cuda_kernels.cpp compares them.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/common/gemv_path.h"
#include "backend_cuda/dispatch/device_weight.h"

namespace lowbit::cuda {

// The 2/4/16 paths that read the xfrag scratch (the pre-split tensor-core paths, the int8-activation ones): where the
// runtime (packed_matmul) and the benchmarks pass it.
constexpr bool mixed24a_path_takes_xfrag(GemvPath p) {
  return p == GemvPath::TensorCore || p == GemvPath::TensorCoreStream || p == GemvPath::Dp2aStream || p == GemvPath::Int8MmaStream;
}
// xfrag: as for anyprec_gemv, mixed24a_xfrag_bytes(k) bytes (the activations gathered through the permutation;
// GemvPath::Dp2aStream: their 16-bit integer values, mixed24a_dp_x_bytes(k, m) <= mixed24a_xfrag_bytes(k) of it;
// GemvPath::Int8MmaStream: their int8 pieces and group sums, mixed24a_mma_x_bytes(k, m)).
// xmax: as for anyprec_gemv_i8 (read by GemvPath::Dp2aStream and GemvPath::Int8MmaStream only).
void mixed24a_gemv(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s,
                   OutlierMode mode = OutlierMode::Fused, GemvPath path = GemvPath::Auto, void* xfrag = nullptr,
                   const float* xmax = nullptr);
size_t mixed24a_xfrag_bytes(int64_t k);
size_t mixed24a_dp_x_bytes(int64_t k, int m, int parts = 1);
// GemvPath::Int8MmaStream's part of the xfrag scratch (the activations' int8 pieces in its B-fragment order and each
// group's sum): at most mixed24a_xfrag_bytes(k) for 1..3 parts.
size_t mixed24a_mma_x_bytes(int64_t k, int m, int parts = 1);
// The integer-dot 2/4/16 GEMV (GemvPath::Dp2aStream, batch 1..2) or the int8 tensor-core one (GemvPath::Int8MmaStream,
// batch 3..8; the runtime groups at 3..kMixedMmaMaxBatch, where Auto runs it) over 1..3 matrices that read the same x (q / k / v, gate / up): one activation kernel and one GEMV launch,
// ys[p] [m, n_p] the outputs. Each matrix: the same k, mixed24a_dp_fits / mixed24a_mma_fits. xfrag:
// mixed24a_xfrag_bytes(k) bytes (mixed24a_dp_x_bytes(k, m, 3) / mixed24a_mma_x_bytes(k, m, 3) of it); xmax as
// mixed24a_gemv's.
void mixed24a_gemv_group(const Mixed24ADevice* ws, int parts, const float* x, int m, float* const* ys, cudaStream_t s,
                         OutlierMode mode, void* xfrag, const float* xmax = nullptr);
void mixed24a_dequant_f16(const Mixed24ADevice& w, __half* out, cudaStream_t s);
// Batch 9..16 (k a multiple of 256, >= 1024: mixed24a_stream_fits): the streamed 2/4/16 tensor-core GEMV with x entries
// of two fp16 columns in place of hi / lo (the work of a batch-8 call), outliers as the CSR pass; xfrag of
// mixed24a_xfrag_bytes(k). packed_matmul takes it over dequantize + cuBLAS while fused_gemm_enabled().
void mixed24a_gemv_two_tiles(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s, void* xfrag);

}  // namespace lowbit::cuda
