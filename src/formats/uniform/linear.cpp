// UniformLinear: the CPU LinearOp for a "uniform" packed weight.
//
// forward(): the weight is decoded to fp32 once, at construction (UniformQuantized::dequantize — exactly the
// encoded values), and every call runs OpenBLAS through DenseLinear. The fp32 copy costs 4 bytes per weight on
// top of the packed bits, so the CPU path runs at the speed (and memory) of the dense fp32 model; packed-weight
// kernels belong to the backends that need the memory saving.
//
// forward_ref(): the oracle. It keeps its own copy of the packed parts and decodes every weight on the fly,
// bit by bit from the qweight stream (independently of unpack_uniform's word arithmetic), accumulating in
// double. The two paths see identical weights, so they differ only by fp32 vs double accumulation.
#include <cstring>
#include <utility>

#include "core/half.h"
#include "formats/uniform/layout.h"

namespace lowbit {
namespace {

class UniformLinear final : public LinearOp {
 public:
  // q: the validated, unpacked weight; qweight: its packed codes (part "qweight" of the same PackedWeight).
  UniformLinear(UniformQuantized q, const TensorView& qweight, const float* bias)
      : LinearOp(q.n, q.k),
        q_(std::move(q)),
        decoded_(static_cast<size_t>(n_ * k_)),
        dense_(decoded_.data(), bias, n_, k_),
        bias_(bias),
        words_per_row_(qweight.shape[1]) {
    q_.dequantize(decoded_.data());
    words_.resize(static_cast<size_t>(qweight.nbytes / sizeof(uint32_t)));
    std::memcpy(words_.data(), qweight.data, qweight.nbytes);
    q_.codes.clear();  // forward_ref reads the packed words, not the unpacked codes
    q_.codes.shrink_to_fit();
  }

  void forward(const float* x, int64_t m, float* y, int) const override { dense_.forward(x, m, y); }

  void forward_ref(const float* x, int64_t m, float* y, int) const override {
    const int64_t groups = q_.groups();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < n_; ++r) {
        double acc = bias_ != nullptr ? bias_[r] : 0.0;
        for (int64_t c = 0; c < k_; ++c) {
          const int g = q_.group_of(c);
          const float scale = f16_to_f32(q_.scales[static_cast<size_t>(r * groups + g)]);
          const float weight = (static_cast<float>(code(r, c)) - q_.zero(r, g)) * scale;
          acc += static_cast<double>(x[i * k_ + c]) * weight;
        }
        y[i * n_ + r] = static_cast<float>(acc);
      }
    }
  }

 private:
  // Code (r, c): stream bits [c*bits, (c+1)*bits) of row r, one bit at a time.
  uint32_t code(int64_t r, int64_t c) const {
    const uint32_t* row = words_.data() + r * words_per_row_;
    uint32_t v = 0;
    for (int b = 0; b < q_.bits; ++b) {
      const int64_t bit = c * q_.bits + b;
      v |= ((row[bit / 32] >> (bit % 32)) & 1u) << b;
    }
    return v;
  }

  UniformQuantized q_;              // params, scales [n, G], zeros [n, G], g_idx [k]; codes dropped after decode
  std::vector<float> decoded_;      // [n, k] fp32, exactly the encoded weights
  DenseLinear dense_;               // BLAS over decoded_
  const float* bias_;               // [n] or nullptr, not owned
  int64_t words_per_row_;
  std::vector<uint32_t> words_;     // [n, words_per_row_] copy of qweight
};

}  // namespace

std::unique_ptr<LinearOp> make_uniform_linear(const PackedWeight& w, const float* bias, const std::string& where) {
  UniformQuantized q = unpack_uniform(w, where);  // validates every part
  return std::make_unique<UniformLinear>(std::move(q), w.parts.at("qweight"), bias);
}

}  // namespace lowbit
