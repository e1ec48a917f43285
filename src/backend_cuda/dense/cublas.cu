// cuBLAS for fp16 weights (fp32 accumulation), the scratch and handle it shares with the packed weights'
// dequantize + cuBLAS path, and the fp32 -> fp16 activation conversion in front of it.
#include "backend_cuda/dense/dense.h"

#include "backend_cuda/common/launch.cuh"

namespace lowbit::cuda {

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error ", static_cast<int>(st), " (", cublasGetStatusString(st), ") in ", what);
}

namespace {
__global__ void f32_to_f16_kernel(const float* __restrict__ in, __half* __restrict__ out, int64_t count) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2half_rn(in[i]);
}
}  // namespace

void f32_to_f16(const float* in, __half* out, int64_t count, cudaStream_t s) {
  if (count == 0) return;
  launch_pdl(kPdlOps, f32_to_f16_kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, s, in, out, count);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

GemmContext::GemmContext(cudaStream_t s) : stream_(s), cublas_ws_(32u << 20) {
  cublas_check(cublasCreate(&handle_), "cublasCreate");
  cublas_check(cublasSetStream(handle_, s), "cublasSetStream");
  cublas_check(cublasSetWorkspace(handle_, cublas_ws_.get(), cublas_ws_.bytes()), "cublasSetWorkspace");
}

GemmContext::~GemmContext() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

__half* GemmContext::weight_scratch(size_t elements) {
  if (wbuf_.size() < elements) {
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream_));   // the old buffer may still be read by queued work
    wbuf_ = DeviceBuffer<__half>(elements);
    ++generation_;
  }
  return wbuf_.get();
}

__half* GemmContext::act_scratch(size_t elements) {
  if (abuf_.size() < elements) {
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    abuf_ = DeviceBuffer<__half>(elements);
    ++generation_;
  }
  return abuf_.get();
}

void dense_f16_matmul(const __half* w, int64_t n, int64_t k, const float* x, int64_t m, float* y, GemmContext& ctx) {
  __half* xh = ctx.act_scratch(static_cast<size_t>(m * k));
  f32_to_f16(x, xh, m * k, ctx.stream());
  dense_f16_matmul_h(w, n, k, xh, m, y, ctx);
}

void dense_f16_matmul_h(const __half* w, int64_t n, int64_t k, const __half* xh, int64_t m, float* y, GemmContext& ctx) {
  // Row-major y [m, n] = x [m, k] · Wᵀ is column-major yᵀ [n, m] = (W as column-major [k, n])ᵀ · (x as [k, m]).
  const float alpha = 1.0f, beta = 0.0f;
  cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), &alpha, w, CUDA_R_16F, static_cast<int>(k), xh, CUDA_R_16F,
                            static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "dense_f16_matmul");
}

}  // namespace lowbit::cuda
