// Any-precision format: value checks on packed parts and the scalar decoder (the oracle every faster path is
// tested against). Layout: layout.h and docs/formats/anyprec.md.
#include <cstring>

#include "core/error.h"
#include "formats/anyprec/layout.h"
#include "formats/format_table.h"
#include "formats/pack_util.h"

namespace lowbit {

void anyprec_check_values(const PackedWeight& w, const std::string& where) {
  const int64_t n = w.shape[0], k = w.shape[1];
  const int planes = static_cast<int>(w.params.at("planes"));
  const int64_t widths = w.params.at("widths"), nnz = w.params.at("nnz");
  const int64_t allowed = ((int64_t{1} << (planes + 1)) - 1) & ~int64_t{3};   // bits 2..planes
  LOWBIT_CHECK((widths & ~allowed) == 0, where, ": widths 0x", std::hex, widths, std::dec,
               " names a width outside 2..planes = ", planes);
  LOWBIT_CHECK((widths >> planes) & 1, where, ": ", planes, " planes stored but width ", planes,
               " is not served (the widest served width must equal planes)");
  LOWBIT_CHECK(w.params.at("sparse") == 1 || nnz == 0, where, ": nnz = ", nnz, " without sparse = 1");
  LOWBIT_CHECK(nnz <= n * k, where, ": nnz = ", nnz, " exceeds n * k = ", n * k);

  // Padding columns k .. 32 W - 1 hold zero in every plane.
  const TensorView& pv = w.parts.at("planes");
  const int64_t W = anyprec_words_per_row(k);
  std::vector<uint32_t> pad(static_cast<size_t>(W), 0u);
  for (int64_t c = k; c < 32 * W; ++c) {
    const PlaneSlot s = anyprec_slot(c, W);
    pad[static_cast<size_t>(s.word)] |= 1u << s.bit;
  }
  for (int64_t row = 0; row < planes * n; ++row)
    for (int64_t i = 0; i < W; ++i) {
      if (pad[static_cast<size_t>(i)] == 0) continue;
      const uint32_t word = element<uint32_t>(pv, row * W + i);
      LOWBIT_CHECK((word & pad[static_cast<size_t>(i)]) == 0, where, ": part planes (plane ", row / n, ", row ",
                   row % n, ") has non-zero padding bits after its ", k, " columns");
    }
  for (int b = kAnyPrecMinBits; b <= planes; ++b) {
    if (((widths >> b) & 1) == 0) continue;
    const TensorView& lut = w.parts.at("lut" + std::to_string(b));
    for (int64_t i = 0; i < (n << b); ++i) {
      const uint16_t h = element<uint16_t>(lut, i);
      LOWBIT_CHECK((h & 0x7c00u) != 0x7c00u, where, ": part lut", b, " [", i >> b, ", ", i & ((1 << b) - 1),
                   "] is not finite (fp16 bits 0x", std::hex, h, std::dec, ")");
    }
  }
  if (w.params.at("sparse") == 1) check_outlier_csr(w, where);
}

AnyPrecQuantized unpack_anyprec(const PackedWeight& w, const std::string& where) {
  LOWBIT_CHECK(w.format == FormatId::AnyPrec, where, ": unpack_anyprec given a weight of format '", format_name(w.format), "'");
  validate_packed(w, where);
  AnyPrecQuantized q;
  q.n = w.shape[0];
  q.k = w.shape[1];
  q.planes = static_cast<int>(w.params.at("planes"));
  q.widths = static_cast<uint32_t>(w.params.at("widths"));
  const TensorView& pv = w.parts.at("planes");
  const int64_t W = anyprec_words_per_row(q.k);
  q.codes.assign(static_cast<size_t>(q.n * q.k), 0);
#pragma omp parallel for if (q.n * q.k > 65536)
  for (int64_t r = 0; r < q.n; ++r)
    for (int64_t c = 0; c < q.k; ++c) {
      const PlaneSlot s = anyprec_slot(c, W);
      uint32_t code = 0;
      for (int j = 0; j < q.planes; ++j)
        code = (code << 1) | ((element<uint32_t>(pv, (j * q.n + r) * W + s.word) >> s.bit) & 1u);
      q.codes[static_cast<size_t>(r * q.k + c)] = static_cast<uint8_t>(code);
    }
  for (int b : q.served_widths()) {
    copy_part(w.parts.at("lut" + std::to_string(b)), q.luts[b]);   // [n, 2^b], size checked by validate_packed
  }
  if (w.params.at("sparse") == 1) {
    copy_part(w.parts.at("outlier_rowptr"), q.outlier_rowptr);
    copy_part(w.parts.at("outlier_col"), q.outlier_col);
    copy_part(w.parts.at("outlier_val"), q.outlier_val);
  }
  return q;
}

uint64_t anyprec_view_bits(const PackedWeight& w, int b) {
  check_packed_structure(w, "anyprec_view_bits");
  LOWBIT_CHECK(w.format == FormatId::AnyPrec, "anyprec_view_bits: format ", format_name(w.format));
  const int64_t n = w.shape[0], W = anyprec_words_per_row(w.shape[1]);
  LOWBIT_CHECK(b >= kAnyPrecMinBits && b <= w.params.at("planes") && ((w.params.at("widths") >> b) & 1),
               "anyprec_view_bits: width ", b, " is not served");
  uint64_t bits = static_cast<uint64_t>(b) * n * W * 32 + (static_cast<uint64_t>(n) << b) * 16;
  if (w.params.at("sparse") == 1) bits += static_cast<uint64_t>(n + 1) * 32 + w.params.at("nnz") * 48ull;
  return bits;
}

}  // namespace lowbit
