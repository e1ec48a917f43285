// GPU calibration statistics (input_stats_gpu.h).
#include "backend_cuda/quantize/input_stats_gpu.h"

#include <utility>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dense/dense.h"
#include "core/error.h"

namespace lowbit::cuda {

namespace {

constexpr int64_t kChunkRows = 2048;   // as the CPU InputStats: fp32 sums over at most this many rows

// acc += chunk over the filled triangle (column-major upper: row i <= column j, element i + j k).
__global__ void add_upper_kernel(double* acc, const float* chunk, int64_t k) {
  const int64_t j = blockIdx.y;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i <= j;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc[i + j * k] += static_cast<double>(chunk[i + j * k]);
}

// Per column: max |x| and Σ x² over the rows (one thread per column: rows are read coalesced across threads).
__global__ void column_stats_kernel(const float* x, int64_t rows, int64_t k, float* max_abs, double* sum_sq) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= k) return;
  float mx = max_abs[c];
  double sq = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float v = x[r * k + c];
    mx = fmaxf(mx, fabsf(v));
    sq += static_cast<double>(v) * v;
  }
  max_abs[c] = mx;
  sum_sq[c] += sq;
}

// In place: H = f · acc, mirrored from the upper triangle (symmetric, so row- and column-major read the same).
__global__ void finish_hessian_kernel(double* h, int64_t k, double f) {
  const int64_t j = blockIdx.y;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i <= j;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = f * h[i + j * k];
    h[i + j * k] = v;
    h[j + i * k] = v;
  }
}

dim3 triangle_grid(int64_t k) {
  return dim3(static_cast<unsigned>(std::min<int64_t>((k + 255) / 256, 64)), static_cast<unsigned>(k));
}

}  // namespace

size_t GpuInputStats::bytes_needed(int64_t k, bool full_hessian) {
  const size_t kk = static_cast<size_t>(k) * static_cast<size_t>(k);
  return (full_hessian ? kk * (sizeof(double) + sizeof(float)) : 0) + static_cast<size_t>(k) * 12;
}

GpuInputStats::GpuInputStats(int64_t k, bool full_hessian) : k_(k), full_(full_hessian) {
  LOWBIT_CHECK(k > 0, "GpuInputStats: k must be positive");
  const size_t kk = static_cast<size_t>(k) * static_cast<size_t>(k);
  if (full_) {
    LOWBIT_CUDA_CHECK(cudaMalloc(&xtx_, kk * sizeof(double)));
    LOWBIT_CUDA_CHECK(cudaMalloc(&chunk_, kk * sizeof(float)));
    LOWBIT_CUDA_CHECK(cudaMemset(xtx_, 0, kk * sizeof(double)));
  }
  LOWBIT_CUDA_CHECK(cudaMalloc(&max_abs_, static_cast<size_t>(k) * sizeof(float)));
  LOWBIT_CUDA_CHECK(cudaMalloc(&sum_sq_, static_cast<size_t>(k) * sizeof(double)));
  LOWBIT_CUDA_CHECK(cudaMemset(max_abs_, 0, static_cast<size_t>(k) * sizeof(float)));
  LOWBIT_CUDA_CHECK(cudaMemset(sum_sq_, 0, static_cast<size_t>(k) * sizeof(double)));
}

GpuInputStats::GpuInputStats(GpuInputStats&& o) noexcept
    : k_(o.k_), rows_(o.rows_), full_(o.full_), finished_(o.finished_), xtx_(std::exchange(o.xtx_, nullptr)),
      chunk_(std::exchange(o.chunk_, nullptr)), max_abs_(std::exchange(o.max_abs_, nullptr)),
      sum_sq_(std::exchange(o.sum_sq_, nullptr)) {}

GpuInputStats::~GpuInputStats() { release(); }

void GpuInputStats::release() {
  if (xtx_) cudaFree(xtx_);
  if (chunk_) cudaFree(chunk_);
  if (max_abs_) cudaFree(max_abs_);
  if (sum_sq_) cudaFree(sum_sq_);
  xtx_ = nullptr;
  chunk_ = nullptr;
  max_abs_ = nullptr;
  sum_sq_ = nullptr;
}

void GpuInputStats::add(const float* x, int64_t rows, cublasHandle_t cublas, cudaStream_t stream) {
  LOWBIT_CHECK(!finished_, "GpuInputStats: add() after hessian()");
  if (rows <= 0) return;
  if (full_) {
    cublas_check(cublasSetStream(cublas, stream), "cublasSetStream");
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
      const int64_t m = std::min(kChunkRows, rows - r0);
      // Row-major x [m, k] is column-major xᵀ [k, m]: XᵀX = xᵀ (xᵀ)ᵀ, a k x k syrk with no transpose.
      cublas_check(cublasSsyrk(cublas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, static_cast<int>(k_), static_cast<int>(m),
                               &one, x + r0 * k_, static_cast<int>(k_), &zero, chunk_, static_cast<int>(k_)),
                   "calibration Hessian ssyrk");
      add_upper_kernel<<<triangle_grid(k_), 256, 0, stream>>>(xtx_, chunk_, k_);
      LOWBIT_CUDA_CHECK(cudaGetLastError());
    }
  }
  column_stats_kernel<<<static_cast<unsigned>((k_ + 255) / 256), 256, 0, stream>>>(x, rows, k_, max_abs_, sum_sq_);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  rows_ += rows;
}

const double* GpuInputStats::hessian(cudaStream_t stream) {
  LOWBIT_CHECK(full_, "GpuInputStats: built without the Hessian");
  if (!finished_) {
    const double f = rows_ > 0 ? 2.0 / static_cast<double>(rows_) : 0.0;
    finish_hessian_kernel<<<triangle_grid(k_), 256, 0, stream>>>(xtx_, k_, f);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFree(chunk_);
    chunk_ = nullptr;
    finished_ = true;
  }
  return xtx_;
}

std::vector<double> GpuInputStats::max_abs() const {
  std::vector<float> f(static_cast<size_t>(k_));
  LOWBIT_CUDA_CHECK(cudaMemcpy(f.data(), max_abs_, f.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return std::vector<double>(f.begin(), f.end());
}

std::vector<double> GpuInputStats::mean_square() const {
  std::vector<double> v(static_cast<size_t>(k_));
  LOWBIT_CUDA_CHECK(cudaMemcpy(v.data(), sum_sq_, v.size() * sizeof(double), cudaMemcpyDeviceToHost));
  for (double& x : v) x /= static_cast<double>(std::max<int64_t>(rows_, 1));
  return v;
}

}  // namespace lowbit::cuda
