// Which GEMV kernel an entry point runs when a caller names one (tests and benchmarks time each), and how it applies
// the sparse outliers. The runtime passes the kernel that kernel_choice.h picks (dispatch/packed.h).
#pragma once
#include "backend_cuda/dispatch/kernel_choice.h"

namespace lowbit::cuda {

enum class OutlierMode { Fused, SpMV };   // sparse outliers inside the GEMV, or a CSR SpMV launched after it
// A GEMV kernel to run explicitly (tests and benchmarks time each one), or Auto: the one kernel_choice.h picks. Each
// value is a Kernel of kernel_choice.h (gemv_path_of maps them):
//   Scalar                     CUDA-core FMAs, centroids from shared-memory tables (any width, any batch 1..8);
//   TensorCore                 mma.sync, A from shared-memory tables; x split in the loop, or pre-split (xfrag given);
//   TensorCoreRegisterLut      mma.sync, A looked up from registers by PRMT (any-precision 2..4 bits; xfrag required);
//   TensorCoreRegisterLutStream  the register-table kernel with persistent CTAs streaming each warp's plane words, LUT
//                              rows and x fragments through shared memory by cp.async (batch 1..2, k a multiple of 128
//                              and >= 2048);
//   TensorCoreInt8LutStream    int8 tables and int8 mma.sync, streamed (any-precision 2..4 bits, batch 1..8, k a
//                              multiple of 128 and >= 2048; anyprec_gemv_i8.cu): the centroids rounded to int8 under a
//                              row scale, x as two int8 pieces under a column scale (int8_tables.h); outliers fused;
//   TensorCoreSharedLutStream  shared-memory tables, streamed (any-precision 5..8 bits, batch 1..8);
//   TensorCoreStream           2/4/16 fp16 tensor-core kernel, streamed (x pre-split; k a multiple of 256, >= 1024);
//   Dp2aStream                 2/4/16 integer dot products on int16 activations (batch 1..2);
//   Int8MmaStream              2/4/16 int8 mma.sync with exact int32 group sums (batch 1..8).
enum class GemvPath { Auto, Scalar, TensorCore, TensorCoreRegisterLut, TensorCoreRegisterLutStream, TensorCoreStream,
                      TensorCoreInt8LutStream, TensorCoreSharedLutStream, Dp2aStream, Int8MmaStream };
// The register-table kernels (any-precision 2..4 bits, x pre-split), and every tensor-core path.
constexpr bool is_register_table(GemvPath p) {
  return p == GemvPath::TensorCoreRegisterLut || p == GemvPath::TensorCoreRegisterLutStream;
}
constexpr bool is_streamed(GemvPath p) { return p == GemvPath::TensorCoreRegisterLutStream; }
constexpr bool is_tensor_core(GemvPath p) {
  return p == GemvPath::TensorCore || is_register_table(p) || p == GemvPath::TensorCoreInt8LutStream ||
         p == GemvPath::TensorCoreSharedLutStream;
}

}  // namespace lowbit::cuda
