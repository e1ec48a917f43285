// GPTQ and RTN on the GPU: the CPU quantizers of src/quantize (gptq.h, rtn.h, quik.h) with the weight, the
// Hessian and the inverse-Hessian factor resident on the device. The CPU functions are the reference twins: the
// same options, the same conventions, the same result structs (so the packers of src/formats take either), and
// tests/test_gptq_gpu.cpp compares each pair on the same inputs.
//   factor:  dead columns, act-order permutation, damping λ = percdamp · mean(diag H) raised tenfold until
//            H + λI factors, U = upper Cholesky factor of (H + λI)⁻¹: cuSOLVER in fp64 (potrf, potri, potrf);
//   solve:   one warp per row, the 128 columns of a block processed in order with U's diagonal block in shared
//            memory (rows are independent inside a block), then W[:, i2:] -= Err · U[i1:i2, i2:] by one cuBLAS
//            sgemm, as the CPU loop does with OpenBLAS.
// All device pointers; every function synchronises `stream` before it returns host results.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "quantize/gptq.h"
#include "quantize/quik.h"
#include "quantize/rtn.h"

namespace lowbit::cuda {

// What GPTQ derives from one Hessian, on the device (shared by the linears that read the same input).
class GpuGptqFactor {
 public:
  GpuGptqFactor() = default;
  GpuGptqFactor(const GpuGptqFactor&) = delete;
  GpuGptqFactor& operator=(const GpuGptqFactor&) = delete;
  GpuGptqFactor(GpuGptqFactor&& o) noexcept;
  GpuGptqFactor& operator=(GpuGptqFactor&& o) noexcept;
  ~GpuGptqFactor();

  int64_t k = 0;
  std::vector<char> dead;          // [k] host
  std::vector<int64_t> perm;       // [k] host: processing order
  double damp = 0;
  float* u = nullptr;              // device [k, k] fp32, upper factor in processing order (lower triangle 0)
  double* u_diag = nullptr;        // device [k] fp64 diagonal of U (the CPU divides by the fp64 value)
  int64_t* d_perm = nullptr;       // device [k]
};

// h: device [k, k] fp64 symmetric (row-major; both triangles filled), left unchanged.
// perm_override (optional, size k): process in this order instead of identity / act-order (QUIK: base columns
// then outliers; mixed24a: the stored group order).
GpuGptqFactor gptq_factor_gpu(const double* h, int64_t k, const GptqOptions& opts, cudaStream_t stream,
                              const std::vector<int64_t>* perm_override = nullptr);

// w: device [n, k] fp32 (left unchanged). deq (optional): device [n, k] receives exactly the weight the result
// encodes (UniformQuantized::dequantize on the device). h (optional) for stats->hessian_error.
UniformQuantized gptq_quantize_gpu(const float* w, int64_t n, int64_t k, const GpuGptqFactor& factor,
                                   const GptqOptions& opts, cudaStream_t stream, float* deq = nullptr,
                                   const double* h = nullptr, GptqStats* stats = nullptr);

// Bit-identical to rtn_quantize (mse_clip included).
UniformQuantized rtn_quantize_gpu(const float* w, int64_t n, int64_t k, const UniformSpec& spec, cudaStream_t stream,
                                  float* deq = nullptr);

// quik_quantize on the device: outlier_cols as quik_outlier_columns returns them; h: device [k, k] fp64 in the
// original order.
QuikQuantized quik_quantize_gpu(const float* w, int64_t n, int64_t k, const double* h,
                                const std::vector<int32_t>& outlier_cols, int wbits, int abits, bool act_fp8, bool clip,
                                double percdamp, cudaStream_t stream, float* deq = nullptr, QuikStats* stats = nullptr);

// Σ_r (w_r - ŵ_r)ᵀ H (w_r - ŵ_r) for device w, w_hat [n, k] and h [k, k] fp64 (the layer objective).
double hessian_weighted_error_gpu(const float* w, const float* w_hat, int64_t n, int64_t k, const double* h,
                                  cudaStream_t stream);

}  // namespace lowbit::cuda
