// quik format: the arithmetic's shared definitions (activation quantizer, e4m3 rounding, wReduced) and packing.
// Layout and arithmetic: layout.h, docs/formats/quik.md.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "formats/pack_util.h"
#include "formats/quik/layout.h"

namespace lowbit {

std::vector<int64_t> QuikQuantized::base_columns() const {
  std::vector<int64_t> cols;
  cols.reserve(static_cast<size_t>(base()));
  size_t j = 0;
  for (int64_t c = 0; c < k; ++c) {
    if (j < outlier_idx.size() && outlier_idx[j] == c) {
      ++j;
      continue;
    }
    cols.push_back(c);
  }
  return cols;
}

void QuikQuantized::dequantize(float* w) const {
  const std::vector<int64_t> cols = base_columns();
  const int64_t kb = base(), no = outliers();
  for (int64_t r = 0; r < n; ++r) {
    const float s = f16_to_f32(scale[static_cast<size_t>(r)]);
    for (int64_t j = 0; j < kb; ++j) w[r * k + cols[static_cast<size_t>(j)]] = s * static_cast<float>(wq[static_cast<size_t>(r * kb + j)]);
    for (int64_t o = 0; o < no; ++o) w[r * k + outlier_idx[static_cast<size_t>(o)]] = f16_to_f32(outlier_w[static_cast<size_t>(r * no + o)]);
  }
}

float quik_wreduced(uint16_t scale_f16, const int8_t* wq, int64_t kb) {
  int64_t sum = 0;
  for (int64_t j = 0; j < kb; ++j) sum += wq[j];
  return static_cast<float>(static_cast<double>(f16_to_f32(scale_f16)) * static_cast<double>(sum));
}

float e4m3_round(float v) {
  const float a = std::fabs(v);
  if (a == 0.0f) return v;
  int e = 0;
  std::frexp(a, &e);                             // a = f * 2^e, f in [0.5, 1): the binade's exponent is e - 1
  const int qe = std::max(e - 1 - 3, -9);        // 3 mantissa bits; subnormals below 2^-6 step by 2^-9
  const float r = std::min(std::ldexp(std::nearbyint(std::ldexp(a, -qe)), qe), 448.0f);
  return std::copysign(r, v);
}

ActQuant quik_quantize_activations(const float* xb, int64_t kb, int abits, bool fp8, int32_t* codes) {
  ActQuant q;
  if (kb == 0) return q;
  float mn = std::numeric_limits<float>::infinity(), mx = -mn, amax = 0;
  for (int64_t c = 0; c < kb; ++c) {
    LOWBIT_CHECK(std::isfinite(xb[c]), "quik: activation ", c, " is ", xb[c], " (non-finite input cannot be quantized)");
    mn = std::min(mn, xb[c]);
    mx = std::max(mx, xb[c]);
    amax = std::max(amax, std::fabs(xb[c]));
  }
  if (fp8) {
    q.sa = amax / 448.0f;
    if (!(q.sa > 0)) q.sa = 1;
    for (int64_t c = 0; c < kb; ++c) codes[c] = static_cast<int32_t>(e4m3_round(xb[c] / q.sa) * 512.0f);
    return q;
  }
  const int L = (1 << abits) - 1, H = 1 << (abits - 1);
  q.mn = mn;
  q.sa = (mx - mn) / static_cast<float>(L);
  LOWBIT_CHECK(std::isfinite(q.sa), "quik: activation range [", mn, ", ", mx, "] overflows fp32");
  if (!(q.sa > 0)) q.sa = 1;   // a constant row: every code is -H, which decodes to mn exactly
  for (int64_t c = 0; c < kb; ++c) {
    const float t = std::nearbyint((xb[c] - mn) / q.sa);
    codes[c] = static_cast<int32_t>(std::clamp(t, 0.0f, static_cast<float>(L))) - H;
  }
  return q;
}

PackedWeight pack_quik(const QuikQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage) {
  const int64_t n = q.n, k = q.k, no = q.outliers(), kb = q.base();
  LOWBIT_CHECK(n > 0 && k > 0 && no <= k, "pack_quik: shape [", n, ", ", k, "] with ", no, " outlier columns");
  LOWBIT_CHECK(q.wbits == 4 || q.wbits == 8, "pack_quik: wbits ", q.wbits, " (4 or 8)");
  LOWBIT_CHECK(q.abits == 4 || q.abits == 8 || q.abits == 16, "pack_quik: abits ", q.abits, " (4, 8 or 16)");
  LOWBIT_CHECK(!q.act_fp8 || (q.wbits == 4 && q.abits == 8), "pack_quik: FP8 activations need wbits 4 and abits 8");
  LOWBIT_CHECK(static_cast<int64_t>(q.wq.size()) == n * kb && static_cast<int64_t>(q.scale.size()) == n &&
                   static_cast<int64_t>(q.wreduced.size()) == n && static_cast<int64_t>(q.outlier_w.size()) == n * no,
               "pack_quik: part sizes do not match [", n, ", ", k, "] with ", no, " outliers");
  PackedWeight w;
  w.format = FormatId::Quik;
  w.shape = {n, k};
  w.params = {{"wbits", q.wbits}, {"abits", q.abits}, {"act_fp8", q.act_fp8 ? 1 : 0}, {"outliers", no}};
  auto put = [&](const std::string& name, DType dt, std::vector<int64_t> shape, std::shared_ptr<std::vector<uint8_t>> buf) {
    storage.push_back(buf);
    w.parts[name] = view_of(name, dt, std::move(shape), buf);
  };
  const int lo = -(1 << (q.wbits - 1)), hi = (1 << (q.wbits - 1)) - 1;
  for (int8_t v : q.wq) LOWBIT_CHECK(v >= lo && v <= hi, "pack_quik: code ", int{v}, " outside [", lo, ", ", hi, "]");
  if (q.wbits == 8) {
    put("qweight8", DType::I8, {n, kb}, bytes_of(q.wq));
  } else {
    const int64_t bytes = (kb + 1) / 2;
    std::vector<uint8_t> packed(static_cast<size_t>(n * bytes), 0);
#pragma omp parallel for if (n * kb > 65536)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < kb; ++j)
        packed[static_cast<size_t>(r * bytes + j / 2)] |=
            static_cast<uint8_t>((static_cast<uint8_t>(q.wq[static_cast<size_t>(r * kb + j)]) & 15u) << (4 * (j % 2)));
    put("qweight4", DType::U8, {n, bytes}, bytes_of(packed));
  }
  put("scale", DType::F16, {n}, bytes_of(q.scale));
  put("wreduced", DType::F32, {n}, bytes_of(q.wreduced));
  put("outlier_idx", DType::I32, {no}, bytes_of(q.outlier_idx));
  put("outlier_w", DType::F16, {n, no}, bytes_of(q.outlier_w));
  validate_packed(w, "pack_quik");
  return w;
}

}  // namespace lowbit
