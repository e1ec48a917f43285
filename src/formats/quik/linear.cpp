// QuikLinear: the CPU LinearOp for a "quik" weight. forward() quantizes each token's base activations exactly as
// the reference does and runs the integer GEMM as BLAS GEMMs on integer-valued floats — exact, because every partial
// sum is an integer below 2^24: one sgemm when the whole row's bound allows it, else one sgemm per chunk of columns
// whose bound does, the chunks' exact sums added in fp64 (dgemm, below 2^53, only where a chunk would be under 256
// columns: FP8's integers) — then the same epilogue; the fp16 outlier columns go through one more GEMM. The per-token
// work (gathers, quantization, epilogue) runs on OpenMP threads. forward_ref() is quik_gemm_packed_ref.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <type_traits>

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
    // Columns per sgemm whose integer sums stay below 2^24 (exact in fp32).
    const double per_col = amax * std::ldexp(1.0, q_.wbits - 1);
    chunk_ = std::min<int64_t>(std::max<int64_t>(kb, 1), static_cast<int64_t>(16777215.0 / per_col));
    exact_in_float_ = q_.abits != 16 && (chunk_ >= kb || chunk_ >= 256);
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
#pragma omp parallel for if (m * k_ > 65536)
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
#pragma omp parallel for if (m * n_ > 65536)
      for (int64_t t = 0; t < m; ++t)
        for (int64_t r = 0; r < n_; ++r) y[t * n_ + r] = yo[static_cast<size_t>(t * n_ + r)] + (bias_ ? bias_[r] : 0.0f);
      return;
    }
    std::vector<ActQuant> aq(static_cast<size_t>(m));
    std::vector<double> acc;       // the sums in fp64 (dgemm, or chunked sgemms added up)
    std::vector<float> accf;       // the sums of one sgemm
    const auto quantize = [&](auto* xq) {   // xq [m, kb] = each token's codes as numbers
      // A row that cannot be quantized (non-finite) throws; an exception must not leave an OpenMP region, so the
      // first is carried out of it and rethrown.
      std::exception_ptr error;
#pragma omp parallel for if (m * kb > 65536)
      for (int64_t t = 0; t < m; ++t) {
        try {
          std::vector<int32_t> codes(static_cast<size_t>(kb));
          aq[static_cast<size_t>(t)] = quik_quantize_activations(xb.data() + t * kb, kb, q_.abits, q_.act_fp8, codes.data());
          for (int64_t j = 0; j < kb; ++j) xq[t * kb + j] = static_cast<std::remove_pointer_t<decltype(xq)>>(codes[static_cast<size_t>(j)]);
        } catch (...) {
#pragma omp critical(quik_linear_error)
          if (!error) error = std::current_exception();
        }
      }
      if (error) std::rethrow_exception(error);
    };
    if (exact_in_float_) {
      std::vector<float> xq(static_cast<size_t>(m * kb));
      quantize(xq.data());
      accf.assign(static_cast<size_t>(m * n_), 0.0f);
      if (kb > 0 && chunk_ < kb) acc.assign(static_cast<size_t>(m * n_), 0.0);
      for (int64_t c0 = 0; c0 < kb; c0 += chunk_) {
        const int64_t len = std::min(chunk_, kb - c0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n_), static_cast<int>(len), 1.0f,
                    xq.data() + c0, static_cast<int>(kb), wf_.data() + c0, static_cast<int>(kb), 0.0f, accf.data(),
                    static_cast<int>(n_));
        if (!acc.empty()) {
#pragma omp parallel for if (m * n_ > 65536)
          for (int64_t i = 0; i < m * n_; ++i) acc[static_cast<size_t>(i)] += accf[static_cast<size_t>(i)];
        }
      }
    } else {
      std::vector<double> xq(static_cast<size_t>(m * kb));
      quantize(xq.data());
      acc.assign(static_cast<size_t>(m * n_), 0.0);
      if (kb > 0)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n_), static_cast<int>(kb), 1.0,
                    xq.data(), static_cast<int>(kb), wd_.data(), static_cast<int>(kb), 0.0, acc.data(), static_cast<int>(n_));
    }
    const auto sum = [&](int64_t i) { return acc.empty() ? static_cast<double>(accf[static_cast<size_t>(i)]) : acc[static_cast<size_t>(i)]; };
    const double H = std::ldexp(1.0, q_.abits - 1);
#pragma omp parallel for if (m * n_ > 65536)
    for (int64_t t = 0; t < m; ++t) {
      const ActQuant& a = aq[static_cast<size_t>(t)];
      for (int64_t r = 0; r < n_; ++r) {
        const double sw = f16_to_f32(q_.scale[static_cast<size_t>(r)]), s = static_cast<double>(a.sa) * sw;
        double out = q_.act_fp8 ? s * sum(t * n_ + r) / 512.0
                                : s * sum(t * n_ + r) + (H * a.sa + a.mn) * static_cast<double>(q_.wreduced[static_cast<size_t>(r)]);
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
  int64_t chunk_ = 1;   // base columns per sgemm (exact_in_float_)
  std::vector<float> wf_, wo_;
  std::vector<double> wd_;
};

}  // namespace

std::unique_ptr<LinearOp> make_quik_linear(const PackedWeight& w, const float* bias, const std::string& where) {
  return std::make_unique<QuikLinear>(w, unpack_quik(w, where), bias);
}

}  // namespace lowbit
