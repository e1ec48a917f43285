// 2/4-bit intra-matrix mixed precision (Li et al., ICCAD 2024): the "mixed24" packed format, generic layout.
//
// What the mixed-precision quantizer produces for one linear weight W [n, k] (n outputs, k inputs):
//   input-channel groups of g1 = 16 columns, G = ceil(k / 16); group_bits[g] in {2, 4}, shared by every row;
//   codes q[r][c] in [0, 2^bits(g));
//   2-bit groups: zero z in 0..3 and a *quantized* scale per (row, group): a 4-bit code sc with, per second-order
//     group of g2 = 16 rows (and the same input group), an fp16 step ss and an fp16 offset sm;
//   4-bit groups: fp16 scale s and a zero z in 0..15 per (row, group);
//   optional outliers (only inside 2-bit groups): CSR over rows, fp16 values with 16-bit column indices.
// The weight it encodes, exactly, in fp32:
//   2-bit: w = (float(q) - z) * ŝ,  ŝ = fmaf(float(sc), fp32(ss), fp32(sm))   (fused: one rounding), then the product
//   4-bit: w = (float(q) - z) * fp32(s)
//   outlier (r, c): w = fp32(outlier_val)
//
// Generic packed layout (see docs/formats/mixed24.md):
//   group_bits    u8  [G]                 2 or 4
//   qweight       i32 [n, G2 + 2 G4]      each row one little-endian bit stream of its groups in column order,
//                                         16 codes per group (a short last group padded with zero codes):
//                                         2-bit groups take one word, 4-bit groups two
//   meta2         i32 [n, ceil(6 G2/32)]  per row a bit stream of 6-bit fields, one per 2-bit group in column
//                                         order: bits 0-3 scale code sc, bits 4-5 zero z (fields may straddle words)
//   ss2, sm2      f16 [ceil(n/16), G2]    second-order step and offset
//   scale4        f16 [n, G4]; zero4 i32 [n, ceil(G4/8)]: 4-bit zeros, 8 per word (4-bit groups, column order)
//   outlier_rowptr i32 [n+1], outlier_col i16 [nnz] (uint16 bits, increasing within a row), outlier_val f16 [nnz]
// params: groups4 = G4 (0..G), sparse (0/1), nnz.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_cpu/linear.h"
#include "model/weight_set.h"

namespace lowbit {

inline constexpr int64_t kMixedGroup = 16;      // g1: input columns per first-order group
inline constexpr int64_t kMixedRowGroup = 16;   // g2: output rows per second-order scale group
inline constexpr int kMixedScaleBits = 4;       // Ns: bits of a quantized 2-bit-group scale

struct Mixed24Quantized {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> group_bits;               // [G]
  std::vector<uint8_t> codes;                    // [n, k]
  std::vector<uint8_t> zero2, scode2;            // [n, G2]
  std::vector<uint16_t> ss2, sm2;                // [ceil(n/16), G2] fp16 bits
  std::vector<uint16_t> scale4;                  // [n, G4] fp16 bits
  std::vector<uint8_t> zero4;                    // [n, G4]
  std::vector<int32_t> outlier_rowptr;           // [n+1] (empty: no outliers)
  std::vector<uint16_t> outlier_col;             // [nnz]
  std::vector<uint16_t> outlier_val;             // [nnz] fp16 bits

  int64_t groups() const { return (k + kMixedGroup - 1) / kMixedGroup; }
  int64_t row_groups() const { return (n + kMixedRowGroup - 1) / kMixedRowGroup; }
  // index of group g among the groups of its width (column order), filled by index()
  std::vector<int64_t> slot;
  int64_t g2 = 0, g4 = 0;
  void index();                                  // computes slot, g2, g4 from group_bits
  float scale2(int64_t r, int64_t j) const;      // ŝ of 2-bit group slot j of row r
  float value(int64_t r, int64_t c) const;       // exactly what the packed data encodes
  void dequantize(float* w) const;               // [n, k]
};

PackedWeight pack_mixed24(const Mixed24Quantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage);
Mixed24Quantized unpack_mixed24(const PackedWeight& w, const std::string& where);
std::unique_ptr<LinearOp> make_mixed24_linear(const PackedWeight& w, const float* bias, const std::string& where);

}  // namespace lowbit
