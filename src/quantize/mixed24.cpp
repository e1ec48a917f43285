#include "quantize/mixed24.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/half.h"
#include "formats/pack_util.h"
#include "quantize/rtn.h"

namespace lowbit {

std::vector<double> hinv_diagonal(const GptqFactor& f) {
  const int64_t k = f.k;
  std::vector<double> d(static_cast<size_t>(k), 0.0);
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = r; c < k; ++c) d[static_cast<size_t>(c)] += f.u[static_cast<size_t>(r * k + c)] * f.u[static_cast<size_t>(r * k + c)];
  return d;
}

std::vector<double> mixed24_group_sensitivity(const float* w, int64_t n, int64_t k, const std::vector<double>& hinv) {
  const int64_t G = (k + kMixedGroup - 1) / kMixedGroup;
  std::vector<double> col(static_cast<size_t>(k), 0.0), s(static_cast<size_t>(G), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) col[static_cast<size_t>(c)] += static_cast<double>(w[r * k + c]) * w[r * k + c];
  for (int64_t c = 0; c < k; ++c)
    s[static_cast<size_t>(c / kMixedGroup)] += col[static_cast<size_t>(c)] / (hinv[static_cast<size_t>(c)] * hinv[static_cast<size_t>(c)]);
  return s;
}

void validate_mixed24_options(const Mixed24Options& o) {
  LOWBIT_CHECK(o.ratio_4bit >= 0 && o.ratio_4bit <= 1, "--ratio-4bit must be in [0, 1]");
  LOWBIT_CHECK(o.outlier_fraction >= 0 && o.outlier_fraction <= 0.02, "--outliers for mixed24 must be in [0, 0.02]");
  LOWBIT_CHECK(o.block_size > 0 && o.block_size % kMixedGroup == 0, "mixed24: block size must be a multiple of 16");
}

std::vector<uint8_t> allocate_4bit_groups(const std::vector<double>& s, double ratio) {
  LOWBIT_CHECK(ratio >= 0 && ratio <= 1, "--ratio-4bit must be in [0, 1]");
  const size_t G = s.size(), n4 = static_cast<size_t>(std::llround(ratio * static_cast<double>(G)));
  std::vector<size_t> idx(G);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return s[a] > s[b]; });
  std::vector<uint8_t> bits(G, 2);
  for (size_t i = 0; i < n4; ++i) bits[idx[i]] = 4;
  return bits;
}

namespace {

// Asymmetric parameters of the non-outlier values among x[0..count) (all outliers: the GPTQ default range).
GroupParams fit(const float* x, const char* skip, int64_t count, int bits) {
  UniformSpec spec;
  spec.bits = bits;
  float buf[kMixedGroup];
  int64_t m = 0;
  for (int64_t i = 0; i < count; ++i)
    if (!skip[i]) buf[m++] = x[i];
  return find_group_params(buf, m, 1, spec);
}

// Quantizes fp32 scale s (> 0) of 16 rows to 4-bit codes with an fp16 step and offset; returns the decoded ŝ.
void quantize_scales(const float* s, int64_t count, uint8_t* code, uint16_t* ss, uint16_t* sm, float* s_hat) {
  float lo = s[0], hi = s[0];
  for (int64_t i = 1; i < count; ++i) {
    lo = std::min(lo, s[i]);
    hi = std::max(hi, s[i]);
  }
  *sm = f32_to_f16(lo);
  *ss = f32_to_f16((hi - lo) / static_cast<float>((1 << kMixedScaleBits) - 1));
  const float m = f16_to_f32(*sm), st = f16_to_f32(*ss);
  for (int64_t i = 0; i < count; ++i) {
    const float q = st > 0 ? std::nearbyint((s[i] - m) / st) : 0.0f;
    code[i] = static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>((1 << kMixedScaleBits) - 1)));
    s_hat[i] = std::fma(static_cast<float>(code[i]), st, m);   // the stored value's definition (layout.h)
  }
}

}  // namespace

Mixed24Quantized mixed24_quantize(const float* w_in, int64_t n, int64_t k, const std::vector<double>& h,
                                  const GptqFactor& f, const Mixed24Options& o, Mixed24Stats* stats) {
  check_weights_finite(w_in, n * k, "mixed24");
  LOWBIT_CHECK(k < 65536, "mixed24: k = ", k, " is too large for 16-bit outlier column indices");
  validate_mixed24_options(o);
  std::vector<int64_t> identity(static_cast<size_t>(k));
  std::iota(identity.begin(), identity.end(), 0);
  LOWBIT_CHECK(f.k == k && f.perm == identity, "mixed24: needs a GPTQ factor for k = ", k, " in the original column order");
  const int64_t G = (k + kMixedGroup - 1) / kMixedGroup, RG = (n + kMixedRowGroup - 1) / kMixedRowGroup;
  const std::vector<double> hinv = hinv_diagonal(f);

  Mixed24Quantized q;
  q.n = n;
  q.k = k;
  q.group_bits = o.group_bits.empty() ? allocate_4bit_groups(mixed24_group_sensitivity(w_in, n, k, hinv), o.ratio_4bit)
                                      : o.group_bits;
  LOWBIT_CHECK(static_cast<int64_t>(q.group_bits.size()) == G, "mixed24: ", q.group_bits.size(), " group widths for ", G, " groups");
  q.index();
  q.codes.assign(static_cast<size_t>(n * k), 0);
  q.zero2.assign(static_cast<size_t>(n * q.g2), 0);
  q.scode2.assign(q.zero2.size(), 0);
  q.ss2.assign(static_cast<size_t>(RG * q.g2), 0);
  q.sm2.assign(q.ss2.size(), 0);
  q.scale4.assign(static_cast<size_t>(n * q.g4), 0);
  q.zero4.assign(q.scale4.size(), 0);

  std::vector<float> W(w_in, w_in + n * k);
  for (int64_t c = 0; c < k; ++c)
    if (f.dead[static_cast<size_t>(c)])
      for (int64_t r = 0; r < n; ++r) W[static_cast<size_t>(r * k + c)] = 0.0f;

  // Outliers: largest saliency err^2 / [H⁻¹]_cc of the RTN error on the original weights.
  std::vector<char> outlier(static_cast<size_t>(n * k), 0);
  const int64_t n_out = static_cast<int64_t>(std::llround(o.outlier_fraction * static_cast<double>(n * k)));
  if (n_out > 0) {
    std::vector<std::pair<double, int64_t>> sal;
    const std::vector<char> none(kMixedGroup, 0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int bits = q.group_bits[static_cast<size_t>(g)];
        if (bits == 4 && !o.outliers_from_all_groups) continue;
        const int64_t c0 = g * kMixedGroup, cnt = std::min(kMixedGroup, k - c0);
        const GroupParams p = fit(W.data() + r * k + c0, none.data(), cnt, bits);
        for (int64_t c = c0; c < c0 + cnt; ++c) {
          const double e = W[static_cast<size_t>(r * k + c)] - dequant_code(quantize_code(W[static_cast<size_t>(r * k + c)], p, (1 << bits) - 1), p);
          sal.push_back({e * e / hinv[static_cast<size_t>(c)], r * k + c});
        }
      }
    const size_t take = std::min(sal.size(), static_cast<size_t>(n_out));
    std::nth_element(sal.begin(), sal.begin() + static_cast<std::ptrdiff_t>(take) - (take > 0), sal.end(),
                     [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    for (size_t i = 0; i < take; ++i) outlier[static_cast<size_t>(sal[i].second)] = 1;
  }
  std::vector<uint16_t> out_val(static_cast<size_t>(n * k), 0);

  const std::vector<double>& U = f.u;
  const std::vector<float>& Uf = f.uf;
  const int64_t B = o.block_size;
  std::vector<float> err(static_cast<size_t>(n * B)), s(static_cast<size_t>(n)), s_hat(static_cast<size_t>(n));
  std::vector<GroupParams> par(static_cast<size_t>(n));
  for (int64_t i1 = 0; i1 < k; i1 += B) {
    const int64_t i2 = std::min(k, i1 + B), cnt = i2 - i1;
    for (int64_t c0 = i1; c0 < i2; c0 += kMixedGroup) {
      const int64_t g = c0 / kMixedGroup, gc = std::min(kMixedGroup, k - c0), j = q.slot[static_cast<size_t>(g)];
      const int bits = q.group_bits[static_cast<size_t>(g)], maxq = (1 << bits) - 1;
#pragma omp parallel for schedule(static) if (n * gc >= (1 << 12))
      for (int64_t r = 0; r < n; ++r) {
        par[static_cast<size_t>(r)] = fit(W.data() + r * k + c0, outlier.data() + r * k + c0, gc, bits);
        s[static_cast<size_t>(r)] = par[static_cast<size_t>(r)].scale;
      }
      if (bits == 2) {
        for (int64_t rg = 0; rg < RG; ++rg) {
          const int64_t r0 = rg * kMixedRowGroup, rc = std::min(kMixedRowGroup, n - r0);
          uint8_t code[kMixedRowGroup];
          quantize_scales(s.data() + r0, rc, code, &q.ss2[static_cast<size_t>(rg * q.g2 + j)],
                          &q.sm2[static_cast<size_t>(rg * q.g2 + j)], s_hat.data() + r0);
          for (int64_t i = 0; i < rc; ++i) q.scode2[static_cast<size_t>((r0 + i) * q.g2 + j)] = code[i];
        }
        // Zeros refitted to the quantized scale: z = round(-min/ŝ) over the row's non-outlier values.
        for (int64_t r = 0; r < n; ++r) {
          GroupParams& p = par[static_cast<size_t>(r)];
          p.scale = s_hat[static_cast<size_t>(r)];
          float lo = 0.0f;
          for (int64_t c = c0; c < c0 + gc; ++c)
            if (!outlier[static_cast<size_t>(r * k + c)]) lo = std::min(lo, W[static_cast<size_t>(r * k + c)]);
          p.zero = p.scale > 0 ? std::clamp(static_cast<int>(std::nearbyint(-lo / p.scale)), 0, maxq) : 0;
          q.zero2[static_cast<size_t>(r * q.g2 + j)] = static_cast<uint8_t>(p.zero);
        }
      } else {
        for (int64_t r = 0; r < n; ++r) {
          q.scale4[static_cast<size_t>(r * q.g4 + j)] = par[static_cast<size_t>(r)].scale_f16;
          q.zero4[static_cast<size_t>(r * q.g4 + j)] = static_cast<uint8_t>(par[static_cast<size_t>(r)].zero);
        }
      }
#pragma omp parallel for schedule(static) if (n * cnt >= (1 << 12))
      for (int64_t r = 0; r < n; ++r) {
        float* row = W.data() + r * k;
        const GroupParams& p = par[static_cast<size_t>(r)];
        for (int64_t c = c0; c < c0 + gc; ++c) {
          float value;
          if (outlier[static_cast<size_t>(r * k + c)]) {
            out_val[static_cast<size_t>(r * k + c)] = f32_to_f16(row[c]);
            value = f16_to_f32(out_val[static_cast<size_t>(r * k + c)]);
          } else {
            const int code = p.scale > 0 ? quantize_code(row[c], p, maxq) : p.zero;
            q.codes[static_cast<size_t>(r * k + c)] = static_cast<uint8_t>(code);
            value = (static_cast<float>(code) - static_cast<float>(p.zero)) * p.scale;
          }
          if (!o.error_feedback) continue;
          const float e = static_cast<float>((row[c] - value) / U[static_cast<size_t>(c * k + c)]);
          err[static_cast<size_t>(r * B + (c - i1))] = e;
          const float* urow = Uf.data() + c * k;
          for (int64_t t = c + 1; t < i2; ++t) row[t] -= e * urow[t];
        }
      }
    }
    if (o.error_feedback && i2 < k)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(k - i2),
                  static_cast<int>(cnt), -1.0f, err.data(), static_cast<int>(B), Uf.data() + i1 * k + i2,
                  static_cast<int>(k), 1.0f, W.data() + i2, static_cast<int>(k));
  }
  if (n_out > 0) {
    csr_from_mask(outlier, n, k, [&](int64_t r, int64_t c) { return out_val[static_cast<size_t>(r * k + c)]; },
                  q.outlier_rowptr, q.outlier_col, q.outlier_val);
  }
  if (stats) {
    stats->outliers = static_cast<int64_t>(q.outlier_col.size());
    if (!h.empty()) {
      std::vector<float> what(static_cast<size_t>(n * k));
      q.dequantize(what.data());
      stats->hessian_error = hessian_weighted_error(w_in, what.data(), n, k, h);
    }
  }
  return q;
}

}  // namespace lowbit
