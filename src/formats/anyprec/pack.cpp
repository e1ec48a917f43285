// Any-precision format: the encoded value of a weight and packing parent codes into bitplanes (layout: layout.h,
// drawing: docs/formats/anyprec.md).
#include <bit>

#include "core/error.h"
#include "core/half.h"
#include "formats/anyprec/layout.h"
#include "formats/format_table.h"
#include "formats/pack_util.h"

namespace lowbit {

static_assert(std::endian::native == std::endian::little, "plane words are stored little-endian");

std::vector<int> AnyPrecQuantized::served_widths() const {
  std::vector<int> out;
  for (int b = kAnyPrecMinBits; b <= planes; ++b)
    if (serves(b)) out.push_back(b);
  return out;
}

// The one definition of the encoded value (see layout.h).
float AnyPrecQuantized::value(int64_t r, int64_t c, int b) const {
  if (const int64_t i = csr_find(outlier_rowptr, outlier_col, r, c); i >= 0) return f16_to_f32(outlier_val[static_cast<size_t>(i)]);
  const int code = codes[static_cast<size_t>(r * k + c)] >> (planes - b);
  return f16_to_f32(luts.at(b)[static_cast<size_t>((r << b) + code)]);
}

void AnyPrecQuantized::dequantize(int b, float* w) const {
  LOWBIT_CHECK(serves(b), "anyprec: width ", b, " is not served");
#pragma omp parallel for if (n * k > 65536)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = value(r, c, b);
}

PackedWeight pack_anyprec(const AnyPrecQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage) {
  LOWBIT_CHECK(q.n > 0 && q.k > 0, "pack_anyprec: shape [", q.n, ", ", q.k, "] must be positive");
  LOWBIT_CHECK(q.planes >= kAnyPrecMinBits && q.planes <= kAnyPrecMaxBits, "pack_anyprec: ", q.planes,
               " planes, need ", kAnyPrecMinBits, "..", kAnyPrecMaxBits);
  LOWBIT_CHECK(static_cast<int64_t>(q.codes.size()) == q.n * q.k, "pack_anyprec: ", q.codes.size(),
               " codes for shape [", q.n, ", ", q.k, "]");
  for (size_t i = 0; i < q.codes.size(); ++i)
    LOWBIT_CHECK(q.codes[i] >> q.planes == 0, "pack_anyprec: code ", int{q.codes[i]}, " at index ", i,
                 " needs more than ", q.planes, " bits");
  for (const auto& [b, lut] : q.luts)
    LOWBIT_CHECK(q.serves(b) && static_cast<int64_t>(lut.size()) == (q.n << b), "pack_anyprec: LUT for width ", b,
                 " has ", lut.size(), " entries or is not a served width");
  LOWBIT_CHECK(q.outlier_rowptr.empty() || static_cast<int64_t>(q.outlier_rowptr.size()) == q.n + 1,
               "pack_anyprec: outlier_rowptr has ", q.outlier_rowptr.size(), " entries, need n + 1");
  LOWBIT_CHECK(q.outlier_col.size() == q.outlier_val.size(), "pack_anyprec: outlier columns and values differ");

  PackedWeight w;
  w.format = FormatId::AnyPrec;
  w.shape = {q.n, q.k};
  const bool sparse = !q.outlier_rowptr.empty();
  w.params = {{"planes", q.planes}, {"widths", q.widths}, {"sparse", sparse ? 1 : 0}, {"nnz", sparse ? q.nnz() : 0}};

  const int64_t W = anyprec_words_per_row(q.k);
  std::vector<uint32_t> planes(static_cast<size_t>(q.planes * q.n * W), 0u);
  for (int64_t r = 0; r < q.n; ++r)
    for (int64_t c = 0; c < q.k; ++c) {
      const uint32_t code = q.codes[static_cast<size_t>(r * q.k + c)];
      const PlaneSlot s = anyprec_slot(c, W);
      for (int j = 0; j < q.planes; ++j) {   // plane j = bit (planes-1-j): most significant first
        const uint32_t bit = (code >> (q.planes - 1 - j)) & 1u;
        planes[static_cast<size_t>((j * q.n + r) * W + s.word)] |= bit << s.bit;
      }
    }
  auto planes_buf = bytes_of(planes);
  storage.push_back(planes_buf);
  w.parts["planes"] = view_of("planes", DType::I32, {q.planes, q.n, W}, planes_buf);
  for (int b : q.served_widths()) {
    const auto it = q.luts.find(b);
    LOWBIT_CHECK(it != q.luts.end(), "pack_anyprec: served width ", b, " has no LUT");
    auto buf = bytes_of(it->second);
    storage.push_back(buf);
    const std::string name = "lut" + std::to_string(b);
    w.parts[name] = view_of(name, DType::F16, {q.n, int64_t{1} << b}, buf);
  }
  if (sparse) {
    auto rp = bytes_of(q.outlier_rowptr), col = bytes_of(q.outlier_col), val = bytes_of(q.outlier_val);
    storage.insert(storage.end(), {rp, col, val});
    w.parts["outlier_rowptr"] = view_of("outlier_rowptr", DType::I32, {q.n + 1}, rp);
    w.parts["outlier_col"] = view_of("outlier_col", DType::I32, {q.nnz()}, col);
    w.parts["outlier_val"] = view_of("outlier_val", DType::F16, {q.nnz()}, val);
  }
  validate_packed(w, "pack_anyprec");   // the checks every reader runs
  return w;
}

}  // namespace lowbit
