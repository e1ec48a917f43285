#include "quantize/capture.h"

#include <cblas.h>

#include <cmath>

namespace lowbit {

InputStats::InputStats(int64_t k)
    : k_(k), xtx_(static_cast<size_t>(k * k)), chunk_(static_cast<size_t>(k * k)), max_abs_(static_cast<size_t>(k)),
      sum_abs_(static_cast<size_t>(k)), sum_sq_(static_cast<size_t>(k)), sum_(static_cast<size_t>(k)) {}

void InputStats::add(const float* x, int64_t rows) {
  constexpr int64_t kChunkRows = 2048;
  for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
    const int64_t m = std::min(kChunkRows, rows - r0);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(k_), static_cast<int>(m), 1.0f, x + r0 * k_,
                static_cast<int>(k_), 0.0f, chunk_.data(), static_cast<int>(k_));
#pragma omp parallel for schedule(static) if (k_ * k_ >= (1 << 16))
    for (int64_t i = 0; i < k_; ++i)
      for (int64_t j = i; j < k_; ++j) xtx_[static_cast<size_t>(i * k_ + j)] += chunk_[static_cast<size_t>(i * k_ + j)];
  }
#pragma omp parallel for schedule(static) if (rows * k_ >= (1 << 16))
  for (int64_t c = 0; c < k_; ++c) {
    double mx = max_abs_[static_cast<size_t>(c)], sa = 0, sq = 0, s = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double v = x[r * k_ + c];
      mx = std::max(mx, std::fabs(v));
      sa += std::fabs(v);
      sq += v * v;
      s += v;
    }
    max_abs_[static_cast<size_t>(c)] = mx;
    sum_abs_[static_cast<size_t>(c)] += sa;
    sum_sq_[static_cast<size_t>(c)] += sq;
    sum_[static_cast<size_t>(c)] += s;
  }
  rows_ += rows;
}

std::vector<double> InputStats::hessian() const {
  std::vector<double> h(static_cast<size_t>(k_ * k_));
  const double f = rows_ > 0 ? 2.0 / static_cast<double>(rows_) : 0.0;
  for (int64_t i = 0; i < k_; ++i)
    for (int64_t j = i; j < k_; ++j)
      h[static_cast<size_t>(i * k_ + j)] = h[static_cast<size_t>(j * k_ + i)] = f * xtx_[static_cast<size_t>(i * k_ + j)];
  return h;
}

std::vector<double> InputStats::mean_abs() const {
  std::vector<double> v(sum_abs_);
  for (double& x : v) x /= std::max<int64_t>(rows_, 1);
  return v;
}

std::vector<double> InputStats::l2_norm() const {
  std::vector<double> v(sum_sq_);
  for (double& x : v) x = std::sqrt(x);
  return v;
}

std::vector<double> InputStats::variance() const {
  std::vector<double> v(static_cast<size_t>(k_));
  const double n = static_cast<double>(std::max<int64_t>(rows_, 1));
  for (int64_t c = 0; c < k_; ++c) {
    const double mean = sum_[static_cast<size_t>(c)] / n;
    v[static_cast<size_t>(c)] = std::max(0.0, sum_sq_[static_cast<size_t>(c)] / n - mean * mean);
  }
  return v;
}

}  // namespace lowbit
