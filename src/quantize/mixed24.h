// 2/4-bit intra-matrix mixed precision (Li et al., ICCAD 2024) for one linear weight W [n, k]:
//   sensitivity (eq. 9): per group i of 16 input channels, S_i = Σ_{c in i} Σ_j W[j,c]^2 / [H⁻¹]_cc^2 (damped H);
//   allocation: the round(ratio_4bit · G) most sensitive groups get 4 bits, the rest 2 (shared by every row);
//   quantization: GPTQ's error feedback over the mixed grid (the paper fine-tunes instead; training is out of
//     scope): columns in order, blocks of 128 with lazy updates; at the first column of each group, every row's
//     asymmetric scale and zero are fitted to its current (error-updated) weights, outliers left out; a 2-bit
//     group's scales are then quantized across each 16-row block to 4 bits (fp16 step and offset per block), and
//     each row takes the (scale code, zero) pair next to its rounded scale with the least squared error;
//   outliers: the `outlier_fraction` of all weights with the largest saliency err^2 / [H⁻¹]_cc (err = the RTN
//     error at the group's bits, on the original weights), drawn only from 2-bit groups (or from all groups, for
//     the ablation), kept in fp16 at their error-updated value.
#pragma once
#include <cstdint>
#include <vector>

#include "formats/mixed24/layout.h"
#include "formats/mixed24a/layout.h"
#include "quantize/gptq.h"

namespace lowbit {

struct Mixed24Options {
  double ratio_4bit = 0.25;
  double outlier_fraction = 0.002;
  bool outliers_from_all_groups = false;   // ablation (e): the paper keeps them in 2-bit groups only
  bool error_feedback = true;               // false: round to nearest on the same mixed grid
  std::vector<uint8_t> group_bits;          // given: skip the allocation (e.g. whole layers at 4 bits)
  double percdamp = 0.01;
  int block_size = 128;                     // a multiple of 16
  // Layout of a linear: Auto = the aligned mixed24a wherever it fits (mixed24_aligned_fits), else generic mixed24.
  enum class Layout { Auto, Generic, Aligned } layout = Layout::Auto;
  bool unit_order_by_sensitivity = true;    // mixed24a: units (and GPTQ's order) by decreasing eq. 9 sensitivity
};

struct Mixed24Stats {
  double hessian_error = 0;                 // Σ_r (w_r - ŵ_r)ᵀ H (w_r - ŵ_r)
  int64_t outliers = 0;
};

// Refuses options out of range (--ratio-4bit in [0, 1], --outliers in [0, 0.02], block size a multiple of 16).
void validate_mixed24_options(const Mixed24Options& o);

// Eq. 9 scores, one per group of 16 input columns. hinv_diag: diag of the damped H⁻¹ [k].
std::vector<double> mixed24_group_sensitivity(const float* w, int64_t n, int64_t k, const std::vector<double>& hinv_diag);
// diag of (H + λI)⁻¹ from a GPTQ factor (identity order): Σ_{r<=c} U_rc^2.
std::vector<double> hinv_diagonal(const GptqFactor& f);
// The `ratio` most sensitive groups -> 4, the rest -> 2.
std::vector<uint8_t> allocate_4bit_groups(const std::vector<double>& sensitivity, double ratio);

// Whether the aligned layout takes a linear with k inputs under these options (k a multiple of 64, exactly one
// 4-bit group in four, no forced group widths).
bool mixed24_aligned_fits(int64_t k, const Mixed24Options& o);
// The stored group order of mixed24a: units [2, 2, 2, 4] of the allocated groups (the 4-bit groups are the G/4 most
// sensitive); units by decreasing sensitivity when sensitivity_order (else in column order), and within a unit the
// 2-bit groups by decreasing sensitivity (slot 0, whose scale code keeps 4 bits, is the most sensitive).
std::vector<uint16_t> mixed24a_permutation(const std::vector<double>& sensitivity, bool sensitivity_order);

Mixed24Quantized mixed24_quantize(const float* w, int64_t n, int64_t k, const std::vector<double>& h,
                                  const GptqFactor& factor, const Mixed24Options& o, Mixed24Stats* stats = nullptr);
// The aligned layout: groups permuted (mixed24a_permutation), GPTQ over the mixed grid in the stored order (H is
// refactored in that order; factor: the identity-order factor, for eq. 9), two-order scales for every group (3-bit
// codes in slots 1 and 2). h: [k, k], required.
Mixed24AQuantized mixed24a_quantize(const float* w, int64_t n, int64_t k, const std::vector<double>& h,
                                    const GptqFactor& factor, const Mixed24Options& o, Mixed24Stats* stats = nullptr);

}  // namespace lowbit
