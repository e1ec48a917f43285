// Small helpers every packed format's packer and reader share.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace lowbit {

// An owned byte copy of v (kept alive by the caller's storage vector).
template <typename T>
std::shared_ptr<std::vector<uint8_t>> bytes_of(const std::vector<T>& v) {
  auto buf = std::make_shared<std::vector<uint8_t>>(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(buf->data(), v.data(), buf->size());
  return buf;
}

inline TensorView view_of(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          const std::shared_ptr<std::vector<uint8_t>>& buf) {
  return TensorView{name, dtype, std::move(shape), buf->data(), buf->size()};
}

// Parts may sit at any byte offset of a mapped file: read elements with memcpy, never through a cast pointer.
template <typename T>
T element(const TensorView& v, int64_t i) {
  T out;
  std::memcpy(&out, v.data + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return out;
}

// A part's bytes copied into out (resized to hold them): the unpackers' raw copy of an array part.
template <typename T>
void copy_part(const TensorView& v, std::vector<T>& out) {
  out.resize(static_cast<size_t>(v.nbytes / sizeof(T)));
  if (v.nbytes) std::memcpy(out.data(), v.data, v.nbytes);
}

// fp16 outliers in CSR (anyprec: int32 columns, mixed24: uint16 columns; columns increasing within a row).
// The index of outlier (r, c), or -1.
template <typename Col>
int64_t csr_find(const std::vector<int32_t>& rowptr, const std::vector<Col>& col, int64_t r, int64_t c) {
  if (rowptr.empty()) return -1;
  const auto first = col.begin() + rowptr[static_cast<size_t>(r)], last = col.begin() + rowptr[static_cast<size_t>(r + 1)];
  const auto it = std::lower_bound(first, last, static_cast<Col>(c));
  return it != last && *it == c ? it - col.begin() : -1;
}
// The CSR of the set entries of mask [n, k]; fp16_value(r, c) gives each one's stored fp16 bits.
template <typename Col, typename Fp16Value>
void csr_from_mask(const std::vector<char>& mask, int64_t n, int64_t k, Fp16Value fp16_value, std::vector<int32_t>& rowptr,
                   std::vector<Col>& col, std::vector<uint16_t>& val) {
  rowptr.assign(static_cast<size_t>(n + 1), 0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c)
      if (mask[static_cast<size_t>(r * k + c)]) {
        col.push_back(static_cast<Col>(c));
        val.push_back(fp16_value(r, c));
      }
    rowptr[static_cast<size_t>(r + 1)] = static_cast<int32_t>(col.size());
  }
}

// Fixed-width fields in a little-endian uint32 bit stream: field bits [bit, bit + width), which may straddle two words.
inline void put_bits(uint32_t* words, int64_t bit, int width, uint32_t value) {
  words[bit / 32] |= value << (bit % 32);
  if (bit % 32 + width > 32) words[bit / 32 + 1] |= value >> (32 - bit % 32);
}
inline uint32_t get_bits(const TensorView& v, int64_t first_word, int64_t bit, int width) {
  uint64_t two = element<uint32_t>(v, first_word + bit / 32);
  if (bit % 32 + width > 32) two |= static_cast<uint64_t>(element<uint32_t>(v, first_word + bit / 32 + 1)) << 32;
  return static_cast<uint32_t>((two >> (bit % 32)) & ((uint64_t{1} << width) - 1));
}
// Checks that the bits of each row's last word past `used_bits` are zero (rows of `words_per_row` words).
inline bool row_padding_is_zero(const TensorView& v, int64_t rows, int64_t words_per_row, int64_t used_bits, int64_t* bad_row) {
  const int64_t used_in_last = used_bits - (words_per_row - 1) * 32;
  if (words_per_row == 0 || used_in_last >= 32) return true;
  const uint32_t pad = used_in_last <= 0 ? 0xffffffffu : ~((1u << used_in_last) - 1u);
  for (int64_t r = 0; r < rows; ++r)
    if (element<uint32_t>(v, r * words_per_row + words_per_row - 1) & pad) {
      *bad_row = r;
      return false;
    }
  return true;
}

}  // namespace lowbit
