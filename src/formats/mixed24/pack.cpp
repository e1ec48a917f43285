// mixed24 format: the encoded value of a weight and packing (layout: layout.h, docs/formats/mixed24.md).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "formats/mixed24/layout.h"
#include "formats/pack_util.h"

namespace lowbit {

void Mixed24Quantized::index() {
  slot.assign(group_bits.size(), 0);
  g2 = g4 = 0;
  for (size_t g = 0; g < group_bits.size(); ++g) slot[g] = group_bits[g] == 4 ? g4++ : g2++;
}

// One definition of the second-order scale: one fused multiply-add in fp32 (a single rounding, so no compiler
// contraction choice can change it) of the stored fp16 step and offset.
float Mixed24Quantized::scale2(int64_t r, int64_t j) const {
  const size_t i = static_cast<size_t>((r / kMixedRowGroup) * g2 + j);
  return std::fma(static_cast<float>(scode2[static_cast<size_t>(r * g2 + j)]), f16_to_f32(ss2[i]), f16_to_f32(sm2[i]));
}

float Mixed24Quantized::value(int64_t r, int64_t c) const {
  if (const int64_t i = csr_find(outlier_rowptr, outlier_col, r, c); i >= 0) return f16_to_f32(outlier_val[static_cast<size_t>(i)]);
  const int64_t g = c / kMixedGroup, j = slot[static_cast<size_t>(g)];
  const float q = static_cast<float>(codes[static_cast<size_t>(r * k + c)]);
  if (group_bits[static_cast<size_t>(g)] == 4)
    return (q - static_cast<float>(zero4[static_cast<size_t>(r * g4 + j)])) * f16_to_f32(scale4[static_cast<size_t>(r * g4 + j)]);
  return (q - static_cast<float>(zero2[static_cast<size_t>(r * g2 + j)])) * scale2(r, j);
}

void Mixed24Quantized::dequantize(float* w) const {
#pragma omp parallel for if (n * k > 65536)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = value(r, c);
}

PackedWeight pack_mixed24(const Mixed24Quantized& qin, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage) {
  Mixed24Quantized q = qin;
  q.index();
  const int64_t n = q.n, k = q.k, G = q.groups(), RG = q.row_groups();
  LOWBIT_CHECK(n > 0 && k > 0 && k < 65536, "pack_mixed24: shape [", n, ", ", k, "] needs n > 0 and 0 < k < 65536");
  LOWBIT_CHECK(static_cast<int64_t>(q.group_bits.size()) == G && static_cast<int64_t>(q.codes.size()) == n * k,
               "pack_mixed24: ", q.group_bits.size(), " group widths and ", q.codes.size(), " codes for [", n, ", ", k, "]");
  for (uint8_t b : q.group_bits) LOWBIT_CHECK(b == 2 || b == 4, "pack_mixed24: group width ", int{b}, " (2 or 4)");
  LOWBIT_CHECK(static_cast<int64_t>(q.zero2.size()) == n * q.g2 && q.scode2.size() == q.zero2.size() &&
                   static_cast<int64_t>(q.ss2.size()) == RG * q.g2 && q.sm2.size() == q.ss2.size() &&
                   static_cast<int64_t>(q.scale4.size()) == n * q.g4 && q.zero4.size() == q.scale4.size(),
               "pack_mixed24: scale/zero arrays do not match the group widths");
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      LOWBIT_CHECK(q.codes[static_cast<size_t>(r * k + c)] >> q.group_bits[static_cast<size_t>(c / kMixedGroup)] == 0,
                   "pack_mixed24: code at [", r, ", ", c, "] does not fit its group");
  const bool sparse = !q.outlier_rowptr.empty();
  PackedWeight w;
  w.format = FormatId::Mixed24;
  w.shape = {n, k};
  w.params = {{"groups4", q.g4}, {"sparse", sparse ? 1 : 0}, {"nnz", sparse ? static_cast<int64_t>(q.outlier_col.size()) : 0}};
  const int64_t W = q.g2 + 2 * q.g4;
  std::vector<uint32_t> words(static_cast<size_t>(n * W), 0u);
  const int64_t W2 = (6 * q.g2 + 31) / 32, W4 = (4 * q.g4 + 31) / 32;
  std::vector<uint32_t> meta2(static_cast<size_t>(n * W2), 0u), zero4(static_cast<size_t>(n * W4), 0u);
  for (int64_t r = 0; r < n; ++r) {
    int64_t bit = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int b = q.group_bits[static_cast<size_t>(g)];
      for (int64_t i = 0; i < kMixedGroup; ++i, bit += b) {
        const int64_t c = g * kMixedGroup + i;
        const uint32_t code = c < k ? q.codes[static_cast<size_t>(r * k + c)] : 0u;
        words[static_cast<size_t>(r * W + bit / 32)] |= code << (bit % 32);   // 2 and 4 divide 32: no straddling
      }
    }
    for (int64_t j = 0; j < q.g2; ++j) {
      const size_t i = static_cast<size_t>(r * q.g2 + j);
      LOWBIT_CHECK(q.zero2[i] < 4 && q.scode2[i] < 16, "pack_mixed24: 2-bit zero or scale code out of range");
      put_bits(meta2.data() + r * W2, 6 * j, 6, static_cast<uint32_t>(q.scode2[i] | (q.zero2[i] << 4)));
    }
    for (int64_t j = 0; j < q.g4; ++j) {
      const uint8_t z = q.zero4[static_cast<size_t>(r * q.g4 + j)];
      LOWBIT_CHECK(z < 16, "pack_mixed24: 4-bit zero ", int{z}, " out of range");
      put_bits(zero4.data() + r * W4, 4 * j, 4, z);
    }
  }
  auto put = [&](const std::string& name, DType dt, std::vector<int64_t> shape, std::shared_ptr<std::vector<uint8_t>> buf) {
    storage.push_back(buf);
    w.parts[name] = view_of(name, dt, std::move(shape), buf);
  };
  put("group_bits", DType::U8, {G}, bytes_of(q.group_bits));
  put("qweight", DType::I32, {n, W}, bytes_of(words));
  put("meta2", DType::I32, {n, W2}, bytes_of(meta2));
  put("ss2", DType::F16, {RG, q.g2}, bytes_of(q.ss2));
  put("sm2", DType::F16, {RG, q.g2}, bytes_of(q.sm2));
  put("scale4", DType::F16, {n, q.g4}, bytes_of(q.scale4));
  put("zero4", DType::I32, {n, W4}, bytes_of(zero4));
  if (sparse) {
    const int64_t nnz = static_cast<int64_t>(q.outlier_col.size());
    put("outlier_rowptr", DType::I32, {n + 1}, bytes_of(q.outlier_rowptr));
    put("outlier_col", DType::I16, {nnz}, bytes_of(q.outlier_col));
    put("outlier_val", DType::F16, {nnz}, bytes_of(q.outlier_val));
  }
  validate_packed(w, "pack_mixed24");
  return w;
}

}  // namespace lowbit
