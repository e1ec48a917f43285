// Calibration statistics of one linear-layer input on the GPU: the twin of InputStats (src/quantize/capture.h).
//   H = 2/N · XᵀX over all N rows, accumulated in fp64: each chunk of <= 2048 rows is reduced by an fp32 cuBLAS
//   ssyrk (default math, no TF32) and added into an fp64 sum, exactly the CPU's chunking, so the two differ only by
//   the order of fp32 additions inside a chunk (~1e-6 relative; tests/test_quantize_gpu.cpp measures it);
//   per input column max |x| (QUIK's outlier columns) and Σ x² (the Hessian diagonal, for any-precision's
//   Hessian-diagonal sensitivity).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace lowbit::cuda {

class GpuInputStats {
 public:
  // full_hessian = false keeps only the column statistics (no k x k buffers).
  GpuInputStats(int64_t k, bool full_hessian);
  GpuInputStats(const GpuInputStats&) = delete;
  GpuInputStats& operator=(const GpuInputStats&) = delete;
  GpuInputStats(GpuInputStats&& o) noexcept;
  GpuInputStats& operator=(GpuInputStats&& o) = delete;
  ~GpuInputStats();

  static size_t bytes_needed(int64_t k, bool full_hessian);
  int64_t k() const { return k_; }
  int64_t rows() const { return rows_; }
  // x: device [rows, k] row-major fp32.
  void add(const float* x, int64_t rows, cublasHandle_t cublas, cudaStream_t stream);
  // Turns the accumulator into H = 2/N XᵀX (fp64, both triangles) in place, frees the fp32 chunk, and returns H
  // (device [k, k], owned by this object). Further add() calls are refused.
  const double* hessian(cudaStream_t stream);
  std::vector<double> max_abs() const;       // [k] host
  std::vector<double> mean_square() const;   // [k] host: Σ x² / N (H_cc / 2)

 private:
  void release();
  int64_t k_ = 0, rows_ = 0;
  bool full_ = false, finished_ = false;
  double* xtx_ = nullptr;     // [k, k]: the upper triangle (column-major view) accumulated
  float* chunk_ = nullptr;    // [k, k] ssyrk output
  float* max_abs_ = nullptr;  // [k]
  double* sum_sq_ = nullptr;  // [k]
};

}  // namespace lowbit::cuda
