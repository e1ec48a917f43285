// Mixed24ALinear: the CPU LinearOp for a "mixed24a" weight. forward() decodes the weight once to fp32 in the original
// column order (exactly the encoded values) and runs BLAS; forward_ref() is mixed24a_gemm_packed_ref, the GEMM
// straight from the packed parts that the CUDA kernel is checked against.
#include "formats/mixed24a/layout.h"

namespace lowbit {
namespace {

class Mixed24ALinear final : public LinearOp {
 public:
  Mixed24ALinear(const PackedWeight& w, Mixed24AQuantized q, const float* bias)
      : LinearOp(q.n, q.k), packed_(w), decoded_(static_cast<size_t>(n_ * k_)), dense_(decoded_.data(), bias, n_, k_), bias_(bias) {
    q.dequantize(decoded_.data());
  }
  void forward(const float* x, int64_t m, float* y, int) const override { dense_.forward(x, m, y); }
  void forward_ref(const float* x, int64_t m, float* y, int) const override {
    mixed24a_gemm_packed_ref(packed_, x, m, bias_, y);
  }

 private:
  PackedWeight packed_;   // views into the loaded file (kept alive by the model)
  std::vector<float> decoded_;
  DenseLinear dense_;
  const float* bias_;
};

}  // namespace

std::unique_ptr<LinearOp> make_mixed24a_linear(const PackedWeight& w, const float* bias, const std::string& where) {
  return std::make_unique<Mixed24ALinear>(w, unpack_mixed24a(w, where), bias);
}

}  // namespace lowbit
