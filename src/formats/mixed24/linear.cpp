// Mixed24Linear: the CPU LinearOp for a "mixed24" weight. forward() decodes the weight once to fp32 (exactly the
// encoded values, Mixed24Quantized::value) and runs BLAS; forward_ref() is the oracle: it decodes every weight
// from the unpacked parts per call, accumulating in double.
#include "formats/mixed24/layout.h"

namespace lowbit {
namespace {

class Mixed24Linear final : public LinearOp {
 public:
  Mixed24Linear(Mixed24Quantized q, const float* bias)
      : LinearOp(q.n, q.k), q_(std::move(q)), decoded_(static_cast<size_t>(n_ * k_)), dense_(decoded_.data(), bias, n_, k_), bias_(bias) {
    q_.dequantize(decoded_.data());
  }
  void forward(const float* x, int64_t m, float* y, int) const override { dense_.forward(x, m, y); }
  void forward_ref(const float* x, int64_t m, float* y, int) const override {
    for (int64_t t = 0; t < m; ++t)
      for (int64_t r = 0; r < n_; ++r) {
        double acc = bias_ != nullptr ? bias_[r] : 0.0;
        for (int64_t c = 0; c < k_; ++c) acc += static_cast<double>(x[t * k_ + c]) * q_.value(r, c);
        y[t * n_ + r] = static_cast<float>(acc);
      }
  }

 private:
  Mixed24Quantized q_;
  std::vector<float> decoded_;
  DenseLinear dense_;
  const float* bias_;
};

}  // namespace

std::unique_ptr<LinearOp> make_mixed24_linear(const PackedWeight& w, const float* bias, const std::string& where) {
  return std::make_unique<Mixed24Linear>(unpack_mixed24(w, where), bias);
}

}  // namespace lowbit
