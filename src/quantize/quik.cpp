#include "quantize/quik.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/half.h"
#include "quantize/rtn.h"

namespace lowbit {

void validate_quik_options(const QuikOptions& o) {
  LOWBIT_CHECK(o.wbits == 4 || o.wbits == 8, "quik: --wbits must be 4 or 8");
  LOWBIT_CHECK(o.abits == 4 || o.abits == 8 || o.abits == 16, "quik: --abits must be 4, 8 or 16");
  LOWBIT_CHECK(!o.act_fp8 || (o.wbits == 4 && o.abits == 8), "quik: --act-fp8 needs --wbits 4 --abits 8");
  LOWBIT_CHECK(o.outlier_frac >= 0 && o.outlier_frac <= 1, "quik: --outlier-frac must be in [0, 1]");
  LOWBIT_CHECK(o.down_factor >= 0 && o.outlier_threshold >= 0, "quik: down factor and threshold must be >= 0");
}

std::vector<int32_t> quik_outlier_columns(const std::vector<double>& score, int64_t count) {
  const int64_t k = static_cast<int64_t>(score.size());
  count = std::clamp<int64_t>(count, 0, k);
  std::vector<int32_t> idx(static_cast<size_t>(k));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)]; });
  idx.resize(static_cast<size_t>(count));
  std::sort(idx.begin(), idx.end());
  return idx;
}

QuikQuantized quik_layout(int64_t n, int64_t k, const std::vector<int32_t>& outlier_cols, int wbits, int abits,
                          bool act_fp8) {
  QuikQuantized q;
  q.n = n;
  q.k = k;
  q.wbits = wbits;
  q.abits = abits;
  q.act_fp8 = act_fp8;
  q.outlier_idx = outlier_cols;
  for (size_t i = 0; i < outlier_cols.size(); ++i)
    LOWBIT_CHECK(outlier_cols[i] >= 0 && outlier_cols[i] < k && (i == 0 || outlier_cols[i] > outlier_cols[i - 1]),
                 "quik: outlier columns must be increasing and inside [0, k)");
  return q;
}

QuikQuantized quik_quantize(const float* w_in, int64_t n, int64_t k, const std::vector<double>& h,
                            const std::vector<int32_t>& outlier_cols, int wbits, int abits, bool act_fp8, bool clip,
                            double percdamp, QuikStats* stats) {
  check_weights_finite(w_in, n * k, "quik");
  LOWBIT_CHECK(h.size() == static_cast<size_t>(k * k), "quik: needs the [k, k] Hessian");
  QuikQuantized q = quik_layout(n, k, outlier_cols, wbits, abits, act_fp8);
  const std::vector<int64_t> base = q.base_columns();
  const int64_t kb = q.base(), no = q.outliers();
  // Processing order: base columns, then the outlier columns.
  std::vector<int64_t> order(base);
  for (int32_t c : outlier_cols) order.push_back(c);
  std::vector<double> hp(static_cast<size_t>(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) hp[static_cast<size_t>(i * k + j)] = h[static_cast<size_t>(order[static_cast<size_t>(i)] * k + order[static_cast<size_t>(j)])];
  GptqOptions fo;
  fo.percdamp = percdamp;
  const GptqFactor f = gptq_factor(hp, k, fo);
  std::vector<float> W(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i)
      W[static_cast<size_t>(r * k + i)] = f.dead[static_cast<size_t>(i)] ? 0.0f : w_in[r * k + order[static_cast<size_t>(i)]];

  // Per-row symmetric scale over the base columns, before any update.
  const int qmax = (1 << (wbits - 1)) - 1;
  q.scale.resize(static_cast<size_t>(n));
  std::vector<float> s(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = W.data() + r * k;
    float amax = 0;
    for (int64_t i = 0; i < kb; ++i) amax = std::max(amax, std::fabs(row[i]));
    float best_p = 1.0f;
    if (clip && amax > 0) {
      double best = -1;
      for (int step = 0; step <= 50; ++step) {
        const float p = 1.0f - 0.01f * static_cast<float>(step);
        const float sc = f16_to_f32(f32_to_f16(p * amax / static_cast<float>(qmax)));
        double e = 0;
        for (int64_t i = 0; i < kb; ++i) {
          const float c = std::clamp(std::nearbyint(row[i] / sc), static_cast<float>(-qmax - 1), static_cast<float>(qmax));
          const double d = row[i] - c * sc;
          e += d * d;
        }
        if (best < 0 || e < best) {
          best = e;
          best_p = p;
        }
      }
    }
    q.scale[static_cast<size_t>(r)] = f32_to_f16(amax > 0 ? best_p * amax / static_cast<float>(qmax) : 1.0f);
    s[static_cast<size_t>(r)] = f16_to_f32(q.scale[static_cast<size_t>(r)]);
  }

  // GPTQ over the base columns; the lazy block updates reach the outlier columns too.
  q.wq.assign(static_cast<size_t>(n * kb), 0);
  const int64_t B = 128;
  std::vector<float> err(static_cast<size_t>(n * B));
  for (int64_t i1 = 0; i1 < kb; i1 += B) {
    const int64_t i2 = std::min(kb, i1 + B), cnt = i2 - i1;
#pragma omp parallel for schedule(static) if (n * cnt >= (1 << 14))
    for (int64_t r = 0; r < n; ++r) {
      float* row = W.data() + r * k;
      const float sc = s[static_cast<size_t>(r)];
      for (int64_t i = i1; i < i2; ++i) {
        const float c = std::clamp(std::nearbyint(row[i] / sc), static_cast<float>(-qmax - 1), static_cast<float>(qmax));
        q.wq[static_cast<size_t>(r * kb + i)] = static_cast<int8_t>(c);
        const float e = static_cast<float>((row[i] - c * sc) / f.u[static_cast<size_t>(i * k + i)]);
        err[static_cast<size_t>(r * B + (i - i1))] = e;
        const float* urow = f.uf.data() + i * k;
        for (int64_t t = i + 1; t < i2; ++t) row[t] -= e * urow[t];
      }
    }
    if (i2 < k)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(k - i2),
                  static_cast<int>(cnt), -1.0f, err.data(), static_cast<int>(B), f.uf.data() + i1 * k + i2,
                  static_cast<int>(k), 1.0f, W.data() + i2, static_cast<int>(k));
  }
  q.outlier_w.resize(static_cast<size_t>(n * no));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < no; ++o) q.outlier_w[static_cast<size_t>(r * no + o)] = f32_to_f16(W[static_cast<size_t>(r * k + kb + o)]);
  q.wreduced.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) q.wreduced[static_cast<size_t>(r)] = quik_wreduced(q.scale[static_cast<size_t>(r)], q.wq.data() + r * kb, kb);
  if (stats) {
    std::vector<float> what(static_cast<size_t>(n * k));
    q.dequantize(what.data());
    stats->hessian_error = hessian_weighted_error(w_in, what.data(), n, k, h);
  }
  return q;
}

}  // namespace lowbit
