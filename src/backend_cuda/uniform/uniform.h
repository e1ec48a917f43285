// The uniform (RTN / GPTQ) kernels over the stored layout (formats/uniform/layout.h: each row's codes as one
// little-endian bit stream of `bits`-bit codes, fp16 scales and u8 zero points per row and group, g_idx with
// act-order): a GEMV at batch 1..8 for every width 2..8 (tensor cores where the groups allow, CUDA cores otherwise),
// and dequantize to fp16 for the large-batch path (dequantize + cuBLAS). Their CPU twin is the format's reference
// forward (make_uniform_linear's forward_ref): tests/test_cuda_kernels.cpp compares them on the same packed bytes.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

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

}  // namespace lowbit::cuda
