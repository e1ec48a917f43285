// Calibration statistics of one linear-layer input (shared by the linears of a LinearSlot):
//   H = 2/N · XᵀX over all N calibration rows (tokens), accumulated in fp64: each chunk of rows is reduced with an
//   fp32 ssyrk (<= 2048 rows, relative error ~1e-6) and added into the fp64 sum, so long runs do not drift;
//   per input column: max |x|, mean |x|, l2 norm, variance (for outlier selection in later methods).
#pragma once
#include <cstdint>
#include <vector>

namespace lowbit {

class InputStats {
 public:
  explicit InputStats(int64_t k = 0);
  void add(const float* x, int64_t rows);          // x [rows, k]
  int64_t k() const { return k_; }
  int64_t rows() const { return rows_; }
  std::vector<double> hessian() const;             // 2/N XᵀX, full symmetric [k, k]
  std::vector<double> max_abs() const { return max_abs_; }
  std::vector<double> mean_abs() const;
  std::vector<double> l2_norm() const;
  std::vector<double> variance() const;

 private:
  int64_t k_ = 0, rows_ = 0;
  std::vector<double> xtx_;                        // upper triangle used, [k, k]
  std::vector<float> chunk_;                       // fp32 ssyrk scratch
  std::vector<double> max_abs_, sum_abs_, sum_sq_, sum_;
};

}  // namespace lowbit
