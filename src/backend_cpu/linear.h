// Linear layers on the CPU: y[m, n] = x[m, k] · Wᵀ + b. The model holds one LinearOp per projection, so packed
// weight formats (added by the quantization issues) plug in beside the dense fp32 one.
#pragma once
#include <cstdint>
#include <memory>

namespace lowbit {

class LinearOp {
 public:
  LinearOp(int64_t n, int64_t k) : n_(n), k_(k) {}
  virtual ~LinearOp() = default;
  int64_t n() const { return n_; }  // output features
  int64_t k() const { return k_; }  // input features
  // Fast path (BLAS / threaded). x: [m, k] row-major, y: [m, n] row-major. bits: the width to read from an
  // any-precision weight (one of served_widths(); 0 = its widest); single-precision formats ignore it.
  virtual void forward(const float* x, int64_t m, float* y, int bits = 0) const = 0;
  // Plain scalar loops, the oracle for tests; same contract as forward().
  virtual void forward_ref(const float* x, int64_t m, float* y, int bits = 0) const = 0;
  // Bit set of the widths a call may ask for (bit b = width b); 0 for a single-precision weight.
  virtual uint32_t served_widths() const { return 0; }
  // Bytes of weight data one forward call reads at that width (fp32 here; packed formats override).
  virtual uint64_t weight_bytes(int bits) const { return 4ull * static_cast<uint64_t>(n_ * k_); }

 protected:
  int64_t n_, k_;
};

// Dense fp32 weights w: [n, k] row-major (PyTorch Linear layout), optional bias b: [n]. Not owned.
class DenseLinear final : public LinearOp {
 public:
  DenseLinear(const float* w, const float* b, int64_t n, int64_t k) : LinearOp(n, k), w_(w), b_(b) {}
  void forward(const float* x, int64_t m, float* y, int bits = 0) const override;
  void forward_ref(const float* x, int64_t m, float* y, int bits = 0) const override;
  const float* weight() const { return w_; }
  const float* bias() const { return b_; }

 private:
  const float* w_;
  const float* b_;
};

}  // namespace lowbit
