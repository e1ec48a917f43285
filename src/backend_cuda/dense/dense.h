// fp16 dense weights on the GPU: our GEMV at small batches (dense_gemv.cu) and cuBLAS (cublas.cu), with the scratch
// and handle they share (GemmContext, also the packed weights' dequantize + cuBLAS path).
#pragma once
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dispatch/kernel_choice.h"   // kMaxGemvBatch

namespace lowbit::cuda {

void cublas_check(cublasStatus_t st, const char* what);
void f32_to_f16(const float* in, __half* out, int64_t count, cudaStream_t s);

// Scratch for the large-batch path (grown on demand, reused across calls) and the cuBLAS handle.
class GemmContext {
 public:
  explicit GemmContext(cudaStream_t s);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return handle_; }
  __half* weight_scratch(size_t elements);
  __half* act_scratch(size_t elements);
  // Bumped whenever a scratch buffer is reallocated: a captured CUDA graph that baked in the old pointers is stale.
  uint64_t generation() const { return generation_; }

 private:
  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<__half> wbuf_, abuf_;
  DeviceBuffer<uint8_t> cublas_ws_;   // cuBLAS's workspace, owned here so nothing is allocated during graph capture
  uint64_t generation_ = 0;
};

// y [m, n] fp32 = x [m, k] fp32 · Wᵀ with W [n, k] fp16 already on the device: x is converted to fp16 in the
// context's scratch, then one cuBLAS GEMM (fp32 accumulation and output). The large-batch path's second step.
void dense_f16_matmul(const __half* w, int64_t n, int64_t k, const float* x, int64_t m, float* y, GemmContext& ctx);
// The same with the activations already in fp16 (xh [m, k]): no conversion kernel.
void dense_f16_matmul_h(const __half* w, int64_t n, int64_t k, const __half* xh, int64_t m, float* y, GemmContext& ctx);

// Batch 1..8 on fp16 weights (dense_gemv.cu): y [m, n] fp32 = x [m, k] · Wᵀ (+ bias[n] when bias != nullptr), x fp32
// or fp16, fp32 accumulation, launched with programmatic dependent launch. dense_gemv_fits: batch 1..kMaxGemvBatch, k a
// positive multiple of 8, W and x 16-byte aligned (else the caller takes cuBLAS). rows_per_warp 1, 2 or 4 (0 = the
// measured default for the batch). Used by the runtime's dense linears while dense_gemv_enabled() (LOWBIT_DENSE_GEMV=0
// in the environment turns it off, read once; set_dense_gemv() overrides it: bench --e2e times both in one run, and a
// captured decode graph is keyed on it).
bool dense_gemv_fits(const __half* w, int64_t n, int64_t k, int64_t m, const void* x);
void dense_f16_gemv(const __half* w, int64_t n, int64_t k, const float* x, int m, const float* bias, float* y,
                    cudaStream_t s, int rows_per_warp = 0);
void dense_f16_gemv(const __half* w, int64_t n, int64_t k, const __half* x, int m, const float* bias, float* y,
                    cudaStream_t s, int rows_per_warp = 0);
int dense_gemv_rows_per_warp(int64_t n, int m);   // the default form
bool dense_gemv_enabled();
void set_dense_gemv(bool on);

}  // namespace lowbit::cuda
