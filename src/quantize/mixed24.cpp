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

// Squared error of the non-outlier values of x under scale s and zero z.
double group_error(const float* x, const char* skip, int64_t count, float s, int z, int maxq) {
  GroupParams p;
  p.scale = s;
  p.zero = z;
  double e = 0;
  for (int64_t i = 0; i < count; ++i)
    if (!skip[i]) {
      const double d = x[i] - (s > 0 ? dequant_code(quantize_code(x[i], p, maxq), p) : 0.0f);
      e += d * d;
    }
  return e;
}

// Two-order scales of one 16-row block: the rows' fp32 scales s (> 0) get `code_bits`-bit codes on an fp16 step and
// offset (ss = (max - min) / (2^bits - 1), sm = min). Each row then takes, among the codes next to its rounded one,
// the (code, zero) pair with the least squared error on its non-outlier values.
void quantize_scales(const float* s, int64_t count, int code_bits, int maxq, const float* const* rows, const char* const* skip,
                     int64_t gc, uint8_t* code, uint8_t* zero, uint16_t* ss, uint16_t* sm) {
  float lo = s[0], hi = s[0];
  for (int64_t i = 1; i < count; ++i) {
    lo = std::min(lo, s[i]);
    hi = std::max(hi, s[i]);
  }
  const int top = (1 << code_bits) - 1;
  *sm = f32_to_f16(lo);
  *ss = f32_to_f16((hi - lo) / static_cast<float>(top));
  const float m = f16_to_f32(*sm), st = f16_to_f32(*ss);
  for (int64_t i = 0; i < count; ++i) {
    const int c0 = st > 0 ? static_cast<int>(std::clamp(std::nearbyint((s[i] - m) / st), 0.0f, static_cast<float>(top))) : 0;
    double best = -1;
    for (int c = std::max(0, c0 - 1); c <= std::min(top, c0 + 1); ++c) {
      const float sh = std::fma(static_cast<float>(c), st, m);   // the stored value's definition (layout.h)
      for (int z = 0; z <= maxq; ++z) {
        const double e = group_error(rows[i], skip[i], gc, sh, z, maxq);
        if (best < 0 || e < best) {
          best = e;
          code[i] = static_cast<uint8_t>(c);
          zero[i] = static_cast<uint8_t>(z);
        }
      }
    }
  }
}

// What quantize_grid decides for each stored group (processing order = stored order).
struct GridPlan {
  std::vector<uint8_t> bits;    // [G] 2 or 4
  std::vector<uint8_t> sbits;   // [G] 0: fp16 scale per (row, group); else the scale code's bits (two-order)
};
// Its result, in the processing order: per (row, group) zero, scale code or fp16 scale; per (16-row block, group)
// the second-order step and offset; outliers as a mask with fp16 values (their dense code is the zero point).
struct Grid {
  std::vector<uint8_t> codes, zero, scode;   // [n, k], [n, G], [n, G]
  std::vector<uint16_t> scale16, ss, sm;     // [n, G], [RG, G], [RG, G]
  std::vector<char> outlier;                 // [n, k]
  std::vector<uint16_t> out_val;             // [n, k] fp16 bits where outlier
};

// The mixed-grid GPTQ of mixed24.h on W [n, k] (already in processing order; updated in place). f: the factor of
// H in that order; hinv: diag of the damped H⁻¹ in that order.
Grid quantize_grid(std::vector<float>& W, int64_t n, int64_t k, const std::vector<double>& hinv, const GptqFactor& f,
                   const GridPlan& plan, const Mixed24Options& o) {
  const int64_t G = (k + kMixedGroup - 1) / kMixedGroup, RG = (n + kMixedRowGroup - 1) / kMixedRowGroup;
  Grid q;
  q.codes.assign(static_cast<size_t>(n * k), 0);
  q.zero.assign(static_cast<size_t>(n * G), 0);
  q.scode.assign(q.zero.size(), 0);
  q.scale16.assign(q.zero.size(), 0);
  q.ss.assign(static_cast<size_t>(RG * G), 0);
  q.sm.assign(q.ss.size(), 0);
  for (int64_t c = 0; c < k; ++c)
    if (f.dead[static_cast<size_t>(c)])
      for (int64_t r = 0; r < n; ++r) W[static_cast<size_t>(r * k + c)] = 0.0f;

  // Outliers: largest saliency err^2 / [H⁻¹]_cc of the RTN error on the original weights.
  q.outlier.assign(static_cast<size_t>(n * k), 0);
  const int64_t n_out = static_cast<int64_t>(std::llround(o.outlier_fraction * static_cast<double>(n * k)));
  if (n_out > 0) {
    std::vector<std::pair<double, int64_t>> sal;
    const std::vector<char> none(kMixedGroup, 0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int bits = plan.bits[static_cast<size_t>(g)];
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
    for (size_t i = 0; i < take; ++i) q.outlier[static_cast<size_t>(sal[i].second)] = 1;
  }
  q.out_val.assign(static_cast<size_t>(n * k), 0);

  const std::vector<double>& U = f.u;
  const std::vector<float>& Uf = f.uf;
  const int64_t B = o.block_size;
  std::vector<float> err(static_cast<size_t>(n * B)), s(static_cast<size_t>(n));
  std::vector<GroupParams> par(static_cast<size_t>(n));
  for (int64_t i1 = 0; i1 < k; i1 += B) {
    const int64_t i2 = std::min(k, i1 + B), cnt = i2 - i1;
    for (int64_t c0 = i1; c0 < i2; c0 += kMixedGroup) {
      const int64_t g = c0 / kMixedGroup, gc = std::min(kMixedGroup, k - c0);
      const int bits = plan.bits[static_cast<size_t>(g)], sbits = plan.sbits[static_cast<size_t>(g)], maxq = (1 << bits) - 1;
#pragma omp parallel for schedule(static) if (n * gc >= (1 << 12))
      for (int64_t r = 0; r < n; ++r) {
        par[static_cast<size_t>(r)] = fit(W.data() + r * k + c0, q.outlier.data() + r * k + c0, gc, bits);
        s[static_cast<size_t>(r)] = par[static_cast<size_t>(r)].scale;
      }
      if (sbits > 0) {   // two-order: scale codes per 16-row block, then the best (code, zero) of each row
#pragma omp parallel for schedule(static) if (n * gc >= (1 << 12))
        for (int64_t rg = 0; rg < RG; ++rg) {
          const int64_t r0 = rg * kMixedRowGroup, rc = std::min(kMixedRowGroup, n - r0);
          const float* rows[kMixedRowGroup];
          const char* skip[kMixedRowGroup];
          for (int64_t i = 0; i < rc; ++i) {
            rows[i] = W.data() + (r0 + i) * k + c0;
            skip[i] = q.outlier.data() + (r0 + i) * k + c0;
          }
          uint8_t code[kMixedRowGroup], zero[kMixedRowGroup];
          const size_t at = static_cast<size_t>(rg * G + g);
          quantize_scales(s.data() + r0, rc, sbits, maxq, rows, skip, gc, code, zero, &q.ss[at], &q.sm[at]);
          for (int64_t i = 0; i < rc; ++i) {
            const size_t j = static_cast<size_t>((r0 + i) * G + g);
            q.scode[j] = code[i];
            q.zero[j] = zero[i];
            GroupParams& p = par[static_cast<size_t>(r0 + i)];
            p.scale = std::fma(static_cast<float>(code[i]), f16_to_f32(q.ss[at]), f16_to_f32(q.sm[at]));
            p.zero = zero[i];
          }
        }
      } else {
        for (int64_t r = 0; r < n; ++r) {
          q.scale16[static_cast<size_t>(r * G + g)] = par[static_cast<size_t>(r)].scale_f16;
          q.zero[static_cast<size_t>(r * G + g)] = static_cast<uint8_t>(par[static_cast<size_t>(r)].zero);
        }
      }
#pragma omp parallel for schedule(static) if (n * cnt >= (1 << 12))
      for (int64_t r = 0; r < n; ++r) {
        float* row = W.data() + r * k;
        const GroupParams& p = par[static_cast<size_t>(r)];
        for (int64_t c = c0; c < c0 + gc; ++c) {
          float value;
          if (q.outlier[static_cast<size_t>(r * k + c)]) {
            q.out_val[static_cast<size_t>(r * k + c)] = f32_to_f16(row[c]);
            q.codes[static_cast<size_t>(r * k + c)] = static_cast<uint8_t>(p.zero);   // the dense part encodes 0 there
            value = f16_to_f32(q.out_val[static_cast<size_t>(r * k + c)]);
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
  return q;
}

std::vector<int64_t> identity_order(int64_t k) {
  std::vector<int64_t> id(static_cast<size_t>(k));
  std::iota(id.begin(), id.end(), 0);
  return id;
}

}  // namespace

bool mixed24_aligned_fits(int64_t k, const Mixed24Options& o) {
  return k % kAlignedUnit == 0 && k < 65536 && o.group_bits.empty() && std::abs(o.ratio_4bit - 0.25) < 1e-12;
}

Mixed24Quantized mixed24_quantize(const float* w_in, int64_t n, int64_t k, const std::vector<double>& h,
                                  const GptqFactor& f, const Mixed24Options& o, Mixed24Stats* stats) {
  check_weights_finite(w_in, n * k, "mixed24");
  LOWBIT_CHECK(k < 65536, "mixed24: k = ", k, " is too large for 16-bit outlier column indices");
  validate_mixed24_options(o);
  LOWBIT_CHECK(f.k == k && f.perm == identity_order(k), "mixed24: needs a GPTQ factor for k = ", k, " in the original column order");
  const int64_t G = (k + kMixedGroup - 1) / kMixedGroup, RG = (n + kMixedRowGroup - 1) / kMixedRowGroup;
  const std::vector<double> hinv = hinv_diagonal(f);

  Mixed24Quantized q;
  q.n = n;
  q.k = k;
  q.group_bits = o.group_bits.empty() ? allocate_4bit_groups(mixed24_group_sensitivity(w_in, n, k, hinv), o.ratio_4bit)
                                      : o.group_bits;
  LOWBIT_CHECK(static_cast<int64_t>(q.group_bits.size()) == G, "mixed24: ", q.group_bits.size(), " group widths for ", G, " groups");
  q.index();
  GridPlan plan;
  plan.bits = q.group_bits;
  for (uint8_t b : q.group_bits) plan.sbits.push_back(b == 2 ? kMixedScaleBits : 0);
  std::vector<float> W(w_in, w_in + n * k);
  const Grid grid = quantize_grid(W, n, k, hinv, f, plan, o);

  q.codes = grid.codes;
  q.zero2.assign(static_cast<size_t>(n * q.g2), 0);
  q.scode2.assign(q.zero2.size(), 0);
  q.ss2.assign(static_cast<size_t>(RG * q.g2), 0);
  q.sm2.assign(q.ss2.size(), 0);
  q.scale4.assign(static_cast<size_t>(n * q.g4), 0);
  q.zero4.assign(q.scale4.size(), 0);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t j = q.slot[static_cast<size_t>(g)];
    const bool four = q.group_bits[static_cast<size_t>(g)] == 4;
    for (int64_t r = 0; r < n; ++r) {
      const size_t from = static_cast<size_t>(r * G + g);
      if (four) {
        q.scale4[static_cast<size_t>(r * q.g4 + j)] = grid.scale16[from];
        q.zero4[static_cast<size_t>(r * q.g4 + j)] = grid.zero[from];
      } else {
        q.scode2[static_cast<size_t>(r * q.g2 + j)] = grid.scode[from];
        q.zero2[static_cast<size_t>(r * q.g2 + j)] = grid.zero[from];
      }
    }
    if (!four)
      for (int64_t rg = 0; rg < RG; ++rg) {
        q.ss2[static_cast<size_t>(rg * q.g2 + j)] = grid.ss[static_cast<size_t>(rg * G + g)];
        q.sm2[static_cast<size_t>(rg * q.g2 + j)] = grid.sm[static_cast<size_t>(rg * G + g)];
      }
  }
  if (std::find(grid.outlier.begin(), grid.outlier.end(), 1) != grid.outlier.end())
    csr_from_mask(grid.outlier, n, k, [&](int64_t r, int64_t c) { return grid.out_val[static_cast<size_t>(r * k + c)]; },
                  q.outlier_rowptr, q.outlier_col, q.outlier_val);
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

std::vector<uint16_t> mixed24a_permutation(const std::vector<double>& s, bool sensitivity_order) {
  const int64_t G = static_cast<int64_t>(s.size());
  LOWBIT_CHECK(G % 4 == 0 && G > 0, "mixed24a: ", G, " groups do not form units of four");
  const std::vector<uint8_t> bits = allocate_4bit_groups(s, 0.25);
  std::vector<int64_t> twos, fours;
  for (int64_t g = 0; g < G; ++g) (bits[static_cast<size_t>(g)] == 4 ? fours : twos).push_back(g);
  auto by_sensitivity = [&](int64_t a, int64_t b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; };
  if (sensitivity_order) {
    std::stable_sort(twos.begin(), twos.end(), by_sensitivity);
    std::stable_sort(fours.begin(), fours.end(), by_sensitivity);
  }
  std::vector<uint16_t> perm;
  for (size_t u = 0; u < fours.size(); ++u) {
    std::stable_sort(twos.begin() + static_cast<std::ptrdiff_t>(3 * u), twos.begin() + static_cast<std::ptrdiff_t>(3 * u + 3), by_sensitivity);
    for (size_t i = 0; i < 3; ++i) perm.push_back(static_cast<uint16_t>(twos[3 * u + i]));
    perm.push_back(static_cast<uint16_t>(fours[u]));
  }
  return perm;
}

Mixed24AQuantized mixed24a_quantize(const float* w_in, int64_t n, int64_t k, const std::vector<double>& h,
                                    const GptqFactor& f, const Mixed24Options& o, Mixed24Stats* stats) {
  check_weights_finite(w_in, n * k, "mixed24a");
  validate_mixed24_options(o);
  LOWBIT_CHECK(mixed24_aligned_fits(k, o), "mixed24a: the aligned layout needs k a multiple of 64 (k = ", k,
               ") and --ratio-4bit 0.25 (got ", o.ratio_4bit, ")");
  LOWBIT_CHECK(f.k == k && f.perm == identity_order(k), "mixed24a: needs a GPTQ factor for k = ", k, " in the original column order");
  LOWBIT_CHECK(h.size() == static_cast<size_t>(k * k), "mixed24a: needs the [k, k] Hessian to refactor it in the permuted order");
  const int64_t G = k / kMixedGroup;
  Mixed24AQuantized q;
  q.n = n;
  q.k = k;
  q.perm = mixed24a_permutation(mixed24_group_sensitivity(w_in, n, k, hinv_diagonal(f)), o.unit_order_by_sensitivity);
  // W and H in the stored column order, and GPTQ's factor there.
  std::vector<int64_t> col(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) col[static_cast<size_t>(c)] = int64_t{q.perm[static_cast<size_t>(c / kMixedGroup)]} * kMixedGroup + c % kMixedGroup;
  std::vector<float> W(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) W[static_cast<size_t>(r * k + c)] = w_in[r * k + col[static_cast<size_t>(c)]];
  std::vector<double> hp(static_cast<size_t>(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) hp[static_cast<size_t>(i * k + j)] = h[static_cast<size_t>(col[static_cast<size_t>(i)] * k + col[static_cast<size_t>(j)])];
  GptqOptions fo;
  fo.percdamp = o.percdamp;
  fo.block_size = o.block_size;
  const GptqFactor fp = gptq_factor(hp, k, fo);
  GridPlan plan;
  for (int64_t p = 0; p < G; ++p) {
    plan.bits.push_back(static_cast<uint8_t>(mixed24a_code_bits(p)));
    plan.sbits.push_back(static_cast<uint8_t>(mixed24a_scale_bits(p)));
  }
  Grid grid = quantize_grid(W, n, k, hinv_diagonal(fp), fp, plan, o);
  q.codes = std::move(grid.codes);
  q.zero = std::move(grid.zero);
  q.scode = std::move(grid.scode);
  q.ss = std::move(grid.ss);
  q.sm = std::move(grid.sm);
  if (std::find(grid.outlier.begin(), grid.outlier.end(), 1) != grid.outlier.end())
    csr_from_mask(grid.outlier, n, k, [&](int64_t r, int64_t c) { return grid.out_val[static_cast<size_t>(r * k + c)]; },
                  q.outlier_rowptr, q.outlier_col, q.outlier_val);
  if (stats) {
    stats->outliers = static_cast<int64_t>(q.outlier_col.size());
    std::vector<float> what(static_cast<size_t>(n * k));
    q.dequantize(what.data());
    stats->hessian_error = hessian_weighted_error(w_in, what.data(), n, k, h);
  }
  return q;
}

}  // namespace lowbit
