// Any-precision (Park et al., ICML 2024) weights: the "anyprec" packed format.
//
// What the any-precision quantizer produces for one linear weight W [n, k]:
//   codes  q[r][c] in [0, 2^P)        the parent (P-bit) code of every weight, P = `planes`
//   LUTs   lut_b[r][0 .. 2^b)  fp16    one centroid table per served width b and output row
//   (optional) outliers: CSR over rows, fp16 values that replace the LUT value at their (r, c)
// Codes are nested: the b-bit code of a weight is the top b bits of its parent code, so the b-bit view is
//   w_b[r][c] = fp32(lut_b[r][q[r][c] >> (P - b)])        unless (r, c) is an outlier: fp32(outlier_val)
// for every served width b (bit b of `widths`). Nothing else enters the value.
//
// Packed layout (docs/formats/anyprec.md has the drawing):
//   planes  i32 [P, n, W]   W = ceil(k / 32) uint32 words (stored as I32). Plane j holds bit (P-1-j) of every
//                           code: plane 0 is the most significant bit, so a b-bit view reads planes 0..b-1 only,
//                           a contiguous prefix of the tensor.
//   lutB    f16 [n, 2^B]    for each served width B
//   outlier_rowptr i32 [n+1], outlier_col i32 [nnz] (strictly increasing within a row), outlier_val f16 [nnz]
// In-plane order (anyprec_slot): a row's columns are padded with zero codes to kp = 32 W and cut into tiles of
// 1024 columns (32 words); the last tile may be shorter (nw = its word count). Column c = 1024 T + o of tile T sits
// in word 32 T + t, bit 8 u + i, where o = u * 8 nw + 8 t + i (u in 0..3, t in 0..nw-1, i in 0..7). So byte u of a
// tile's word t holds 8 consecutive columns, and lane t of a warp that loads the tile's 32 words at once (one
// coalesced 128-byte load per plane) owns columns 8t..8t+7 of each of the tile's four 8·nw-column quarters: the
// activations those lanes need are 4 coalesced loads of 8 consecutive values each.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backend_cpu/linear.h"
#include "model/weight_set.h"

namespace lowbit {

inline constexpr int kAnyPrecMinBits = 2;
inline constexpr int kAnyPrecMaxBits = 8;   // codes fit one byte
inline constexpr int64_t kAnyPrecTile = 1024;

inline int64_t anyprec_words_per_row(int64_t k) { return (k + 31) / 32; }

// Where column c (0 <= c < 32 * words_per_row) of a row sits inside each plane row: word index and bit.
struct PlaneSlot {
  int64_t word;
  int bit;
};
inline PlaneSlot anyprec_slot(int64_t c, int64_t words_per_row) {
  const int64_t tile = c / kAnyPrecTile, first_word = tile * 32;
  const int64_t nw = std::min<int64_t>(32, words_per_row - first_word);
  const int64_t o = c - tile * kAnyPrecTile;
  const int64_t u = o / (8 * nw), rest = o % (8 * nw);
  return {first_word + rest / 8, static_cast<int>(8 * u + rest % 8)};
}

struct AnyPrecQuantized {
  int64_t n = 0, k = 0;
  int planes = 0;                               // parent width P
  uint32_t widths = 0;                          // bit b set: width b is served (its LUT is stored)
  std::vector<uint8_t> codes;                   // [n, k] parent codes
  std::map<int, std::vector<uint16_t>> luts;    // width b -> [n, 2^b] fp16 bits
  std::vector<int32_t> outlier_rowptr;          // [n + 1] (empty: no outliers)
  std::vector<int32_t> outlier_col;             // [nnz]
  std::vector<uint16_t> outlier_val;            // [nnz] fp16 bits

  bool serves(int b) const { return b >= kAnyPrecMinBits && b <= planes && ((widths >> b) & 1u) != 0; }
  std::vector<int> served_widths() const;
  int64_t nnz() const { return static_cast<int64_t>(outlier_col.size()); }
  // The b-bit view of weight (r, c), exactly as the packed data encodes it (outliers included).
  float value(int64_t r, int64_t c, int b) const;
  void dequantize(int b, float* w) const;       // the whole b-bit view [n, k]
};

// Exact bits a b-bit view reads for one weight matrix (planes 0..b-1, lut_b, the outliers) and what the whole
// packed weight stores; both count padding.
uint64_t anyprec_view_bits(const PackedWeight& w, int b);

PackedWeight pack_anyprec(const AnyPrecQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage);
// Validates every part and decodes (the scalar oracle of the layout).
AnyPrecQuantized unpack_anyprec(const PackedWeight& w, const std::string& where);
// The CPU LinearOp: decodes rows of the requested width on the fly from the planes and LUT (no dequantized copy of
// the matrix is kept); forward_ref reads every code bit by bit.
std::unique_ptr<LinearOp> make_anyprec_linear(const PackedWeight& w, const float* bias, const std::string& where);

}  // namespace lowbit
