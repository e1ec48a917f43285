// mixed24a format: value checks, the unpacker and the reference GEMM straight from the packed parts. Layout: layout.h.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "formats/mixed24a/layout.h"
#include "formats/pack_util.h"

namespace lowbit {
namespace {

// The fields of one (row, unit), read from the packed parts exactly as a kernel reads them.
struct UnitFields {
  uint32_t qa[4], qb;
  uint16_t meta2;
  uint8_t meta4;
};
UnitFields unit_fields(const PackedWeight& w, int64_t r, int64_t u) {
  const int64_t U = w.shape[1] / kAlignedUnit;
  UnitFields f;
  for (int64_t i = 0; i < 4; ++i) f.qa[i] = element<uint32_t>(w.parts.at("qa"), (r * U + u) * 4 + i);
  f.qb = element<uint32_t>(w.parts.at("qb"), r * U + u);
  f.meta2 = element<uint16_t>(w.parts.at("meta2"), r * U + u);
  f.meta4 = element<uint8_t>(w.parts.at("meta4"), r * U + u);
  return f;
}
uint32_t code_of(const UnitFields& f, int64_t s, int64_t i) {
  if (s < 3) return (f.qa[s] >> (2 * i)) & 3u;
  return i < 8 ? (f.qa[3] >> (4 * i)) & 15u : (f.qb >> (4 * (i - 8))) & 15u;
}
uint32_t zero_of(const UnitFields& f, int64_t s) { return s < 3 ? (f.meta2 >> (10 + 2 * s)) & 3u : f.meta4 >> 4; }
uint32_t scode_of(const UnitFields& f, int64_t s) {
  switch (s) {
    case 0: return f.meta2 & 15u;
    case 1: return (f.meta2 >> 4) & 7u;
    case 2: return (f.meta2 >> 7) & 7u;
    default: return f.meta4 & 15u;
  }
}
float scale_of(const PackedWeight& w, int64_t r, int64_t u, int64_t s, uint32_t sc) {
  const int64_t U = w.shape[1] / kAlignedUnit, rg = r / 16;
  const bool four = s == 3;
  const int64_t i = four ? rg * U + u : rg * 3 * U + 3 * u + s;
  const float st = f16_to_f32(element<uint16_t>(w.parts.at(four ? "ss4" : "ss2"), i));
  const float off = f16_to_f32(element<uint16_t>(w.parts.at(four ? "sm4" : "sm2"), i));
  return std::fma(static_cast<float>(sc), st, off);
}

}  // namespace

std::vector<int64_t> mixed24a_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params) {
  const int64_t U = k / kAlignedUnit, RG = (n + 15) / 16;
  if (part == "perm") return {k / 16};
  if (part == "qa") return {n, U, 4};
  if (part == "qb" || part == "meta2" || part == "meta4") return {n, U};
  if (part == "ss2" || part == "sm2") return {RG, 3 * U};
  if (part == "ss4" || part == "sm4") return {RG, U};
  if (part == "outlier_rowptr") return {n + 1};
  if (part == "outlier_col" || part == "outlier_val") return {params.at("nnz")};
  fail("mixed24a_part_shape: no part '", part, "'");  // unreachable: callers pass names from the table
}

void mixed24a_check_values(const PackedWeight& w, const std::string& where) {
  const int64_t n = w.shape[0], k = w.shape[1], nnz = w.params.at("nnz");
  LOWBIT_CHECK(k % kAlignedUnit == 0 && k < 65536, where, ": mixed24a needs k a multiple of 64 below 65536, got k = ", k);
  LOWBIT_CHECK(w.params.at("sparse") == 1 || nnz == 0, where, ": nnz = ", nnz, " without sparse = 1");
  LOWBIT_CHECK(nnz <= n * k, where, ": nnz = ", nnz, " exceeds n * k");
  const TensorView& perm = w.parts.at("perm");
  const int64_t G = k / 16;
  std::vector<char> seen(static_cast<size_t>(G), 0);
  for (int64_t p = 0; p < G; ++p) {
    const uint16_t g = element<uint16_t>(perm, p);
    LOWBIT_CHECK(g < G && !seen[g], where, ": part perm [", p, "] = ", g, " repeats a group or is not below G = ", G);
    seen[g] = 1;
  }
  for (const char* part : {"ss2", "sm2", "ss4", "sm4"}) {
    const TensorView& v = w.parts.at(part);
    for (int64_t i = 0; i < v.numel(); ++i)
      LOWBIT_CHECK((element<uint16_t>(v, i) & 0x7c00u) != 0x7c00u, where, ": part ", part, " [", i, "] is not finite");
  }
  if (w.params.at("sparse") != 1) return;
  check_outlier_csr(w, where);
  // The dense part is exactly 0 under an outlier (code = zero), so y = dense GEMV + CSR SpMV is exact.
  const TensorView& rp = w.parts.at("outlier_rowptr");
  const TensorView& col = w.parts.at("outlier_col");
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = element<int32_t>(rp, r); i < element<int32_t>(rp, r + 1); ++i) {
      const int64_t c = element<uint16_t>(col, i), u = c / kAlignedUnit, s = (c / 16) % 4;
      const UnitFields f = unit_fields(w, r, u);
      LOWBIT_CHECK(code_of(f, s, c % 16) == zero_of(f, s), where, ": outlier at [", r, ", ", c,
                   "] has a dense code other than its group's zero point");
    }
}

Mixed24AQuantized unpack_mixed24a(const PackedWeight& w, const std::string& where) {
  LOWBIT_CHECK(w.format == FormatId::Mixed24A, where, ": unpack_mixed24a given a weight of format '", format_name(w.format), "'");
  validate_packed(w, where);
  Mixed24AQuantized q;
  q.n = w.shape[0];
  q.k = w.shape[1];
  const int64_t G = q.groups(), U = q.units(), RG = q.row_groups();
  auto copy = [&](const char* part, auto& out) { copy_part(w.parts.at(part), out); };
  copy("perm", q.perm);
  q.codes.resize(static_cast<size_t>(q.n * q.k));
  q.zero.resize(static_cast<size_t>(q.n * G));
  q.scode.resize(q.zero.size());
  for (int64_t r = 0; r < q.n; ++r)
    for (int64_t u = 0; u < U; ++u) {
      const UnitFields f = unit_fields(w, r, u);
      for (int64_t s = 0; s < 4; ++s) {
        const int64_t p = 4 * u + s;
        q.zero[static_cast<size_t>(r * G + p)] = static_cast<uint8_t>(zero_of(f, s));
        q.scode[static_cast<size_t>(r * G + p)] = static_cast<uint8_t>(scode_of(f, s));
        for (int64_t i = 0; i < 16; ++i) q.codes[static_cast<size_t>(r * q.k + 16 * p + i)] = static_cast<uint8_t>(code_of(f, s, i));
      }
    }
  q.ss.resize(static_cast<size_t>(RG * G));
  q.sm.resize(q.ss.size());
  for (int64_t rg = 0; rg < RG; ++rg)
    for (int64_t p = 0; p < G; ++p) {
      const bool four = p % 4 == 3;
      const int64_t i = four ? rg * U + p / 4 : rg * 3 * U + 3 * (p / 4) + p % 4;
      q.ss[static_cast<size_t>(rg * G + p)] = element<uint16_t>(w.parts.at(four ? "ss4" : "ss2"), i);
      q.sm[static_cast<size_t>(rg * G + p)] = element<uint16_t>(w.parts.at(four ? "sm4" : "sm2"), i);
    }
  if (w.params.at("sparse") == 1) {
    copy("outlier_rowptr", q.outlier_rowptr);
    copy("outlier_col", q.outlier_col);
    copy("outlier_val", q.outlier_val);
  }
  return q;
}

void mixed24a_gemm_packed_ref(const PackedWeight& w, const float* x, int64_t m, const float* bias, float* y) {
  const int64_t n = w.shape[0], k = w.shape[1], U = k / kAlignedUnit;
  const TensorView& perm = w.parts.at("perm");
  const bool sparse = w.params.at("sparse") == 1;
  std::vector<double> xg(static_cast<size_t>(k));
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t c = 0; c < k; ++c)   // x gathered into the stored column order
      xg[static_cast<size_t>(c)] = x[t * k + int64_t{element<uint16_t>(perm, c / 16)} * 16 + c % 16];
    for (int64_t r = 0; r < n; ++r) {
      double acc = bias != nullptr ? bias[r] : 0.0;
      for (int64_t u = 0; u < U; ++u) {
        const UnitFields f = unit_fields(w, r, u);
        for (int64_t s = 0; s < 4; ++s) {
          const float sc = scale_of(w, r, u, s, scode_of(f, s)), z = static_cast<float>(zero_of(f, s));
          for (int64_t i = 0; i < 16; ++i)
            acc += xg[static_cast<size_t>(u * kAlignedUnit + 16 * s + i)] * ((static_cast<float>(code_of(f, s, i)) - z) * sc);
        }
      }
      if (sparse) {
        const TensorView& rp = w.parts.at("outlier_rowptr");
        for (int64_t i = element<int32_t>(rp, r); i < element<int32_t>(rp, r + 1); ++i)
          acc += xg[element<uint16_t>(w.parts.at("outlier_col"), i)] * f16_to_f32(element<uint16_t>(w.parts.at("outlier_val"), i));
      }
      y[t * n + r] = static_cast<float>(acc);
    }
  }
}

}  // namespace lowbit
