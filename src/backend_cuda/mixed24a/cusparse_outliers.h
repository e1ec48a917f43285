// The 2/4/16 sparse fp16 outliers added by cuSPARSE (the 2/4/16 paper's choice), as the benchmarks' baseline for our
// fused and warp-per-row CSR passes (docs/PERF.md, "Outliers"): y [m, n] += A x over the weight's CSR outliers, with
// A's columns mapped through the group permutation to x's original columns (int32 indices) once at construction.
// cusparseSpMV at batch 1, cusparseSpMM above, fp32 x and y, fp32 compute; A's values fp16 as stored where cuSPARSE
// takes fp16 A with fp32 x (else an fp32 copy, which values_fp16() reports).
#pragma once
#include <cstdint>
#include <memory>

#include "backend_cuda/common/common.h"
#include "backend_cuda/mixed24a/mixed24a.h"

namespace lowbit::cuda {

class CusparseOutliers {
 public:
  // w must have outliers (rowptr != null). Throws a one-line lowbit::Error on any cuSPARSE failure.
  explicit CusparseOutliers(const Mixed24ADevice& w);
  ~CusparseOutliers();
  CusparseOutliers(const CusparseOutliers&) = delete;
  CusparseOutliers& operator=(const CusparseOutliers&) = delete;

  // y [m, n] += outliers x [m, k] on stream s (1 <= m).
  void add(const float* x, int m, float* y, cudaStream_t s);
  bool values_fp16() const { return fp16_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool fp16_ = true;
};

}  // namespace lowbit::cuda
