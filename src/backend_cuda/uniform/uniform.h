// The uniform (RTN / GPTQ) kernels over the stored layout (formats/uniform/layout.h: each row's codes as one
// little-endian bit stream of `bits`-bit codes, fp16 scales and u8 zero points per row and group, g_idx with
// act-order): a GEMV at batch 1..8 for every width 2..8 (tensor cores where the groups allow, CUDA cores otherwise);
// above batch 8 the mixed-input GEMM on Hopper where it serves the weight (uniform_gemm), else dequantize to fp16 +
// cuBLAS. Their CPU twin is the format's reference forward (make_uniform_linear's forward_ref):
// tests/test_cuda_kernels.cpp compares them on the same packed bytes.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/dense/dense.h"
#include "backend_cuda/dispatch/device_weight.h"

namespace lowbit::cuda {

// Whether the GEMV runs its tensor-core form for this weight (k a multiple of 128, groups of a multiple of 128 columns,
// no g_idx: GPTQ / RTN g128 and per-channel weights): codes decoded to fp16 q - z in registers, x split into two fp16
// pieces, mma.sync with fp32 accumulation, persistent CTAs streaming the codes through cp.async rings.
bool uniform_gemv_tensor_core(const UniformDevice& w);

// Whether the GEMV runs a chunked form for this weight (k a multiple of 32, and groups of a multiple of 32 columns
// or g_idx): 32 codes per lane and step, read as `bits` whole words; the tensor-core form where
// uniform_gemv_tensor_core, else the CUDA-core one (act-order, groups of 32 / 64, k not a multiple of 128).
// Otherwise it runs the per-column form (any k, any group size), correct everywhere and slower.
bool uniform_gemv_chunked(const UniformDevice& w);

// y [m, n] fp32 = x [m, k] fp32 · Wᵀ, m in 1..8: each weight decoded exactly as the format defines it,
// (float(q) - z) * fp32(scale), and multiplied in fp32 with fp32 accumulation (the tensor-core form: (q - z) times x
// to ~2^-22 relative, |x| < 65504, summed per 128-column block in fp32 and scaled once per block).
void uniform_gemv(const UniformDevice& w, const float* x, int m, float* y, cudaStream_t s);

// out [n, k] = the encoded weights rounded to fp16 (bit-exact against f32_to_f16(UniformQuantized::dequant)).
void uniform_dequant_f16(const UniformDevice& w, __half* out, cudaStream_t s);

// Above batch 8 on Hopper: whether the mixed-input GEMM (uniform_fused.h) was built, runs on this device and serves
// this weight (4 / 8 bits, no g_idx, groups of a multiple of 64 columns or whole rows, n % 8 == 0, k % 32 == 0).
bool uniform_gemm_serves(const UniformDevice& w);
// Its MN-major operands ([G, n] each): the scales, and the zero terms fp16(-z * s). Derived once, at upload.
void uniform_mn_operands(const UniformDevice& w, __half* scales_mn, __half* zero_terms_mn, cudaStream_t s);
// y [m, n] fp32 = x [m, k] · Wᵀ through the mixed-input GEMM: x rounded to fp16, each weight widened in registers to
// fp16(fp16(q * s) + fp16(-z * s)), fp32 accumulation. Needs uniform_gemm_serves and the derived operands.
// tile: the kernel's token tile (uniform_fused.h; 0 = by m and n, else 128 or 256), for the benchmark to time both.
void uniform_gemm(const UniformDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int tile = 0);

}  // namespace lowbit::cuda
