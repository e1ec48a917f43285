// QUIK linears on the GPU (Ashkboos et al.; formats/quik/layout.h has the arithmetic), integer activations (abits 4
// or 8; FP8 and A16 weights stay on the CPU: format_table's gpu_refuses):
//   1. per-token activation quantization: each row of x quantized over its base columns exactly as
//      quik_quantize_activations does (the same fp32 operations), codes as int8 padded to kbp; the outlier columns'
//      activations as fp16; each row's (sa, mn)
//   2. the integer products, exact in int32: a dp4a GEMV at batch 1..8 (4-bit codes widened in registers), above it
//      one cuBLAS int8 GEMM (int8 tensor cores, int32 out; 4-bit codes widened into scratch first)
//   3. the epilogue in fp32: y = sa sw acc + (H sa + mn) wReduced + Σ_o fp16(x_o) w_out[o]
// The CPU twin is quik_gemm_packed_ref (int64 sums, fp64 epilogue): tests/test_cuda_kernels.cpp checks the int32
// sums bit for bit and y within the fp32 epilogue's rounding.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/dense/dense.h"
#include "backend_cuda/dispatch/device_weight.h"

namespace lowbit::cuda {

// Scratch bytes quik_matmul takes from the context's activation scratch for m rows (codes, row parameters, outlier
// activations) and from its weight scratch above batch 8 (int32 sums, widened 4-bit codes).
size_t quik_act_scratch_bytes(const QuikDevice& w, int64_t m);
size_t quik_gemm_scratch_bytes(const QuikDevice& w, int64_t m);

// y [m, n] fp32 = the QUIK product of x [m, k] fp32 (original column order) for any m >= 1: the GEMV at m <= 8, the
// cuBLAS int8 GEMM above. acc_out (tests, optional): the int32 sums [m, n].
void quik_matmul(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int32_t* acc_out = nullptr);
// The two forms, for tests and benchmarks (quik_matmul picks by m).
void quik_gemv(const QuikDevice& w, const float* x, int m, float* y, GemmContext& ctx, int32_t* acc_out = nullptr);
void quik_gemm_cublas(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int32_t* acc_out = nullptr);

}  // namespace lowbit::cuda
