#include "quantize/rtn.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace lowbit {

void validate_uniform_spec(const UniformSpec& s, int64_t k) {
  LOWBIT_CHECK(s.bits >= 2 && s.bits <= 8, "--bits must be in 2..8 (got ", s.bits, ")");
  LOWBIT_CHECK(s.group_size >= 0, "--group must be >= 0 (0 = per channel)");
  LOWBIT_CHECK(s.max_shrink > 0 && s.max_shrink < 1 && s.grid > 0, "bad MSE clipping grid");
  (void)k;
}

namespace {

// scale/zero for a range, with the scale rounded to its stored fp16 value.
GroupParams params_for_range(float xmin, float xmax, const UniformSpec& s) {
  const int maxq = (1 << s.bits) - 1;
  GroupParams p;
  if (s.symmetric) {
    const float m = std::max(std::fabs(xmin), xmax);
    xmin = -m;
    xmax = m;
  }
  if (xmin == 0.0f && xmax == 0.0f) {   // GPTQ: an all-zero group gets the range [-1, 1]
    xmin = -1.0f;
    xmax = 1.0f;
  }
  const float scale = std::max((xmax - xmin) / static_cast<float>(maxq), 6.0e-8f);   // >= smallest fp16 subnormal
  p.scale_f16 = f32_to_f16(scale);
  p.scale = f16_to_f32(p.scale_f16);
  if (p.scale == 0.0f) {
    p.scale_f16 = 1;   // 2^-24
    p.scale = f16_to_f32(1);
  }
  if (std::isinf(p.scale)) {   // ranges beyond 65504 * maxq: weights checked finite and sane by the callers
    p.scale_f16 = 0x7bff;
    p.scale = 65504.0f;
  }
  p.zero = s.symmetric ? (maxq + 1) / 2 : static_cast<int>(std::nearbyint(-xmin / p.scale));
  p.zero = std::min(std::max(p.zero, 0), maxq);
  return p;
}

}  // namespace

GroupParams find_group_params(const float* x, int64_t count, int64_t stride, const UniformSpec& s) {
  float xmin = 0.0f, xmax = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i * stride];
    xmin = std::min(xmin, v);
    xmax = std::max(xmax, v);
  }
  GroupParams best = params_for_range(xmin, xmax, s);
  if (!s.mse_clip) return best;
  const int maxq = (1 << s.bits) - 1;
  auto err_of = [&](const GroupParams& p) {
    double e = 0;
    for (int64_t i = 0; i < count; ++i) {
      const float v = x[i * stride];
      e += std::pow(std::fabs(dequant_code(quantize_code(v, p, maxq), p) - v), 2.4);
    }
    return e;
  };
  double best_err = err_of(best);
  const int steps = static_cast<int>(s.max_shrink * s.grid);
  for (int i = 1; i <= steps; ++i) {
    const float shrink = 1.0f - static_cast<float>(i) / static_cast<float>(s.grid);
    const GroupParams p = params_for_range(shrink * xmin, shrink * xmax, s);
    const double e = err_of(p);
    if (e < best_err) {
      best_err = e;
      best = p;
    }
  }
  return best;
}

void check_weights_finite(const float* w, int64_t count, const std::string& what) {
  for (int64_t i = 0; i < count; ++i)
    LOWBIT_CHECK(std::isfinite(w[i]), what, ": weight ", i, " is not finite (", w[i], "); refusing to quantize");
}

UniformQuantized rtn_quantize(const float* w, int64_t n, int64_t k, const UniformSpec& s) {
  validate_uniform_spec(s, k);
  check_weights_finite(w, n * k, "rtn");
  UniformQuantized q;
  q.bits = s.bits;
  q.n = n;
  q.k = k;
  q.group_size = s.group_size > 0 ? std::min(s.group_size, k) : k;
  q.symmetric = s.symmetric;
  const int64_t G = q.groups();
  const int maxq = (1 << s.bits) - 1;
  q.codes.resize(static_cast<size_t>(n * k));
  q.scales.resize(static_cast<size_t>(n * G));
  if (!s.symmetric) q.zeros.resize(static_cast<size_t>(n * G));
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t c0 = g * q.group_size, c1 = std::min(k, c0 + q.group_size);
      const GroupParams p = find_group_params(w + r * k + c0, c1 - c0, 1, s);
      q.scales[static_cast<size_t>(r * G + g)] = p.scale_f16;
      if (!s.symmetric) q.zeros[static_cast<size_t>(r * G + g)] = static_cast<uint8_t>(p.zero);
      for (int64_t c = c0; c < c1; ++c)
        q.codes[static_cast<size_t>(r * k + c)] = static_cast<uint8_t>(quantize_code(w[r * k + c], p, maxq));
    }
  }
  return q;
}

}  // namespace lowbit
