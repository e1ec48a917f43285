#include "backend_cpu/linear.h"

#include <cblas.h>

namespace lowbit {

void DenseLinear::forward(const float* x, int64_t m, float* y, int) const {
  if (m == 1) {
    // GEMV: OpenBLAS' sgemv is faster than an m=1 sgemm and streams W once.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n_), static_cast<int>(k_), 1.0f, w_,
                static_cast<int>(k_), x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n_),
                static_cast<int>(k_), 1.0f, x, static_cast<int>(k_), w_, static_cast<int>(k_), 0.0f, y,
                static_cast<int>(n_));
  }
  if (b_ != nullptr) {
#pragma omp parallel for if (m * n_ > 65536)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n_; ++j) y[i * n_ + j] += b_[j];
  }
}

void DenseLinear::forward_ref(const float* x, int64_t m, float* y, int) const {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n_; ++j) {
      double acc = b_ != nullptr ? b_[j] : 0.0;
      const float* wr = w_ + j * k_;
      const float* xr = x + i * k_;
      for (int64_t c = 0; c < k_; ++c) acc += static_cast<double>(xr[c]) * wr[c];
      y[i * n_ + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace lowbit
