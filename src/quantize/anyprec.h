// Any-precision quantization (Park et al., ICML 2024) of one linear weight, row by row:
//   seed:     a sensitivity-weighted 1-D k-means (SqueezeLLM) with 2^s centroids per output row — deterministic
//             initialisation (the exact optimum by dynamic programming for s <= 4, weighted quantiles above), Lloyd
//             iterations until the assignment stops changing or max_iter; centroids rounded to fp16, every weight
//             then assigned its nearest fp16 centroid;
//   upscale:  from width b to b+1 every cluster is split in two by a weighted 2-means over its own members — in
//             1-D the optimal 2-means split of a cluster is a cut of its sorted members, found exactly by one scan
//             with prefix sums — child code = (parent code << 1) | side, child centroid = its members' weighted
//             mean (fp16). Every b-bit code is thus the top b bits of the parent code.
//   outliers: optionally the fraction `outlier_fraction` of weights with the largest sensitivity is kept exactly
//             (fp16, CSR) and left out of the clustering: dense-and-sparse, shared by all widths.
// Sensitivity: one non-negative weight per matrix entry (the Fisher diagonal, or the input Hessian diagonal H_cc
// repeated over rows). Zero sensitivities get a tiny floor so every cluster has a defined weighted mean.
#pragma once
#include <cstdint>
#include <vector>

#include "formats/anyprec/layout.h"

namespace lowbit {

struct AnyPrecOptions {
  int seed_bits = 3;               // 2..8
  int parent_bits = 8;             // seed_bits..8
  std::vector<int> widths;         // served widths (LUTs stored); empty = all of seed..parent. Must include parent.
  int max_iter = 100;              // Lloyd iterations cap for the seed
  double outlier_fraction = 0.0;   // dense-and-sparse outliers, e.g. 0.005
};

// Checks the options; returns the served-width bit set.
uint32_t anyprec_width_mask(const AnyPrecOptions& o);

// Weighted 1-D k-means on values sorted ascending (x[m], weights w[m] > 0): clusters are contiguous ranges of the
// sorted values. start[j] .. start[j+1] is cluster j (start has clusters + 1 entries), centroids ascending.
// Initialisation: exact = the globally optimal partition (dynamic programming, O(K m log m)); otherwise weighted
// quantiles. Lloyd iterations follow either way (from the exact optimum they stop at once). Empty clusters are
// re-seeded by splitting the cluster of largest error at its optimal cut.
struct KMeans1D {
  std::vector<int64_t> start;
  std::vector<double> centroids;
  std::vector<double> objective;   // Σ w (x - c)^2 after initialisation and every Lloyd iteration (the first 4096)
  int iterations = 0;
};
KMeans1D weighted_kmeans_1d(const float* x_sorted, const double* w_sorted, int64_t m, int clusters, int max_iter,
                            bool exact = false);
// The seed uses the exact initialisation up to this many clusters (seed bits <= 4); Lloyd from quantiles above.
inline constexpr int kAnyPrecExactMaxClusters = 16;

// Quantizes W [n, k] with sensitivities s [n, k].
AnyPrecQuantized anyprec_quantize(const float* w, const float* sensitivity, int64_t n, int64_t k,
                                  const AnyPrecOptions& o);

// anyprec_quantize with the GPU twin's division of each row's searches over a warp's 32 lanes emulated on the CPU
// (quantize/anyprec_row.h): the same result by construction; the tests check the twin's combination of partial minima
// with it.
AnyPrecQuantized anyprec_quantize_emulating_warp(const float* w, const float* sensitivity, int64_t n, int64_t k,
                                                 const AnyPrecOptions& o);

// Σ s (w - ŵ_b)^2 of the b-bit view: the objective the seed and the splits minimise.
double anyprec_weighted_error(const float* w, const float* sensitivity, const AnyPrecQuantized& q, int b);

}  // namespace lowbit
