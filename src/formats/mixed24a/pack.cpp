// mixed24a format: the encoded value of a weight and packing (layout: layout.h, docs/formats/mixed24a.md).
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "formats/mixed24a/layout.h"
#include "formats/pack_util.h"

namespace lowbit {

// One definition of a two-order scale: one fused multiply-add in fp32 of the stored fp16 step and offset.
float Mixed24AQuantized::scale(int64_t r, int64_t p) const {
  const size_t i = static_cast<size_t>((r / 16) * groups() + p);
  return std::fma(static_cast<float>(scode[static_cast<size_t>(r * groups() + p)]), f16_to_f32(ss[i]), f16_to_f32(sm[i]));
}

float Mixed24AQuantized::value(int64_t r, int64_t c) const {
  if (const int64_t i = csr_find(outlier_rowptr, outlier_col, r, c); i >= 0) return f16_to_f32(outlier_val[static_cast<size_t>(i)]);
  const int64_t p = c / 16;
  return (static_cast<float>(codes[static_cast<size_t>(r * k + c)]) - static_cast<float>(zero[static_cast<size_t>(r * groups() + p)])) *
         scale(r, p);
}

void Mixed24AQuantized::dequantize(float* w) const {
#pragma omp parallel for if (n * k > 65536)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) w[r * k + perm[static_cast<size_t>(c / 16)] * 16 + c % 16] = value(r, c);
}

PackedWeight pack_mixed24a(const Mixed24AQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage) {
  const int64_t n = q.n, k = q.k, G = q.groups(), U = q.units(), RG = q.row_groups();
  LOWBIT_CHECK(n > 0 && k > 0 && k % kAlignedUnit == 0 && k < 65536, "pack_mixed24a: shape [", n, ", ", k,
               "] needs n > 0 and k a multiple of 64 below 65536");
  LOWBIT_CHECK(static_cast<int64_t>(q.perm.size()) == G && static_cast<int64_t>(q.codes.size()) == n * k &&
                   static_cast<int64_t>(q.zero.size()) == n * G && q.scode.size() == q.zero.size() &&
                   static_cast<int64_t>(q.ss.size()) == RG * G && q.sm.size() == q.ss.size(),
               "pack_mixed24a: part sizes do not match the shape [", n, ", ", k, "]");
  std::vector<char> seen(static_cast<size_t>(G), 0);
  for (uint16_t g : q.perm) {
    LOWBIT_CHECK(g < G && !seen[g], "pack_mixed24a: perm is not a permutation of the ", G, " groups");
    seen[g] = 1;
  }
  const bool sparse = !q.outlier_rowptr.empty();
  PackedWeight w;
  w.format = FormatId::Mixed24A;
  w.shape = {n, k};
  w.params = {{"sparse", sparse ? 1 : 0}, {"nnz", sparse ? static_cast<int64_t>(q.outlier_col.size()) : 0}};
  std::vector<uint32_t> qa(static_cast<size_t>(n * U * 4), 0u), qb(static_cast<size_t>(n * U), 0u);
  std::vector<uint16_t> meta2(static_cast<size_t>(n * U), 0u), ss2(static_cast<size_t>(RG * 3 * U)), sm2(ss2.size()),
      ss4(static_cast<size_t>(RG * U)), sm4(ss4.size());
  std::vector<uint8_t> meta4(static_cast<size_t>(n * U), 0u);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t u = 0; u < U; ++u) {
      uint32_t* a = qa.data() + (r * U + u) * 4;
      for (int64_t s = 0; s < 4; ++s) {
        const int64_t p = 4 * u + s, b = mixed24a_code_bits(p);
        const uint8_t z = q.zero[static_cast<size_t>(r * G + p)], sc = q.scode[static_cast<size_t>(r * G + p)];
        LOWBIT_CHECK(z >> b == 0 && sc >> mixed24a_scale_bits(p) == 0, "pack_mixed24a: zero ", int{z}, " or scale code ",
                     int{sc}, " of row ", r, " group ", p, " does not fit its field");
        for (int64_t i = 0; i < 16; ++i) {
          const uint32_t code = q.codes[static_cast<size_t>(r * k + 16 * p + i)];
          LOWBIT_CHECK(code >> b == 0, "pack_mixed24a: code at [", r, ", ", 16 * p + i, "] does not fit ", b, " bits");
          if (s < 3) a[s] |= code << (2 * i);
          else if (i < 8) a[3] |= code << (4 * i);
          else qb[static_cast<size_t>(r * U + u)] |= code << (4 * (i - 8));
        }
      }
      auto f = [&](int64_t s) { return static_cast<uint32_t>(q.scode[static_cast<size_t>(r * G + 4 * u + s)]); };
      auto z = [&](int64_t s) { return static_cast<uint32_t>(q.zero[static_cast<size_t>(r * G + 4 * u + s)]); };
      meta2[static_cast<size_t>(r * U + u)] = static_cast<uint16_t>(f(0) | f(1) << 4 | f(2) << 7 | z(0) << 10 | z(1) << 12 | z(2) << 14);
      meta4[static_cast<size_t>(r * U + u)] = static_cast<uint8_t>(f(3) | z(3) << 4);
    }
  for (int64_t rg = 0; rg < RG; ++rg)
    for (int64_t p = 0; p < G; ++p) {
      const size_t from = static_cast<size_t>(rg * G + p);
      const size_t to2 = static_cast<size_t>(rg * 3 * U + 3 * (p / 4) + p % 4), to4 = static_cast<size_t>(rg * U + p / 4);
      if (p % 4 == 3) {
        ss4[to4] = q.ss[from];
        sm4[to4] = q.sm[from];
      } else {
        ss2[to2] = q.ss[from];
        sm2[to2] = q.sm[from];
      }
    }
  auto put = [&](const std::string& name, DType dt, std::vector<int64_t> shape, std::shared_ptr<std::vector<uint8_t>> buf) {
    storage.push_back(buf);
    w.parts[name] = view_of(name, dt, std::move(shape), buf);
  };
  put("perm", DType::I16, {G}, bytes_of(q.perm));
  put("qa", DType::I32, {n, U, 4}, bytes_of(qa));
  put("qb", DType::I32, {n, U}, bytes_of(qb));
  put("meta2", DType::I16, {n, U}, bytes_of(meta2));
  put("meta4", DType::U8, {n, U}, bytes_of(meta4));
  put("ss2", DType::F16, {RG, 3 * U}, bytes_of(ss2));
  put("sm2", DType::F16, {RG, 3 * U}, bytes_of(sm2));
  put("ss4", DType::F16, {RG, U}, bytes_of(ss4));
  put("sm4", DType::F16, {RG, U}, bytes_of(sm4));
  if (sparse) {
    const int64_t nnz = static_cast<int64_t>(q.outlier_col.size());
    put("outlier_rowptr", DType::I32, {n + 1}, bytes_of(q.outlier_rowptr));
    put("outlier_col", DType::I16, {nnz}, bytes_of(q.outlier_col));
    put("outlier_val", DType::F16, {nnz}, bytes_of(q.outlier_val));
  }
  validate_packed(w, "pack_mixed24a");
  return w;
}

}  // namespace lowbit
