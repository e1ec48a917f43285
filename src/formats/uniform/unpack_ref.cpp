// Uniform format: value checks on packed parts and the scalar decoder (the oracle every faster path is tested
// against). Layout: layout.h and docs/formats/uniform.md.
#include <cstring>

#include "core/error.h"
#include "formats/format_table.h"
#include "formats/pack_util.h"
#include "formats/uniform/layout.h"

namespace lowbit {

void uniform_check_values(const PackedWeight& w, const std::string& where) {
  const int64_t n = w.shape[0], k = w.shape[1];
  const int bits = static_cast<int>(w.params.at("bits"));
  const TensorView& qweight = w.parts.at("qweight");
  const TensorView& scales = w.parts.at("scales");
  const int64_t words_per_row = qweight.shape[1], groups = scales.shape[1];

  // Bits of a row's last word past its k codes must be zero: a writer that leaves them set packed with another
  // k or bits than it declares.
  int64_t bad = 0;
  if (!row_padding_is_zero(qweight, n, words_per_row, k * bits, &bad)) {
    const uint32_t last = element<uint32_t>(qweight, bad * words_per_row + words_per_row - 1);
    fail(where, ": part qweight row ", bad, " has non-zero padding bits after its ", k, " codes (0x", std::hex, last,
         std::dec, ")");
  }
  for (int64_t i = 0; i < n * groups; ++i) {
    const uint16_t s = element<uint16_t>(scales, i);
    LOWBIT_CHECK((s & 0x7c00u) != 0x7c00u, where, ": part scales [", i / groups, ", ", i % groups,
                 "] is not finite (fp16 bits 0x", std::hex, s, std::dec, ")");
  }
  if (const auto it = w.parts.find("zeros"); it != w.parts.end()) {
    for (int64_t i = 0; i < n * groups; ++i) {
      const uint8_t z = element<uint8_t>(it->second, i);
      LOWBIT_CHECK(z < (1u << bits), where, ": part zeros [", i / groups, ", ", i % groups, "] = ", int{z},
                   " is not below 2^bits = ", 1 << bits);
    }
  }
  if (const auto it = w.parts.find("g_idx"); it != w.parts.end()) {
    for (int64_t c = 0; c < k; ++c) {
      const int32_t g = element<int32_t>(it->second, c);
      LOWBIT_CHECK(g >= 0 && g < groups, where, ": part g_idx [", c, "] = ", g, " is outside [0, ", groups, ")");
    }
  }
}

UniformQuantized unpack_uniform(const PackedWeight& w, const std::string& where) {
  LOWBIT_CHECK(w.format == FormatId::Uniform, where, ": unpack_uniform given a weight of format '", format_name(w.format), "'");
  validate_packed(w, where);

  UniformQuantized q;
  q.bits = static_cast<int>(w.params.at("bits"));
  q.n = w.shape[0];
  q.k = w.shape[1];
  q.group_size = w.params.at("group_size");
  q.symmetric = w.params.at("symmetric") == 1;
  const TensorView& qweight = w.parts.at("qweight");
  const int64_t words_per_row = qweight.shape[1], groups = q.groups();

  q.codes.resize(static_cast<size_t>(q.n * q.k));
#pragma omp parallel for if (q.n * q.k > 65536)
  for (int64_t r = 0; r < q.n; ++r) {
    const int64_t row = r * words_per_row;
    for (int64_t c = 0; c < q.k; ++c)
      q.codes[static_cast<size_t>(r * q.k + c)] = static_cast<uint8_t>(get_bits(qweight, row, c * q.bits, q.bits));
  }
  q.scales.resize(static_cast<size_t>(q.n * groups));
  std::memcpy(q.scales.data(), w.parts.at("scales").data, q.scales.size() * sizeof(uint16_t));
  if (!q.symmetric) {
    q.zeros.resize(static_cast<size_t>(q.n * groups));
    std::memcpy(q.zeros.data(), w.parts.at("zeros").data, q.zeros.size());
  }
  if (w.params.at("act_order") == 1) {
    q.g_idx.resize(static_cast<size_t>(q.k));
    std::memcpy(q.g_idx.data(), w.parts.at("g_idx").data, q.g_idx.size() * sizeof(int32_t));
  }
  return q;
}

}  // namespace lowbit
