// The per-row core of any-precision quantization (quantize/anyprec.h has the method), written once for the CPU
// quantizer (anyprec.cpp) and its GPU twin (backend_cuda/quantize/anyprec_gpu.cu) so that both perform the same IEEE
// operations in the same order and agree bit for bit by construction:
//   - no std:: algorithms: binary searches, clamps and max are spelled out as the ternaries libstdc++ uses (a binary
//     search over sorted data has one answer whatever its probing order);
//   - every double +, -, *, / goes through dadd_rn/dsub_rn/dmul_rn/ddiv_rn (core/host_device.h): on the device the
//     __d*_rn intrinsics, which nvcc never contracts into an FMA; on the host plain operators, which is only exact
//     because the one host translation unit that runs this code (quantize/anyprec.cpp) is compiled with
//     -ffp-contract=off (CMakeLists.txt). Other host code must call it through anyprec.h, never directly;
//   - fp16 conversions are core/half.h's own, which compile for both sides.
// All memory is the caller's (RowScratch): the CPU passes per-thread vectors, the GPU slices of one global buffer.
// Positions are int64 as in the CPU's vectors; the DP argmin table is int32 (k < 2^31 is checked at the entry points).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "core/host_device.h"


namespace lowbit::anyprec_row {

inline constexpr int kMaxBits = 8;                // codes fit one byte
inline constexpr int kMaxClusters = 1 << kMaxBits;
inline constexpr int kExactMaxClusters = 16;      // = kAnyPrecExactMaxClusters: exact DP seed up to 4 bits
inline constexpr int kStackDepth = 64;            // DP divide and conquer: holds <= tree depth + 1 <= 34 for m < 2^31

using hd::dadd_rn;
using hd::ddiv_rn;
using hd::dmul_rn;
using hd::dsub_rn;
using hd::bits_float;
using ::lowbit::f16_to_f32;
using ::lowbit::f32_to_f16;
using hd::float_bits;

// The searches that dominate the work (the DP's argmin over split points, the 2-means cut scan) are "first minimum"
// reductions: the lexicographic minimum of (cost, index) over the valid candidates, which a sequential scan that keeps
// only strictly smaller costs finds, and so does any split of the indices into strided lanes whose partial minima are
// then combined in any order. Loops policies (Par) run them:
//   SerialLoops         one thread (the CPU quantizer);
//   EmulatedLanes<W>    W strided lanes emulated by one thread, then combined: the GPU warp's partition on the CPU;
//   WarpLoops           (anyprec_gpu.cu) the 32 lanes of a warp, combined by shuffles.
// Every lane of a warp runs all the rest of the row redundantly (same values, same addresses); Par::for_each splits
// loops of independent writes over the lanes, and Par::sync orders them before the values are read. Par::sync also
// closes every phase that rewrites a table in place (boundary shifts, the swap of two levels' tables), so that no
// lane can overwrite an entry another lane has still to read, even were the warp's lanes not executing in lockstep.
struct Candidate {
  double cost;
  int64_t index;   // < 0: none
};
LOWBIT_HD Candidate better(Candidate a, Candidate b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  if (b.cost < a.cost) return b;
  if (a.cost < b.cost) return a;
  return b.index < a.index ? b : a;
}
// One lane's first minimum of f over lo + lane, lo + lane + stride, ... < hi; f(i, &cost) is false for an invalid i.
template <typename F>
LOWBIT_HD Candidate scan_lane(int64_t lo, int64_t hi, int64_t lane, int64_t stride, F&& f) {
  Candidate best{0.0, -1};
  double c;
  int64_t i = lo + lane;
  for (; i < hi; i += stride)   // the first valid candidate
    if (f(i, &c)) {
      best = {c, i};
      i += stride;
      break;
    }
  for (; i < hi; i += stride)   // then only strictly smaller costs
    if (f(i, &c) && c < best.cost) best = {c, i};
  return best;
}

struct SerialLoops {
  template <typename F>
  LOWBIT_HD static Candidate first_min(int64_t lo, int64_t hi, F&& f) { return scan_lane(lo, hi, 0, 1, f); }
  template <typename F>
  LOWBIT_HD static void for_each(int64_t lo, int64_t hi, F&& f) {
    for (int64_t i = lo; i < hi; ++i) f(i);
  }
  LOWBIT_HD static void sync() {}
};

template <int W>
struct EmulatedLanes {
  template <typename F>
  static Candidate first_min(int64_t lo, int64_t hi, F&& f) {
    Candidate best{0.0, -1};
    for (int lane = 0; lane < W; ++lane) best = better(best, scan_lane(lo, hi, lane, W, f));
    return best;
  }
  template <typename F>
  static void for_each(int64_t lo, int64_t hi, F&& f) {
    for (int lane = 0; lane < W; ++lane)
      for (int64_t i = lo + lane; i < hi; i += W) f(i);
  }
  static void sync() {}
};

// Prefix sums of w, w x, w x^2 over sorted values [m + 1]: the weighted SSE of any contiguous range in O(1).
struct Prefix {
  double* w;
  double* wx;
  double* wxx;

  LOWBIT_HD void build(const float* x, const double* wt, int64_t m) {
    w[0] = wx[0] = wxx[0] = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      const double xi = static_cast<double>(x[i]);
      w[i + 1] = dadd_rn(w[i], wt[i]);
      wx[i + 1] = dadd_rn(wx[i], dmul_rn(wt[i], xi));
      wxx[i + 1] = dadd_rn(wxx[i], dmul_rn(dmul_rn(wt[i], xi), xi));
    }
  }
  LOWBIT_HD double mean(int64_t a, int64_t b) const { return ddiv_rn(dsub_rn(wx[b], wx[a]), dsub_rn(w[b], w[a])); }
  // Σ w (x - c)^2 over [a, b), clamped at 0 against cancellation.
  LOWBIT_HD double cost(int64_t a, int64_t b, double c) const {
    if (b <= a) return 0.0;
    const double v = dadd_rn(dsub_rn(dsub_rn(wxx[b], wxx[a]), dmul_rn(dmul_rn(2.0, c), dsub_rn(wx[b], wx[a]))),
                          dmul_rn(dmul_rn(c, c), dsub_rn(w[b], w[a])));
    return 0.0 < v ? v : 0.0;
  }
  LOWBIT_HD double sse(int64_t a, int64_t b) const { return b > a ? cost(a, b, mean(a, b)) : 0.0; }
};

// The optimal cut p of [a, b) into [a, p) and [p, b) (a weighted 2-means; never between equal values; the first of
// equal costs), or -1 when the range holds fewer than two distinct values.
template <typename Par>
LOWBIT_HD int64_t best_cut(const float* x, const Prefix& P, int64_t a, int64_t b) {
  return Par::first_min(a + 1, b, [&](int64_t p, double* c) {
           if (x[p - 1] == x[p]) return false;
           *c = dadd_rn(P.sse(a, p), P.sse(p, b));
           return true;
         }).index;
}

// Centroids of the K ranges; an empty range takes its left neighbour's centroid (or the first value).
LOWBIT_HD void update_centroids(const float* x, const Prefix& P, const int64_t* start, int K, double* c) {
  for (int j = 0; j < K; ++j) {
    if (start[j + 1] > start[j]) c[j] = P.mean(start[j], start[j + 1]);
    else c[j] = j > 0 ? c[j - 1] : static_cast<double>(x[0]);
  }
}

// Replaces empty ranges by splitting the range of largest SSE at its optimal cut, while one can be split. The
// boundary list start[0..K] keeps its length: one boundary removed, one inserted, sorted.
template <typename Par>
LOWBIT_HD void fill_empty_clusters(const float* x, const Prefix& P, int64_t* start, int K) {
  for (;;) {
    int empty = K;
    for (int j = 0; j < K && empty == K; ++j)
      if (start[j + 1] == start[j]) empty = j;
    if (empty == K) return;
    int worst = K;
    double worst_sse = 0;
    for (int j = 0; j < K; ++j) {
      const double s = P.sse(start[j], start[j + 1]);
      if (s > worst_sse && best_cut<Par>(x, P, start[j], start[j + 1]) >= 0) {
        worst_sse = s;
        worst = j;
      }
    }
    if (worst == K) return;   // nothing left to split: fewer distinct values than clusters
    const int64_t cut = best_cut<Par>(x, P, start[worst], start[worst + 1]);
    for (int i = empty; i < K; ++i) start[i] = start[i + 1];   // drop the empty range's boundary: K entries left
    int pos = 0;                                               // first of start[0 .. K-1) above the cut
    while (pos < K - 1 && !(cut < start[pos])) ++pos;
    for (int i = K; i > pos; --i) start[i] = start[i - 1];
    start[pos] = cut;
    Par::sync();
  }
}

LOWBIT_HD double total_cost(const Prefix& P, const int64_t* start, const double* c, int K) {
  double s = 0;
  for (int j = 0; j < K; ++j) s = dadd_rn(s, P.cost(start[j], start[j + 1], c[j]));
  return s;
}

// First i in [0, m) with v < x[i] (x ascending), m if none: std::upper_bound.
LOWBIT_HD int64_t upper_bound(const float* x, int64_t m, double v) {
  int64_t lo = 0, hi = m;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (v < static_cast<double>(x[mid])) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Boundaries that send every value to its nearest centroid (centroids ascending; ties go left).
LOWBIT_HD void assign_nearest(const float* x, int64_t m, const double* c, int K, int64_t* start) {
  start[0] = 0;
  start[K] = m;
  for (int j = 1; j < K; ++j) {
    const double mid = dmul_rn(0.5, dadd_rn(c[j - 1], c[j]));
    const int64_t s = upper_bound(x, m, mid);
    start[j] = s < start[j - 1] ? start[j - 1] : s;
  }
}

// Scratch of the exact seed: two DP layers [m + 1] and the argmin table [(K - 1) (m + 1)].
struct DpScratch {
  double* prev;
  double* cur;
  int32_t* arg;
};

// Globally optimal contiguous partition of the sorted values into K ranges (1-D weighted k-means is solved exactly
// by dynamic programming): D[q][j] = min_i D[q-1][i] + sse(i, j), whose best i is monotone in j, so each layer is
// computed by divide and conquer in O(m log m), here with an explicit stack (every node's answer depends only on its
// own ranges, so the visiting order does not matter; the first minimum is kept).
template <typename Par>
LOWBIT_HD void optimal_partition(const Prefix& P, int64_t m, int K, DpScratch s, int64_t* start) {
  double* prev = s.prev;
  double* cur = s.cur;
  Par::for_each(0, m + 1, [&](int64_t j) { prev[j] = P.sse(0, j); });
  Par::sync();
  struct Node {
    int64_t lo, hi, olo, ohi;
  };
  Node stack[kStackDepth];
  for (int q = 1; q < K; ++q) {
    int32_t* arg = s.arg + static_cast<int64_t>(q - 1) * (m + 1);
    int top = 0;
    stack[top++] = {0, m, 0, m};
    while (top > 0) {
      const Node nd = stack[--top];
      if (nd.lo > nd.hi) continue;
      const int64_t mid = (nd.lo + nd.hi) / 2;
      const int64_t last = mid < nd.ohi ? mid : nd.ohi;   // olo <= last: the range is never empty
      Candidate best = Par::first_min(nd.olo, last + 1, [&](int64_t i, double* v) {
        *v = dadd_rn(prev[i], P.sse(i, mid));
        return true;
      });
      if (best.index < 0) best = {INFINITY, nd.olo};
      cur[mid] = best.cost;
      arg[mid] = static_cast<int32_t>(best.index);
      stack[top++] = {mid + 1, nd.hi, best.index, nd.ohi};
      stack[top++] = {nd.lo, mid - 1, nd.olo, best.index};
    }
    Par::sync();
    double* t = prev;
    prev = cur;
    cur = t;
  }
  start[K] = m;
  for (int q = K - 1; q >= 1; --q) start[q] = s.arg[static_cast<int64_t>(q - 1) * (m + 1) + start[q + 1]];
  start[0] = 0;
}

// Weighted 1-D k-means on m > 0 sorted values with K clusters (weighted_kmeans_1d in anyprec.h has the contract):
// writes start[K + 1] and centroids[K]; objective (optional, max_iter + 1 entries) receives Σ w (x - c)^2 after the
// initialisation and after every Lloyd iteration, the first objective_cap of them. `next` is scratch [K + 1]; `dp`
// is read only when exact. Returns
// the number of Lloyd iterations that changed the assignment.
template <typename Par>
LOWBIT_HD int kmeans(const float* x, const Prefix& P, int64_t m, int K, int max_iter, bool exact, DpScratch dp,
                     int64_t* start, int64_t* next, double* centroids, double* objective,
                     int objective_cap = 0) {
  for (int j = 0; j <= K; ++j) start[j] = m;
  start[0] = 0;
  if (exact) {
    optimal_partition<Par>(P, m, K, dp, start);
  } else {
    // Weighted-quantile initialisation: cluster j starts where the cumulative weight reaches j/K of the total.
    for (int j = 1; j < K; ++j) {
      const double target = ddiv_rn(dmul_rn(P.w[m], static_cast<double>(j)), static_cast<double>(K));
      int64_t lo = 0, hi = m + 1;   // std::lower_bound over P.w[0 .. m]
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (P.w[mid] < target) lo = mid + 1;
        else hi = mid;
      }
      start[j] = lo < start[j - 1] ? start[j - 1] : (m < lo ? m : lo);
    }
  }
  fill_empty_clusters<Par>(x, P, start, K);
  update_centroids(x, P, start, K, centroids);
  int n_obj = 0;
  if (n_obj < objective_cap) objective[n_obj++] = total_cost(P, start, centroids, K);
  int iterations = 0;
  for (int it = 0; it < max_iter; ++it) {
    assign_nearest(x, m, centroids, K, next);
    bool same = true;
    for (int j = 0; j <= K && same; ++j) same = next[j] == start[j];
    if (same) break;   // converged: the assignment no longer changes
    for (int j = 0; j <= K; ++j) start[j] = next[j];
    Par::sync();
    fill_empty_clusters<Par>(x, P, start, K);
    update_centroids(x, P, start, K, centroids);
    if (n_obj < objective_cap) objective[n_obj++] = total_cost(P, start, centroids, K);
    iterations = it + 1;
  }
  return iterations;
}

// Everything one row needs beyond its inputs: [k] or [k + 1] arrays for the sorted values and their prefix sums,
// the exact seed's DP tables (dp.arg: [(2^seed_bits - 1) (k + 1)], only for exact seeds), and the small per-width
// tables (kMaxClusters + 1 entries).
struct RowScratch {
  float* xs;      // [k] centred sorted values
  double* ws;     // [k] floored sensitivities in sorted order
  Prefix P;       // [k + 1] each
  DpScratch dp;   // prev, cur [k + 1]
  int64_t* start;
  int64_t* next;
  double* centroids;
  double* c16;
  uint16_t* lut;
  uint16_t* next_lut;
};

struct RowParams {
  int seed_bits, parent_bits, max_iter;
  uint32_t width_mask;   // served widths: their LUTs are written
};

// Quantizes one row: wr, sr [k] its weights and sensitivities; order [m] the columns that are not outliers, sorted by
// (value, column) ascending. Writes codes_row[order[i]] (the other columns are left alone) and, for every served
// width b, luts[b][r 2^b .. (r + 1) 2^b).
template <typename Par>
LOWBIT_HD void quantize_row(const float* wr, const float* sr, const int32_t* order, int64_t m, const RowParams& p,
                            RowScratch& s, int64_t r, uint8_t* codes_row, uint16_t* const* luts) {
  // Values centred on the row mean (better conditioned prefix sums); sensitivities floored at 1e-9 of their mean so
  // every range has a positive weight (all zero: plain k-means).
  double mean = 0, smean = 0;
  for (int64_t i = 0; i < m; ++i) {
    mean = dadd_rn(mean, static_cast<double>(wr[order[i]]));
    smean = dadd_rn(smean, static_cast<double>(sr[order[i]]));
  }
  mean = m > 0 ? ddiv_rn(mean, static_cast<double>(m)) : 0.0;
  smean = m > 0 ? ddiv_rn(smean, static_cast<double>(m)) : 0.0;
  const double floor = dmul_rn(1e-9, smean);
  Par::for_each(0, m, [&](int64_t i) {
    const int32_t c = order[i];
    s.xs[i] = static_cast<float>(dsub_rn(static_cast<double>(wr[c]), mean));
    const double sc = static_cast<double>(sr[c]);
    s.ws[i] = smean > 0 ? (sc < floor ? floor : sc) : 1.0;
  });
  Par::sync();
  // The order is exact on the raw values; centring in fp32 is monotone, so xs stays sorted.
  const float* xs = s.xs;
  s.P.build(xs, s.ws, m);
  const Prefix& P = s.P;

  // Seed: k-means, fp16 centroids, then every value to its nearest fp16 centroid.
  int b = p.seed_bits;
  int K = 1 << b;
  int64_t* start = s.start;
  int64_t* next = s.next;
  uint16_t* lut = s.lut;
  uint16_t* next_lut = s.next_lut;
  if (m > 0) {
    kmeans<Par>(xs, P, m, K, p.max_iter, K <= kExactMaxClusters, s.dp, start, next, s.centroids, nullptr);
    for (int j = 0; j < K; ++j) {
      lut[j] = f32_to_f16(static_cast<float>(dadd_rn(s.centroids[j], mean)));
      s.c16[j] = dsub_rn(static_cast<double>(f16_to_f32(lut[j])), mean);
    }
    Par::sync();
    assign_nearest(xs, m, s.c16, K, start);
  } else {
    for (int j = 0; j < K; ++j) lut[j] = 0;
    for (int j = 0; j <= K; ++j) start[j] = 0;
  }
  for (;;) {
    if ((p.width_mask >> b) & 1u) {
      uint16_t* dst = luts[b] + (r << b);
      for (int j = 0; j < K; ++j) dst[j] = lut[j];
    }
    if (b == p.parent_bits) break;
    // Upscale b -> b+1: split every cluster at its optimal weighted 2-means cut.
    for (int j = 0; j < K; ++j) {
      const int64_t a = start[j], e = start[j + 1];
      int64_t cut = e - a >= 2 ? best_cut<Par>(xs, P, a, e) : -1;
      if (cut < 0) cut = e;   // nothing to split: the upper child stays empty
      next[2 * j] = a;
      next[2 * j + 1] = cut;
      next_lut[2 * j] = cut > a ? f32_to_f16(static_cast<float>(dadd_rn(P.mean(a, cut), mean))) : lut[j];
      next_lut[2 * j + 1] = e > cut ? f32_to_f16(static_cast<float>(dadd_rn(P.mean(cut, e), mean))) : lut[j];
    }
    next[2 * K] = m;
    Par::sync();   // the next level overwrites this level's boundaries
    int64_t* ts = start;
    start = next;
    next = ts;
    uint16_t* tl = lut;
    lut = next_lut;
    next_lut = tl;
    ++b;
    K *= 2;
  }
  for (int j = 0; j < K; ++j)
    Par::for_each(start[j], start[j + 1], [&](int64_t i) { codes_row[order[i]] = static_cast<uint8_t>(j); });
}

}  // namespace lowbit::anyprec_row
