// QuikLinear: the CPU LinearOp for a "quik" weight. forward() quantizes each token's base activations exactly as
// the reference does and runs the integer GEMM as a BLAS GEMM on integer-valued floats — exact, because every
// partial sum is an integer below 2^24 (sgemm) or 2^53 (dgemm, chosen when the bound needs it) — then the same
// epilogue; the fp16 outlier columns go through one more GEMM. forward_ref() is quik_gemm_packed_ref.
#include <cblas.h>

#include <cmath>

#include "core/half.h"
#include "formats/quik/layout.h"

namespace lowbit {
namespace {

class QuikLinear final : public LinearOp {
 public:
  QuikLinear(const PackedWeight& w, QuikQuantized q, const float* bias)
      : LinearOp(q.n, q.k), packed_(w), q_(std::move(q)), bias_(bias), base_(q_.base_columns()) {
    const int64_t kb = q_.base(), no = q_.outliers();
    const double amax = q_.act_fp8 ? 229376.0 : std::ldexp(1.0, q_.abits == 16 ? 0 : q_.abits - 1);
    exact_in_float_ = q_.abits != 16 && static_cast<double>(kb) * amax * std::ldexp(1.0, q_.wbits - 1) < 16777216.0;
    if (q_.abits == 16 || exact_in_float_) {
      wf_.resize(static_cast<size_t>(n_ * kb));
      for (int64_t r = 0; r < n_; ++r) {
        const float s = q_.abits == 16 ? f16_to_f32(q_.scale[static_cast<size_t>(r)]) : 1.0f;
        for (int64_t j = 0; j < kb; ++j) wf_[static_cast<size_t>(r * kb + j)] = s * static_cast<float>(q_.wq[static_cast<size_t>(r * kb + j)]);
      }
    } else {
      wd_.assign(q_.wq.begin(), q_.wq.end());
    }
    wo_.resize(static_cast<size_t>(n_ * no));
    for (size_t i = 0; i < wo_.size(); ++i) wo_[i] = f16_to_f32(q_.outlier_w[i]);
  }

  void forward(const float* x, int64_t m, float* y, int) const override {
    const int64_t kb = q_.base(), no = q_.outliers();
    std::vector<float> xb(static_cast<size_t>(m * kb)), xo(static_cast<size_t>(m * no)), yo(static_cast<size_t>(m * n_), 0.0f);
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t j = 0; j < kb; ++j) xb[static_cast<size_t>(t * kb + j)] = x[t * k_ + base_[static_cast<size_t>(j)]];
      for (int64_t o = 0; o < no; ++o)
        xo[static_cast<size_t>(t * no + o)] = f16_to_f32(f32_to_f16(x[t * k_ + q_.outlier_idx[static_cast<size_t>(o)]]));
    }
    if (no > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n_), static_cast<int>(no), 1.0f,
                  xo.data(), static_cast<int>(no), wo_.data(), static_cast<int>(no), 0.0f, yo.data(), static_cast<int>(n_));
    if (q_.abits == 16) {
      if (kb > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n_), static_cast<int>(kb), 1.0f,
                    xb.data(), static_cast<int>(kb), wf_.data(), static_cast<int>(kb), 1.0f, yo.data(), static_cast<int>(n_));
      for (int64_t t = 0; t < m; ++t)
        for (int64_t r = 0; r < n_; ++r) y[t * n_ + r] = yo[static_cast<size_t>(t * n_ + r)] + (bias_ ? bias_[r] : 0.0f);
      return;
    }
    std::vector<int32_t> codes(static_cast<size_t>(kb));
    std::vector<ActQuant> aq(static_cast<size_t>(m));
    std::vector<double> acc(static_cast<size_t>(m * n_), 0.0);
    if (exact_in_float_) {
      std::vector<float> xq(static_cast<size_t>(m * kb)), accf(static_cast<size_t>(m * n_), 0.0f);
      for (int64_t t = 0; t < m; ++t) {
        aq[static_cast<size_t>(t)] = quik_quantize_activations(xb.data() + t * kb, kb, q_.abits, q_.act_fp8, codes.data());
        for (int64_t j = 0; j < kb; ++j) xq[static_cast<size_t>(t * kb + j)] = static_cast<float>(codes[static_cast<size_t>(j)]);
      }
      if (kb > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n_), static_cast<int>(kb), 1.0f,
                    xq.data(), static_cast<int>(kb), wf_.data(), static_cast<int>(kb), 0.0f, accf.data(), static_cast<int>(n_));
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = accf[i];
    } else {
      std::vector<double> xq(static_cast<size_t>(m * kb));
      for (int64_t t = 0; t < m; ++t) {
        aq[static_cast<size_t>(t)] = quik_quantize_activations(xb.data() + t * kb, kb, q_.abits, q_.act_fp8, codes.data());
        for (int64_t j = 0; j < kb; ++j) xq[static_cast<size_t>(t * kb + j)] = static_cast<double>(codes[static_cast<size_t>(j)]);
      }
      if (kb > 0)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n_), static_cast<int>(kb), 1.0,
                    xq.data(), static_cast<int>(kb), wd_.data(), static_cast<int>(kb), 0.0, acc.data(), static_cast<int>(n_));
    }
    const double H = std::ldexp(1.0, q_.abits - 1);
    for (int64_t t = 0; t < m; ++t) {
      const ActQuant& a = aq[static_cast<size_t>(t)];
      for (int64_t r = 0; r < n_; ++r) {
        const double sw = f16_to_f32(q_.scale[static_cast<size_t>(r)]), s = static_cast<double>(a.sa) * sw;
        double out = q_.act_fp8 ? s * acc[static_cast<size_t>(t * n_ + r)] / 512.0
                                : s * acc[static_cast<size_t>(t * n_ + r)] + (H * a.sa + a.mn) * static_cast<double>(q_.wreduced[static_cast<size_t>(r)]);
        out += static_cast<double>(yo[static_cast<size_t>(t * n_ + r)]) + (bias_ ? bias_[r] : 0.0);
        y[t * n_ + r] = static_cast<float>(out);
      }
    }
  }
  void forward_ref(const float* x, int64_t m, float* y, int) const override { quik_gemm_packed_ref(packed_, x, m, bias_, y); }

 private:
  PackedWeight packed_;   // views into the loaded file (kept alive by the model)
  QuikQuantized q_;
  const float* bias_;
  std::vector<int64_t> base_;
  bool exact_in_float_ = false;
  std::vector<float> wf_, wo_;
  std::vector<double> wd_;
};

}  // namespace

std::unique_ptr<LinearOp> make_quik_linear(const PackedWeight& w, const float* bias, const std::string& where) {
  return std::make_unique<QuikLinear>(w, unpack_quik(w, where), bias);
}

}  // namespace lowbit
