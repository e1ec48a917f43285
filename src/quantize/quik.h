// QUIK (Ashkboos et al.) weight quantization for one linear W [n, k]:
//   outlier columns: the `count` input columns with the largest calibration activation l∞ norm (max |x|) stay in
//     fp16 (quik_outlier_columns);
//   outlier-aware GPTQ: the columns are reordered base-then-outliers (each part in increasing order), H is
//     refactored in that order, GPTQ quantizes the base columns to symmetric per-output-channel integers (scale from
//     the row's base columns before any update: max |w| / (2^(b-1) - 1), or with `clip` the shrink of it in 1%
//     steps down to 50% with the least squared error) and its error feedback flows into every later column — the
//     outlier columns included, which are then stored in fp16 as updated.
// Activation quantization happens at run time (formats/quik/layout.h).
#pragma once
#include <cstdint>
#include <vector>

#include "formats/quik/layout.h"
#include "quantize/gptq.h"

namespace lowbit {

struct QuikOptions {
  int wbits = 4;
  int abits = 8;               // 4, 8 or 16 (16: weights only)
  bool act_fp8 = false;        // FP8-E4M3 activations (wbits 4, abits 8)
  int64_t outliers = -1;       // outlier columns of a dim-wide input (< 0: from outlier_frac)
  double outlier_frac = 256.0 / 4096.0;   // the paper's 256 of Llama-2-7B's 4096, as a fraction of dim
  double down_factor = 3.5;    // down_proj (input hidden_dim wide) keeps this many times more (paper: 3.5x)
  double outlier_threshold = 0;   // > 0: a layer whose inputs never exceed this max |x| keeps no outliers (appendix G)
  bool int8_down_proj = false; // down_proj at W8A8 (paper: Llama-2)
  bool clip = false;
  double percdamp = 0.01;
  int block_size = 128;
};

struct QuikStats {
  double hessian_error = 0;    // Σ_r (w_r - ŵ_r)ᵀ H (w_r - ŵ_r), outlier columns at their fp16 values
};

// Refuses bad options (wbits 4/8, abits 4/8/16, fp8 only as W4A8, counts and fractions in range).
void validate_quik_options(const QuikOptions& o);
// The `count` columns with the largest score (ties: lower index), increasing.
std::vector<int32_t> quik_outlier_columns(const std::vector<double>& score, int64_t count);
// The QuikQuantized of a W [n, k] before any weight is set: shape, widths and the outlier columns, which must be
// increasing and inside [0, k) (the CPU quantizer and its GPU twin both start from it).
QuikQuantized quik_layout(int64_t n, int64_t k, const std::vector<int32_t>& outlier_cols, int wbits, int abits,
                          bool act_fp8);
// h: [k, k] calibration Hessian in the original order.
QuikQuantized quik_quantize(const float* w, int64_t n, int64_t k, const std::vector<double>& h,
                            const std::vector<int32_t>& outlier_cols, int wbits, int abits, bool act_fp8, bool clip,
                            double percdamp, QuikStats* stats = nullptr);

}  // namespace lowbit
