// Round-to-nearest uniform quantization (the building block of RTN and GPTQ), GPTQ's conventions:
//   range [min(x, 0), max(x, 0)] per row and group; asymmetric: scale = (max - min) / maxq, zero = round(-min/scale);
//   symmetric: max = max(|min|, max), zero = 2^(bits-1); q = clamp(round(x / scale) + zero, 0, maxq);
//   x̂ = (q - zero) · scale, with scale rounded to fp16 first (it is stored in fp16, see formats/uniform/layout.h).
// Optional MSE clipping: shrink the range by p in {1, 0.99, ..} down to 1 - max_shrink, keeping the p with the
// smallest sum |x̂ - x|^2.4 (GPTQ's grid search).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "formats/uniform/layout.h"

namespace lowbit {

struct UniformSpec {
  int bits = 4;              // 2..8
  int64_t group_size = 0;    // 0 = per output channel (one group spanning k)
  bool symmetric = false;
  bool mse_clip = false;
  float max_shrink = 0.8f;
  int grid = 100;
};

void validate_uniform_spec(const UniformSpec& s, int64_t k);

struct GroupParams {
  uint16_t scale_f16 = 0;
  float scale = 0;           // fp32 value of scale_f16 (the one used for codes)
  int zero = 0;
};

// Parameters for the values x[i * stride], i < count.
GroupParams find_group_params(const float* x, int64_t count, int64_t stride, const UniformSpec& s);
inline int quantize_code(float x, const GroupParams& p, int maxq) {
  const float q = std::nearbyint(x / p.scale) + static_cast<float>(p.zero);
  return q < 0 ? 0 : (q > static_cast<float>(maxq) ? maxq : static_cast<int>(q));
}
inline float dequant_code(int q, const GroupParams& p) { return (static_cast<float>(q) - static_cast<float>(p.zero)) * p.scale; }

// Throws when any weight is NaN/inf (names `what`): quantizers check before their parallel loops.
void check_weights_finite(const float* w, int64_t count, const std::string& what);
// RTN: every weight rounded independently. W [n, k] row-major.
UniformQuantized rtn_quantize(const float* w, int64_t n, int64_t k, const UniformSpec& s);

}  // namespace lowbit
