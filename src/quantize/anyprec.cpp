#include "quantize/anyprec.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/half.h"
#include "formats/pack_util.h"
#include "quantize/anyprec_row.h"
#include "quantize/rtn.h"

namespace lowbit {

static_assert(anyprec_row::kMaxBits == kAnyPrecMaxBits && anyprec_row::kExactMaxClusters == kAnyPrecExactMaxClusters,
              "the shared row core and anyprec.h must agree on the code width and the exact-seed limit");

namespace {

// Per-thread storage behind anyprec_row::RowScratch for rows of up to k values and seeds of up to K clusters.
struct RowBuffers {
  std::vector<float> xs;
  std::vector<double> ws, pw, pwx, pwxx, dp_prev, dp_cur, centroids, c16;
  std::vector<int32_t> dp_arg;
  std::vector<int64_t> start, next;
  std::vector<uint16_t> lut, next_lut;

  anyprec_row::RowScratch scratch(int64_t k, int K, bool exact) {
    const auto kk = static_cast<size_t>(k);
    xs.resize(kk);
    ws.resize(kk);
    for (auto* v : {&pw, &pwx, &pwxx}) v->resize(kk + 1);
    if (exact) {
      dp_prev.resize(kk + 1);
      dp_cur.resize(kk + 1);
      dp_arg.resize(static_cast<size_t>(K - 1) * (kk + 1));
    }
    const auto small = static_cast<size_t>(anyprec_row::kMaxClusters) + 1;
    for (auto* v : {&start, &next}) v->resize(std::max(small, static_cast<size_t>(K) + 1));
    for (auto* v : {&centroids, &c16}) v->resize(std::max(small, static_cast<size_t>(K)));
    for (auto* v : {&lut, &next_lut}) v->resize(small);
    return {xs.data(), ws.data(), {pw.data(), pwx.data(), pwxx.data()}, {dp_prev.data(), dp_cur.data(), dp_arg.data()},
            start.data(), next.data(), centroids.data(), c16.data(), lut.data(), next_lut.data()};
  }
};

}  // namespace

KMeans1D weighted_kmeans_1d(const float* x, const double* w, int64_t m, int K, int max_iter, bool exact) {
  LOWBIT_CHECK(K >= 1 && m >= 0 && max_iter >= 0, "weighted_kmeans_1d: bad arguments");
  LOWBIT_CHECK(m < (int64_t{1} << 31), "weighted_kmeans_1d: ", m, " values (at most 2^31 - 1)");
  KMeans1D km;
  km.start.assign(static_cast<size_t>(K) + 1, m);
  km.start[0] = 0;
  if (m == 0) {
    km.centroids.assign(static_cast<size_t>(K), 0.0);
    km.objective.push_back(0.0);
    return km;
  }
  std::vector<double> pw(static_cast<size_t>(m) + 1), pwx(pw.size()), pwxx(pw.size());
  anyprec_row::Prefix P{pw.data(), pwx.data(), pwxx.data()};
  P.build(x, w, m);
  std::vector<double> prev, cur;
  std::vector<int32_t> arg;
  if (exact) {
    prev.resize(pw.size());
    cur.resize(pw.size());
    arg.resize(static_cast<size_t>(K - 1) * pw.size());
  }
  std::vector<int64_t> next(km.start.size());
  // Lloyd stops when the assignment repeats, long before a large cap: room for the first 4096 objectives.
  const int objective_cap = std::min(max_iter, 4095) + 1;
  std::vector<double> objective(static_cast<size_t>(objective_cap));
  km.centroids.resize(static_cast<size_t>(K));
  km.iterations = anyprec_row::kmeans<anyprec_row::SerialLoops>(
      x, P, m, K, max_iter, exact, {prev.data(), cur.data(), arg.data()}, km.start.data(), next.data(),
      km.centroids.data(), objective.data(), objective_cap);
  km.objective.assign(objective.begin(), objective.begin() + std::min(km.iterations + 1, objective_cap));
  return km;
}

uint32_t anyprec_width_mask(const AnyPrecOptions& o) {
  LOWBIT_CHECK(o.seed_bits >= kAnyPrecMinBits && o.seed_bits <= kAnyPrecMaxBits, "--seed-bits must be in 2..8 (got ",
               o.seed_bits, ")");
  LOWBIT_CHECK(o.parent_bits >= o.seed_bits && o.parent_bits <= kAnyPrecMaxBits, "--parent-bits must be in ",
               o.seed_bits, "..8 (got ", o.parent_bits, ")");
  LOWBIT_CHECK(o.outlier_fraction >= 0 && o.outlier_fraction < 0.5, "--outliers must be a fraction in [0, 0.5)");
  LOWBIT_CHECK(o.max_iter >= 0, "k-means iteration cap must be >= 0");
  uint32_t mask = 0;
  if (o.widths.empty())
    for (int b = o.seed_bits; b <= o.parent_bits; ++b) mask |= 1u << b;
  for (int b : o.widths) {
    LOWBIT_CHECK(b >= o.seed_bits && b <= o.parent_bits, "--widths: ", b, " is outside seed..parent = ", o.seed_bits,
                 "..", o.parent_bits);
    mask |= 1u << b;
  }
  LOWBIT_CHECK((mask >> o.parent_bits) & 1u, "--widths must include the parent width ", o.parent_bits,
               " (planes past the widest served width would be stored for nothing)");
  return mask;
}

namespace {

template <typename Par>
AnyPrecQuantized quantize(const float* w, const float* sens, int64_t n, int64_t k, const AnyPrecOptions& o) {
  const uint32_t mask = anyprec_width_mask(o);
  LOWBIT_CHECK(k < (int64_t{1} << 31), "anyprec: rows of ", k, " values (at most 2^31 - 1)");
  check_weights_finite(w, n * k, "anyprec");
  for (int64_t i = 0; i < n * k; ++i)
    LOWBIT_CHECK(std::isfinite(sens[i]) && sens[i] >= 0, "anyprec: sensitivity ", i, " is ", sens[i],
                 " (needs a finite non-negative value)");
  AnyPrecQuantized q;
  q.n = n;
  q.k = k;
  q.planes = o.parent_bits;
  q.widths = mask;
  q.codes.assign(static_cast<size_t>(n * k), 0);
  for (int b = o.seed_bits; b <= o.parent_bits; ++b)
    if ((mask >> b) & 1u) q.luts[b].assign(static_cast<size_t>(n << b), 0);

  // Dense-and-sparse: the `outlier_fraction` largest sensitivities of the matrix (ties broken by position).
  std::vector<char> outlier;
  const int64_t n_out = static_cast<int64_t>(std::llround(o.outlier_fraction * static_cast<double>(n * k)));
  if (n_out > 0) {
    std::vector<int64_t> idx(static_cast<size_t>(n * k));
    std::iota(idx.begin(), idx.end(), 0);
    std::nth_element(idx.begin(), idx.begin() + n_out - 1, idx.end(), [&](int64_t a, int64_t b) {
      return sens[a] != sens[b] ? sens[a] > sens[b] : a < b;
    });
    outlier.assign(static_cast<size_t>(n * k), 0);
    for (int64_t i = 0; i < n_out; ++i) outlier[static_cast<size_t>(idx[static_cast<size_t>(i)])] = 1;
    csr_from_mask(outlier, n, k, [&](int64_t r, int64_t c) { return f32_to_f16(w[r * k + c]); }, q.outlier_rowptr,
                  q.outlier_col, q.outlier_val);
  }

  const anyprec_row::RowParams params{o.seed_bits, o.parent_bits, o.max_iter, mask};
  const int seed_clusters = 1 << o.seed_bits;
  const bool exact = seed_clusters <= kAnyPrecExactMaxClusters;
  uint16_t* luts[kAnyPrecMaxBits + 1] = {};
  for (auto& [b, lut] : q.luts) luts[b] = lut.data();
#pragma omp parallel
  {
    std::vector<int32_t> order;
    RowBuffers buffers;
    anyprec_row::RowScratch scratch = buffers.scratch(k, seed_clusters, exact);
#pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < n; ++r) {
      const float* wr = w + r * k;
      order.clear();
      for (int64_t c = 0; c < k; ++c)
        if (outlier.empty() || !outlier[static_cast<size_t>(r * k + c)]) order.push_back(static_cast<int32_t>(c));
      // Ascending by value, equal values by column: a defined order, which the GPU's stable segmented sort
      // reproduces (the prefix sums, hence the centroids' last bits, depend on the order of equal values).
      std::sort(order.begin(), order.end(),
                [&](int32_t a, int32_t b) { return wr[a] < wr[b] || (wr[a] == wr[b] && a < b); });
      anyprec_row::quantize_row<Par>(wr, sens + r * k, order.data(), static_cast<int64_t>(order.size()), params,
                                     scratch, r, q.codes.data() + r * k, luts);
    }
  }
  return q;
}

}  // namespace

AnyPrecQuantized anyprec_quantize(const float* w, const float* sens, int64_t n, int64_t k, const AnyPrecOptions& o) {
  return quantize<anyprec_row::SerialLoops>(w, sens, n, k, o);
}

AnyPrecQuantized anyprec_quantize_emulating_warp(const float* w, const float* sensitivity, int64_t n, int64_t k,
                                                 const AnyPrecOptions& o) {
  return quantize<anyprec_row::EmulatedLanes<32>>(w, sensitivity, n, k, o);
}

double anyprec_weighted_error(const float* w, const float* sens, const AnyPrecQuantized& q, int b) {
  LOWBIT_CHECK(q.serves(b), "anyprec: width ", b, " is not served");
  // The values are AnyPrecQuantized::value's, read without its per-weight lookups: the row's b-bit table widened to
  // fp32 once, and the row's outliers (columns increasing) walked beside the columns. Per-row sums in parallel, added
  // in row order: the same total for any thread count.
  const std::vector<uint16_t>& lut = q.luts.at(b);
  const int shift = q.planes - b;
  const bool sparse = !q.outlier_rowptr.empty();
  std::vector<double> rows(static_cast<size_t>(q.n), 0.0);
#pragma omp parallel for schedule(static) if (q.n * q.k > 65536)
  for (int64_t r = 0; r < q.n; ++r) {
    float table[256];
    for (int i = 0; i < (1 << b); ++i) table[i] = f16_to_f32(lut[static_cast<size_t>((r << b) + i)]);
    int64_t o = sparse ? q.outlier_rowptr[static_cast<size_t>(r)] : 0;
    const int64_t o_end = sparse ? q.outlier_rowptr[static_cast<size_t>(r + 1)] : 0;
    const uint8_t* codes = q.codes.data() + r * q.k;
    double e = 0;
    for (int64_t c = 0; c < q.k; ++c) {
      float v;
      if (o < o_end && q.outlier_col[static_cast<size_t>(o)] == c) {
        v = f16_to_f32(q.outlier_val[static_cast<size_t>(o)]);
        ++o;
      } else {
        v = table[codes[c] >> shift];
      }
      const double d = static_cast<double>(w[r * q.k + c]) - v;
      e += sens[r * q.k + c] * d * d;
    }
    rows[static_cast<size_t>(r)] = e;
  }
  double e = 0;
  for (double v : rows) e += v;
  return e;
}

}  // namespace lowbit
