#include "quantize/anyprec.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/half.h"
#include "formats/pack_util.h"
#include "quantize/rtn.h"

namespace lowbit {

namespace {

// Prefix sums of w, w x, w x^2 over sorted values: the weighted SSE of any contiguous range in O(1).
struct Prefix {
  std::vector<double> w, wx, wxx;
  Prefix(const float* x, const double* wt, int64_t m) : w(m + 1, 0.0), wx(m + 1, 0.0), wxx(m + 1, 0.0) {
    for (int64_t i = 0; i < m; ++i) {
      w[i + 1] = w[i] + wt[i];
      wx[i + 1] = wx[i] + wt[i] * x[i];
      wxx[i + 1] = wxx[i] + wt[i] * static_cast<double>(x[i]) * x[i];
    }
  }
  double weight(int64_t a, int64_t b) const { return w[b] - w[a]; }
  double mean(int64_t a, int64_t b) const { return (wx[b] - wx[a]) / (w[b] - w[a]); }
  double cost(int64_t a, int64_t b, double c) const {   // Σ w (x - c)^2 over [a, b)
    if (b <= a) return 0.0;
    return std::max(0.0, (wxx[b] - wxx[a]) - 2.0 * c * (wx[b] - wx[a]) + c * c * (w[b] - w[a]));
  }
  double sse(int64_t a, int64_t b) const { return b > a ? cost(a, b, mean(a, b)) : 0.0; }
};

// The optimal cut p of [a, b) into [a, p) and [p, b) (a weighted 2-means; never between equal values), or -1 when
// the range holds fewer than two distinct values.
int64_t best_cut(const float* x, const Prefix& P, int64_t a, int64_t b, double* cost_out = nullptr) {
  int64_t best = -1;
  double best_cost = 0;
  for (int64_t p = a + 1; p < b; ++p) {
    if (x[p - 1] == x[p]) continue;
    const double c = P.sse(a, p) + P.sse(p, b);
    if (best < 0 || c < best_cost) {
      best = p;
      best_cost = c;
    }
  }
  if (cost_out) *cost_out = best_cost;
  return best;
}

// Centroids of the ranges; an empty range takes its left neighbour's centroid (or the first value).
void update_centroids(const float* x, const Prefix& P, const std::vector<int64_t>& start, std::vector<double>& c) {
  const size_t K = start.size() - 1;
  c.resize(K);
  for (size_t j = 0; j < K; ++j) {
    if (start[j + 1] > start[j]) c[j] = P.mean(start[j], start[j + 1]);
    else c[j] = j > 0 ? c[j - 1] : static_cast<double>(x[0]);
  }
}

// Replaces empty ranges by splitting the range of largest SSE at its optimal cut, while one can be split.
void fill_empty_clusters(const float* x, const Prefix& P, std::vector<int64_t>& start) {
  for (;;) {
    const size_t K = start.size() - 1;
    size_t empty = K;
    for (size_t j = 0; j < K && empty == K; ++j)
      if (start[j + 1] == start[j]) empty = j;
    if (empty == K) return;
    size_t worst = K;
    double worst_sse = 0;
    for (size_t j = 0; j < K; ++j) {
      const double s = P.sse(start[j], start[j + 1]);
      if (s > worst_sse && best_cut(x, P, start[j], start[j + 1]) >= 0) {
        worst_sse = s;
        worst = j;
      }
    }
    if (worst == K) return;   // nothing left to split: fewer distinct values than clusters
    const int64_t cut = best_cut(x, P, start[worst], start[worst + 1]);
    // Remove the empty range's boundary, add the cut: the list of boundaries stays sorted.
    start.erase(start.begin() + static_cast<std::ptrdiff_t>(empty));
    start.insert(std::upper_bound(start.begin(), start.end() - 1, cut), cut);
  }
}

double total_cost(const Prefix& P, const std::vector<int64_t>& start, const std::vector<double>& c) {
  double s = 0;
  for (size_t j = 0; j + 1 < start.size(); ++j) s += P.cost(start[j], start[j + 1], c[j]);
  return s;
}

// Boundaries that send every value to its nearest centroid (centroids ascending; ties go left).
void assign_nearest(const float* x, int64_t m, const std::vector<double>& c, std::vector<int64_t>& start) {
  const size_t K = c.size();
  start.assign(K + 1, 0);
  start[K] = m;
  for (size_t j = 1; j < K; ++j) {
    const double mid = 0.5 * (c[j - 1] + c[j]);
    start[j] = std::upper_bound(x, x + m, mid, [](double v, float e) { return v < e; }) - x;
    start[j] = std::max(start[j], start[j - 1]);
  }
}

// Globally optimal contiguous partition of the sorted values into K ranges (1-D weighted k-means is solved exactly
// by dynamic programming): D[q][j] = min_i D[q-1][i] + sse(i, j), whose best i is monotone in j, so each layer is
// computed by divide and conquer in O(m log m).
std::vector<int64_t> optimal_partition(const Prefix& P, int64_t m, int K) {
  std::vector<double> prev(static_cast<size_t>(m + 1)), cur(prev.size());
  std::vector<std::vector<int32_t>> arg(static_cast<size_t>(K), std::vector<int32_t>(static_cast<size_t>(m + 1), 0));
  for (int64_t j = 0; j <= m; ++j) prev[static_cast<size_t>(j)] = P.sse(0, j);
  auto solve = [&](auto&& self, int q, int64_t lo, int64_t hi, int64_t olo, int64_t ohi) -> void {
    if (lo > hi) return;
    const int64_t mid = (lo + hi) / 2;
    double best = INFINITY;
    int64_t bi = olo;
    for (int64_t i = olo; i <= std::min(mid, ohi); ++i) {
      const double v = prev[static_cast<size_t>(i)] + P.sse(i, mid);
      if (v < best) {
        best = v;
        bi = i;
      }
    }
    cur[static_cast<size_t>(mid)] = best;
    arg[static_cast<size_t>(q)][static_cast<size_t>(mid)] = static_cast<int32_t>(bi);
    self(self, q, lo, mid - 1, olo, bi);
    self(self, q, mid + 1, hi, bi, ohi);
  };
  for (int q = 1; q < K; ++q) {
    solve(solve, q, 0, m, 0, m);
    prev.swap(cur);
  }
  std::vector<int64_t> start(static_cast<size_t>(K) + 1);
  start[static_cast<size_t>(K)] = m;
  for (int q = K - 1; q >= 1; --q)
    start[static_cast<size_t>(q)] = arg[static_cast<size_t>(q)][static_cast<size_t>(start[static_cast<size_t>(q) + 1])];
  start[0] = 0;
  return start;
}

}  // namespace

KMeans1D weighted_kmeans_1d(const float* x, const double* w, int64_t m, int K, int max_iter, bool exact) {
  LOWBIT_CHECK(K >= 1 && m >= 0 && max_iter >= 0, "weighted_kmeans_1d: bad arguments");
  KMeans1D km;
  km.start.assign(static_cast<size_t>(K) + 1, m);
  km.start[0] = 0;
  if (m == 0) {
    km.centroids.assign(static_cast<size_t>(K), 0.0);
    km.objective.push_back(0.0);
    return km;
  }
  const Prefix P(x, w, m);
  if (exact) {
    km.start = optimal_partition(P, m, K);
  } else {
    // Weighted-quantile initialisation: cluster j starts where the cumulative weight reaches j/K of the total.
    for (int j = 1; j < K; ++j) {
      const double target = P.w[static_cast<size_t>(m)] * j / K;
      const int64_t i = std::lower_bound(P.w.begin(), P.w.end(), target) - P.w.begin();
      km.start[static_cast<size_t>(j)] = std::clamp<int64_t>(i, km.start[static_cast<size_t>(j - 1)], m);
    }
  }
  fill_empty_clusters(x, P, km.start);
  update_centroids(x, P, km.start, km.centroids);
  km.objective.push_back(total_cost(P, km.start, km.centroids));
  std::vector<int64_t> next;
  for (int it = 0; it < max_iter; ++it) {
    assign_nearest(x, m, km.centroids, next);
    if (next == km.start) break;   // converged: the assignment no longer changes
    km.start = next;
    fill_empty_clusters(x, P, km.start);
    update_centroids(x, P, km.start, km.centroids);
    km.objective.push_back(total_cost(P, km.start, km.centroids));
    km.iterations = it + 1;
  }
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

AnyPrecQuantized anyprec_quantize(const float* w, const float* sens, int64_t n, int64_t k, const AnyPrecOptions& o) {
  const uint32_t mask = anyprec_width_mask(o);
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

#pragma omp parallel
  {
    std::vector<int64_t> order;
    std::vector<float> xs;
    std::vector<double> ws;
#pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < n; ++r) {
      const float* wr = w + r * k;
      const float* sr = sens + r * k;
      order.clear();
      for (int64_t c = 0; c < k; ++c)
        if (outlier.empty() || !outlier[static_cast<size_t>(r * k + c)]) order.push_back(c);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return wr[a] < wr[b]; });
      const int64_t m = static_cast<int64_t>(order.size());
      // Values centred on the row mean (better conditioned prefix sums); sensitivities floored at 1e-9 of their
      // mean so every range has a positive weight (all zero: plain k-means).
      double mean = 0, smean = 0;
      for (int64_t c : order) {
        mean += wr[c];
        smean += sr[c];
      }
      mean = m > 0 ? mean / static_cast<double>(m) : 0.0;
      smean = m > 0 ? smean / static_cast<double>(m) : 0.0;
      xs.resize(static_cast<size_t>(m));
      ws.resize(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) {
        const int64_t c = order[static_cast<size_t>(i)];
        xs[static_cast<size_t>(i)] = static_cast<float>(wr[c] - mean);
        ws[static_cast<size_t>(i)] = smean > 0 ? std::max<double>(sr[c], 1e-9 * smean) : 1.0;
      }
      // The sort is exact on the raw values; centring in fp32 is monotone, so xs stays sorted.
      const Prefix P(xs.data(), ws.data(), m);
      auto to_f16 = [&](double centred) { return f32_to_f16(static_cast<float>(centred + mean)); };

      // Seed: k-means, fp16 centroids, then every value to its nearest fp16 centroid.
      int b = o.seed_bits;
      std::vector<int64_t> start;
      std::vector<uint16_t> lut(static_cast<size_t>(1) << b);
      if (m > 0) {
        const KMeans1D km = weighted_kmeans_1d(xs.data(), ws.data(), m, 1 << b, o.max_iter,
                                               (1 << b) <= kAnyPrecExactMaxClusters);
        std::vector<double> c16(lut.size());
        for (size_t j = 0; j < lut.size(); ++j) {
          lut[j] = to_f16(km.centroids[j]);
          c16[j] = static_cast<double>(f16_to_f32(lut[j])) - mean;
        }
        assign_nearest(xs.data(), m, c16, start);
      } else {
        start.assign(lut.size() + 1, 0);
      }
      for (;;) {
        if ((mask >> b) & 1u) std::copy(lut.begin(), lut.end(), q.luts[b].begin() + (r << b));
        if (b == o.parent_bits) break;
        // Upscale b -> b+1: split every cluster at its optimal weighted 2-means cut.
        std::vector<int64_t> next(2 * (start.size() - 1) + 1);
        std::vector<uint16_t> next_lut(lut.size() * 2);
        for (size_t j = 0; j + 1 < start.size(); ++j) {
          const int64_t a = start[j], e = start[j + 1];
          int64_t cut = e - a >= 2 ? best_cut(xs.data(), P, a, e) : -1;
          if (cut < 0) cut = e;   // nothing to split: the upper child stays empty
          next[2 * j] = a;
          next[2 * j + 1] = cut;
          next_lut[2 * j] = cut > a ? to_f16(P.mean(a, cut)) : lut[j];
          next_lut[2 * j + 1] = e > cut ? to_f16(P.mean(cut, e)) : lut[j];
        }
        next.back() = m;
        start = std::move(next);
        lut = std::move(next_lut);
        ++b;
      }
      for (size_t j = 0; j + 1 < start.size(); ++j)
        for (int64_t i = start[j]; i < start[j + 1]; ++i)
          q.codes[static_cast<size_t>(r * k + order[static_cast<size_t>(i)])] = static_cast<uint8_t>(j);
    }
  }
  return q;
}

double anyprec_weighted_error(const float* w, const float* sens, const AnyPrecQuantized& q, int b) {
  // Per-row sums in parallel, added in row order: the same total for any thread count.
  std::vector<double> rows(static_cast<size_t>(q.n), 0.0);
#pragma omp parallel for schedule(static) if (q.n * q.k > 65536)
  for (int64_t r = 0; r < q.n; ++r) {
    double e = 0;
    for (int64_t c = 0; c < q.k; ++c) {
      const double d = static_cast<double>(w[r * q.k + c]) - q.value(r, c, b);
      e += sens[r * q.k + c] * d * d;
    }
    rows[static_cast<size_t>(r)] = e;
  }
  double e = 0;
  for (double v : rows) e += v;
  return e;
}

}  // namespace lowbit
