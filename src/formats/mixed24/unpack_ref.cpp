// mixed24 format: value checks on packed parts and the scalar decoder (the oracle). Layout: layout.h.
#include <cstring>

#include "core/error.h"
#include "formats/format_table.h"
#include "formats/mixed24/layout.h"
#include "formats/pack_util.h"

namespace lowbit {

void mixed24_check_values(const PackedWeight& w, const std::string& where) {
  const int64_t n = w.shape[0], k = w.shape[1], G = (k + kMixedGroup - 1) / kMixedGroup;
  const int64_t G4 = w.params.at("groups4"), nnz = w.params.at("nnz");
  LOWBIT_CHECK(k < 65536, where, ": k = ", k, " does not fit the 16-bit outlier column indices");
  LOWBIT_CHECK(w.params.at("sparse") == 1 || nnz == 0, where, ": nnz = ", nnz, " without sparse = 1");
  LOWBIT_CHECK(nnz <= n * k, where, ": nnz = ", nnz, " exceeds n * k");
  const TensorView& gb = w.parts.at("group_bits");
  int64_t fours = 0;
  std::vector<uint8_t> bits(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    bits[static_cast<size_t>(g)] = element<uint8_t>(gb, g);
    LOWBIT_CHECK(bits[static_cast<size_t>(g)] == 2 || bits[static_cast<size_t>(g)] == 4, where, ": part group_bits [", g,
                 "] = ", int{bits[static_cast<size_t>(g)]}, " (must be 2 or 4)");
    fours += bits[static_cast<size_t>(g)] == 4;
  }
  LOWBIT_CHECK(fours == G4, where, ": group_bits has ", fours, " 4-bit groups, groups4 = ", G4);
  // Padding codes of a short last group are zero.
  if (k % kMixedGroup != 0) {
    const TensorView& qw = w.parts.at("qweight");
    const int64_t W = qw.shape[1];
    const int b = bits.back();
    const int64_t first_pad_bit = W * 32 - kMixedGroup * b + (k % kMixedGroup) * b;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t bit = first_pad_bit; bit < W * 32; ++bit)
        LOWBIT_CHECK(((element<uint32_t>(qw, r * W + bit / 32) >> (bit % 32)) & 1u) == 0, where,
                     ": part qweight row ", r, " has non-zero padding codes after its ", k, " columns");
  }
  for (const auto& [part, used] : {std::pair<const char*, int64_t>{"meta2", 6 * (G - G4)}, {"zero4", 4 * G4}}) {
    const TensorView& v = w.parts.at(part);
    int64_t bad = 0;
    LOWBIT_CHECK(row_padding_is_zero(v, n, v.shape[1], used, &bad), where, ": part ", part, " row ", bad,
                 " has non-zero padding bits after its fields");
  }
  for (const char* part : {"ss2", "sm2", "scale4"}) {
    const TensorView& v = w.parts.at(part);
    for (int64_t i = 0; i < v.numel(); ++i)
      LOWBIT_CHECK((element<uint16_t>(v, i) & 0x7c00u) != 0x7c00u, where, ": part ", part, " [", i, "] is not finite");
  }
  if (w.params.at("sparse") == 1) check_outlier_csr(w, where);
}

Mixed24Quantized unpack_mixed24(const PackedWeight& w, const std::string& where) {
  LOWBIT_CHECK(w.format == FormatId::Mixed24, where, ": unpack_mixed24 given a weight of format '", format_name(w.format), "'");
  validate_packed(w, where);
  Mixed24Quantized q;
  q.n = w.shape[0];
  q.k = w.shape[1];
  const int64_t G = q.groups();
  auto copy = [&](const char* part, auto& out) { copy_part(w.parts.at(part), out); };
  copy("group_bits", q.group_bits);
  q.index();
  const TensorView& qw = w.parts.at("qweight");
  const int64_t W = qw.shape[1];
  q.codes.resize(static_cast<size_t>(q.n * q.k));
  for (int64_t r = 0; r < q.n; ++r) {
    int64_t bit = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int b = q.group_bits[static_cast<size_t>(g)];
      for (int64_t i = 0; i < kMixedGroup; ++i, bit += b) {
        const int64_t c = g * kMixedGroup + i;
        if (c >= q.k) continue;
        q.codes[static_cast<size_t>(r * q.k + c)] =
            static_cast<uint8_t>((element<uint32_t>(qw, r * W + bit / 32) >> (bit % 32)) & ((1u << b) - 1u));
      }
    }
  }
  const TensorView& meta2 = w.parts.at("meta2");
  const TensorView& z4 = w.parts.at("zero4");
  q.zero2.resize(static_cast<size_t>(q.n * q.g2));
  q.scode2.resize(q.zero2.size());
  q.zero4.resize(static_cast<size_t>(q.n * q.g4));
  for (int64_t r = 0; r < q.n; ++r) {
    for (int64_t j = 0; j < q.g2; ++j) {
      const uint32_t f = get_bits(meta2, r * meta2.shape[1], 6 * j, 6);
      q.scode2[static_cast<size_t>(r * q.g2 + j)] = static_cast<uint8_t>(f & 15u);
      q.zero2[static_cast<size_t>(r * q.g2 + j)] = static_cast<uint8_t>(f >> 4);
    }
    for (int64_t j = 0; j < q.g4; ++j)
      q.zero4[static_cast<size_t>(r * q.g4 + j)] = static_cast<uint8_t>(get_bits(z4, r * z4.shape[1], 4 * j, 4));
  }
  copy("ss2", q.ss2);
  copy("sm2", q.sm2);
  copy("scale4", q.scale4);
  if (w.params.at("sparse") == 1) {
    copy("outlier_rowptr", q.outlier_rowptr);
    copy("outlier_col", q.outlier_col);
    copy("outlier_val", q.outlier_val);
  }
  return q;
}

}  // namespace lowbit
