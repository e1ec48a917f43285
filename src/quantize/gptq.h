// GPTQ (Frantar et al., 2023): quantize the columns of W [n, k] one at a time, each time spreading the rounding
// error over the not-yet-quantized columns through the inverse Hessian H⁻¹ of the layer input (H = 2/N XᵀX):
//   dead columns (H_ii = 0) are zeroed; damping λ = percdamp · mean(diag H) is added to the diagonal;
//   U = upper Cholesky factor of H⁻¹ (computed in fp64 with LAPACK);
//   columns in blocks of 128 with lazy batched updates of the trailing columns (one sgemm per block);
//   act-order: columns processed by decreasing H_ii, groups formed in that order (g_idx stored) unless
//   static_groups, which fixes the group parameters on the original column order first (no g_idx).
// Produces the same UniformQuantized encoding as RTN (formats/uniform/layout.h).
#pragma once
#include <cstdint>
#include <vector>

#include "quantize/rtn.h"

namespace lowbit {

struct GptqOptions {
  UniformSpec spec;
  bool act_order = false;
  bool static_groups = false;
  double percdamp = 0.01;
  int block_size = 128;
};

struct GptqStats {
  double damp = 0;          // λ actually used (raised when H + λI was not positive definite)
  int dead_columns = 0;
  double hessian_error = 0; // Σ_r (w_r - ŵ_r)ᵀ H (w_r - ŵ_r): the layer objective GPTQ minimises
};

// What GPTQ derives from the Hessian alone (shared by the linears that read the same input: q/k/v, gate/up):
// dead columns, the processing order, the damping used and U, the upper Cholesky factor of (H + λI)⁻¹.
struct GptqFactor {
  int64_t k = 0;
  std::vector<char> dead;           // [k]
  std::vector<int64_t> perm;        // [k] processing order (identity unless act-order)
  std::vector<double> u;            // [k, k] in processing order
  std::vector<float> uf;            // fp32 copy for the sgemm updates
  double damp = 0;
};
GptqFactor gptq_factor(const std::vector<double>& h, int64_t k, const GptqOptions& opts);

// h: [k, k] row-major, symmetric (fp64). w: [n, k] row-major fp32.
UniformQuantized gptq_quantize(const float* w, int64_t n, int64_t k, const std::vector<double>& h,
                               const GptqOptions& opts, GptqStats* stats = nullptr);

// With a precomputed factor; h is only used for stats->hessian_error (pass {} to skip it).
UniformQuantized gptq_quantize(const float* w, int64_t n, int64_t k, const std::vector<double>& h,
                               const GptqFactor& factor, const GptqOptions& opts, GptqStats* stats = nullptr);

// Σ_r (w_r - ŵ_r)ᵀ H (w_r - ŵ_r) for any quantized weight (the objective both RTN and GPTQ are measured by).
double hessian_weighted_error(const float* w, const UniformQuantized& q, const std::vector<double>& h);
// The same for a dense ŵ [n, k].
double hessian_weighted_error(const float* w, const float* w_hat, int64_t n, int64_t k, const std::vector<double>& h);

}  // namespace lowbit
