// quik format: part shapes, value checks, the unpacker and the integer-exact reference GEMM. Layout: layout.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "formats/pack_util.h"
#include "formats/quik/layout.h"

namespace lowbit {
namespace {

// A weight's codes, read with its parameters and part resolved once (the checks and the reference walk every code:
// a map lookup per code cost seconds per 7B block).
class Codes {
 public:
  explicit Codes(const PackedWeight& w)
      : kb_(w.shape[1] - w.params.at("outliers")), w8_(w.params.at("wbits") == 8),
        p_(w.parts.at(w8_ ? "qweight8" : "qweight4").data), row_bytes_(w8_ ? kb_ : (kb_ + 1) / 2) {}
  int8_t operator()(int64_t r, int64_t j) const {
    if (w8_) return static_cast<int8_t>(p_[r * row_bytes_ + j]);
    const int nib = (p_[r * row_bytes_ + j / 2] >> (4 * (j % 2))) & 15;
    return static_cast<int8_t>(nib >= 8 ? nib - 16 : nib);
  }
  void row(int64_t r, int8_t* out) const {
    for (int64_t j = 0; j < kb_; ++j) out[j] = (*this)(r, j);
  }

 private:
  int64_t kb_;
  bool w8_;
  const uint8_t* p_;   // bytes: no alignment needed
  int64_t row_bytes_;
};

std::vector<int64_t> base_columns_of(const PackedWeight& w) {
  QuikQuantized q;
  q.k = w.shape[1];
  const TensorView& idx = w.parts.at("outlier_idx");
  for (int64_t i = 0; i < idx.numel(); ++i) q.outlier_idx.push_back(element<int32_t>(idx, i));
  return q.base_columns();
}

}  // namespace

std::vector<int64_t> quik_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params) {
  const int64_t no = params.at("outliers"), kb = k - no;
  if (part == "qweight8") return {n, kb};
  if (part == "qweight4") return {n, (kb + 1) / 2};
  if (part == "scale" || part == "wreduced") return {n};
  if (part == "outlier_idx") return {no};
  if (part == "outlier_w") return {n, no};
  fail("quik_part_shape: no part '", part, "'");  // unreachable: callers pass names from the table
}

void quik_check_values(const PackedWeight& w, const std::string& where) {
  const int64_t n = w.shape[0], k = w.shape[1], no = w.params.at("outliers"), kb = k - no;
  const int64_t wbits = w.params.at("wbits"), abits = w.params.at("abits");
  LOWBIT_CHECK(wbits == 4 || wbits == 8, where, ": wbits = ", wbits, " (4 or 8)");
  LOWBIT_CHECK(abits == 4 || abits == 8 || abits == 16, where, ": abits = ", abits, " (4, 8 or 16)");
  LOWBIT_CHECK(w.params.at("act_fp8") == 0 || (wbits == 4 && abits == 8), where, ": act_fp8 needs wbits 4 and abits 8");
  // int32 accumulation cannot overflow: kb * 2^(abits-1) * 2^(wbits-1) < 2^31 (fp8: e4m3 * 2^9 < 2^18)
  const double bound = static_cast<double>(kb) * (w.params.at("act_fp8") ? 229376.0 : std::ldexp(1.0, static_cast<int>(abits == 16 ? 0 : abits - 1))) *
                       std::ldexp(1.0, static_cast<int>(wbits - 1));
  LOWBIT_CHECK(abits == 16 || w.params.at("act_fp8") == 1 || bound < 2147483648.0, where, ": k = ", k,
               " is too wide for exact int32 accumulation at W", wbits, "A", abits);
  const TensorView& idx = w.parts.at("outlier_idx");
  for (int64_t i = 0; i < no; ++i) {
    const int32_t c = element<int32_t>(idx, i);
    LOWBIT_CHECK(c >= 0 && c < k && (i == 0 || c > element<int32_t>(idx, i - 1)), where, ": part outlier_idx [", i,
                 "] = ", c, " is outside [0, k) or not increasing");
  }
  if (wbits == 4 && kb % 2 == 1) {
    const TensorView& q4 = w.parts.at("qweight4");
    for (int64_t r = 0; r < n; ++r)
      LOWBIT_CHECK((element<uint8_t>(q4, r * ((kb + 1) / 2) + kb / 2) >> 4) == 0, where, ": part qweight4 row ", r,
                   " has a non-zero padding nibble");
  }
  for (const char* part : {"scale", "outlier_w"}) {
    const TensorView& v = w.parts.at(part);
    for (int64_t i = 0; i < v.numel(); ++i)
      LOWBIT_CHECK((element<uint16_t>(v, i) & 0x7c00u) != 0x7c00u, where, ": part ", part, " [", i, "] is not finite");
  }
  // wReduced is redundant by definition; a mismatch is a corrupt or foreign file.
  const Codes codes(w);
  const TensorView &scale = w.parts.at("scale"), &wreduced = w.parts.at("wreduced");
  int64_t first_bad = n;
#pragma omp parallel if (n * kb > 65536)
  {
    std::vector<int8_t> row(static_cast<size_t>(kb));
#pragma omp for reduction(min : first_bad)
    for (int64_t r = 0; r < n; ++r) {
      codes.row(r, row.data());
      const float want = quik_wreduced(element<uint16_t>(scale, r), row.data(), kb), got = element<float>(wreduced, r);
      if (std::memcmp(&want, &got, 4) != 0) first_bad = std::min(first_bad, r);
    }
  }
  if (first_bad < n) {
    std::vector<int8_t> row(static_cast<size_t>(kb));
    codes.row(first_bad, row.data());
    fail(where, ": part wreduced [", first_bad, "] = ", element<float>(wreduced, first_bad),
         " is not scale * sum of the row's codes (", quik_wreduced(element<uint16_t>(scale, first_bad), row.data(), kb),
         ")");
  }
}

QuikQuantized unpack_quik(const PackedWeight& w, const std::string& where) {
  LOWBIT_CHECK(w.format == FormatId::Quik, where, ": unpack_quik given a weight of format '", format_name(w.format), "'");
  validate_packed(w, where);
  QuikQuantized q;
  q.n = w.shape[0];
  q.k = w.shape[1];
  q.wbits = static_cast<int>(w.params.at("wbits"));
  q.abits = static_cast<int>(w.params.at("abits"));
  q.act_fp8 = w.params.at("act_fp8") == 1;
  auto copy = [&](const char* part, auto& out) { copy_part(w.parts.at(part), out); };
  copy("outlier_idx", q.outlier_idx);
  copy("scale", q.scale);
  copy("wreduced", q.wreduced);
  copy("outlier_w", q.outlier_w);
  const int64_t kb = q.base();
  q.wq.resize(static_cast<size_t>(q.n * kb));
  const Codes codes(w);
#pragma omp parallel for if (q.n * kb > 65536)
  for (int64_t r = 0; r < q.n; ++r) codes.row(r, q.wq.data() + r * kb);
  return q;
}

void quik_gemm_packed_ref(const PackedWeight& w, const float* x, int64_t m, const float* bias, float* y,
                          std::vector<int64_t>* acc_out) {
  const int64_t n = w.shape[0], k = w.shape[1], no = w.params.at("outliers"), kb = k - no;
  const int abits = static_cast<int>(w.params.at("abits"));
  const bool fp8 = w.params.at("act_fp8") == 1;
  const std::vector<int64_t> base = base_columns_of(w);
  const TensorView& idx = w.parts.at("outlier_idx");
  std::vector<float> xb(static_cast<size_t>(kb));
  std::vector<int32_t> codes(static_cast<size_t>(kb));
  const Codes code_at(w);
  if (acc_out) acc_out->assign(static_cast<size_t>(m * n), 0);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < kb; ++j) xb[static_cast<size_t>(j)] = x[t * k + base[static_cast<size_t>(j)]];
    ActQuant aq;
    if (abits != 16) aq = quik_quantize_activations(xb.data(), kb, abits, fp8, codes.data());
    for (int64_t r = 0; r < n; ++r) {
      const double sw = f16_to_f32(element<uint16_t>(w.parts.at("scale"), r));
      double out = bias != nullptr ? bias[r] : 0.0;
      if (abits == 16) {
        for (int64_t j = 0; j < kb; ++j)
          out += static_cast<double>(xb[static_cast<size_t>(j)]) * static_cast<double>(static_cast<float>(sw) * static_cast<float>(code_at(r, j)));
      } else {
        int64_t acc = 0;   // the integer GEMM, in integers
        for (int64_t j = 0; j < kb; ++j) acc += static_cast<int64_t>(codes[static_cast<size_t>(j)]) * code_at(r, j);
        if (acc_out) (*acc_out)[static_cast<size_t>(t * n + r)] = acc;
        if (fp8) {
          out += static_cast<double>(aq.sa) * sw * static_cast<double>(acc) / 512.0;
        } else {
          const double H = std::ldexp(1.0, abits - 1);
          out += static_cast<double>(aq.sa) * sw * static_cast<double>(acc) +
                 (H * aq.sa + aq.mn) * static_cast<double>(element<float>(w.parts.at("wreduced"), r));
        }
      }
      for (int64_t o = 0; o < no; ++o)
        out += static_cast<double>(f16_to_f32(f32_to_f16(x[t * k + element<int32_t>(idx, o)]))) *
               f16_to_f32(element<uint16_t>(w.parts.at("outlier_w"), r * no + o));
      y[t * n + r] = static_cast<float>(out);
    }
  }
}

}  // namespace lowbit
