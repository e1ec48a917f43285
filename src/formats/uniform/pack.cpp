// Uniform format: the encoded value of a weight, and packing codes into qweight words (layout: layout.h, and the
// drawing in docs/formats/uniform.md).
//
// qweight row r is one little-endian bit stream of k codes, `bits` each: code c occupies stream bits
// [c*bits, (c+1)*bits), stream bit i is bit (i % 32) of word i / 32, and a code may straddle two words (bits 3,
// 5, 6, 7). Each row starts on a fresh word; the unused high bits of a row's last word are zero.
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "formats/pack_util.h"
#include "formats/uniform/layout.h"

namespace lowbit {

static_assert(std::endian::native == std::endian::little, "qweight words are stored little-endian");

float UniformQuantized::zero(int64_t r, int g) const {
  if (symmetric) return static_cast<float>(1 << (bits - 1));
  return static_cast<float>(zeros[static_cast<size_t>(r * groups() + g)]);
}

// The one definition of the encoded value: (q - z) is an exact small integer in fp32, so the only rounding is
// the product with the fp16 scale widened (exactly) to fp32.
float UniformQuantized::dequant(int64_t r, int64_t c) const {
  const int g = group_of(c);
  const float scale = f16_to_f32(scales[static_cast<size_t>(r * groups() + g)]);
  return (static_cast<float>(codes[static_cast<size_t>(r * k + c)]) - zero(r, g)) * scale;
}

void UniformQuantized::dequantize(float* w) const {
#pragma omp parallel for if (n * k > 65536)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = dequant(r, c);
}


PackedWeight pack_uniform(const UniformQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage) {
  // Everything the packed form cannot represent is refused here, before any byte is written.
  LOWBIT_CHECK(q.bits >= 2 && q.bits <= 8, "pack_uniform: bits ", q.bits, " out of range [2, 8]");
  LOWBIT_CHECK(q.n > 0 && q.k > 0, "pack_uniform: shape [", q.n, ", ", q.k, "] must be positive");
  LOWBIT_CHECK(q.group_size >= 1 && q.group_size <= q.k, "pack_uniform: group_size ", q.group_size,
               " out of range [1, ", q.k, "]");
  const int64_t groups = q.groups();
  const uint32_t levels = 1u << q.bits;
  LOWBIT_CHECK(static_cast<int64_t>(q.codes.size()) == q.n * q.k, "pack_uniform: ", q.codes.size(),
               " codes for shape [", q.n, ", ", q.k, "]");
  LOWBIT_CHECK(static_cast<int64_t>(q.scales.size()) == q.n * groups, "pack_uniform: ", q.scales.size(),
               " scales, need n * G = ", q.n * groups);
  LOWBIT_CHECK(q.symmetric ? q.zeros.empty() : static_cast<int64_t>(q.zeros.size()) == q.n * groups,
               "pack_uniform: ", q.zeros.size(), " zeros, need ", q.symmetric ? 0 : q.n * groups,
               q.symmetric ? " (symmetric)" : "");
  LOWBIT_CHECK(q.g_idx.empty() || static_cast<int64_t>(q.g_idx.size()) == q.k, "pack_uniform: g_idx has ",
               q.g_idx.size(), " entries, need 0 or k = ", q.k);
  // A 7B model packs 6.5e9 codes: the range check and the bit packing run over rows in parallel.
  const int64_t count = static_cast<int64_t>(q.codes.size());
  int top = 0;
#pragma omp parallel for reduction(max : top) if (count > 65536)
  for (int64_t i = 0; i < count; ++i) top = std::max(top, int{q.codes[static_cast<size_t>(i)]});
  if (static_cast<uint32_t>(top) >= levels)
    for (size_t i = 0; i < q.codes.size(); ++i)
      LOWBIT_CHECK(q.codes[i] < levels, "pack_uniform: code ", int{q.codes[i]}, " at index ", i, " needs more than ",
                   q.bits, " bits");

  PackedWeight w;
  w.format = FormatId::Uniform;
  w.shape = {q.n, q.k};
  w.params = {{"bits", q.bits},
              {"group_size", q.group_size},
              {"symmetric", q.symmetric ? 1 : 0},
              {"act_order", q.g_idx.empty() ? 0 : 1}};

  const int64_t words_per_row = uniform_part_shape("qweight", q.n, q.k, w.params)[1];
  std::vector<uint32_t> words(static_cast<size_t>(q.n * words_per_row), 0u);
#pragma omp parallel for if (q.n * q.k > 65536)
  for (int64_t r = 0; r < q.n; ++r) {
    uint32_t* row = words.data() + r * words_per_row;
    for (int64_t c = 0; c < q.k; ++c) put_bits(row, c * q.bits, q.bits, q.codes[static_cast<size_t>(r * q.k + c)]);
  }

  auto qweight = bytes_of(words);
  auto scales = bytes_of(q.scales);
  storage.push_back(qweight);
  storage.push_back(scales);
  w.parts["qweight"] = view_of("qweight", DType::I32, {q.n, words_per_row}, qweight);
  w.parts["scales"] = view_of("scales", DType::F16, {q.n, groups}, scales);
  if (!q.symmetric) {
    auto zeros = bytes_of(q.zeros);
    storage.push_back(zeros);
    w.parts["zeros"] = view_of("zeros", DType::U8, {q.n, groups}, zeros);
  }
  if (!q.g_idx.empty()) {
    auto g_idx = bytes_of(q.g_idx);
    storage.push_back(g_idx);
    w.parts["g_idx"] = view_of("g_idx", DType::I32, {q.k}, g_idx);
  }
  // Zero points, group indices and scales are range-checked by the same code every reader runs.
  validate_packed(w, "pack_uniform");
  return w;
}

}  // namespace lowbit
