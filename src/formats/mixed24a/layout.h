// 2/4-bit intra-matrix mixed precision (Li et al., ICCAD 2024, sec. 3.3): the "mixed24a" packed format, the
// memory-aligned layout for exactly one 4-bit group in four (--ratio-4bit 0.25). Drawn in docs/formats/mixed24a.md.
//
// The input-channel groups (16 columns each, G = k / 16, k a multiple of 64) are permuted so that every unit of
// four consecutive *stored* groups is [2-bit, 2-bit, 2-bit, 4-bit]; perm[p] is the original group held at stored
// group p, so stored column c = 16 p + i is original column 16 perm[p] + i and a GEMV gathers x through perm.
// The quantizer orders the units by sensitivity and puts the most sensitive 2-bit group of each unit in slot 0.
//
// The weight it encodes (stored group p, slot s = p % 4, row r, code q), in fp32:
//   w = (float(q) - z) * ŝ,   ŝ = fmaf(float(sc), fp32(ss), fp32(sm))   (one fused rounding), then the product
//   slot 0..2 (2-bit codes, zero z in 0..3): sc has 4 bits in slot 0 and 3 bits in slots 1 and 2 (the paper clips
//     two of the three scales so that the three scales and zeros share 16 bits); ss/sm per 16 rows and group;
//   slot 3 (4-bit codes, zero z in 0..15): sc has 4 bits, its own ss/sm per 16 rows and group (our choice: the
//     paper leaves the 4-bit group's scale storage open; two-order keeps the total at 3.0 bits before outliers);
//   an outlier (r, c) (c a stored column, always in a 2-bit slot): w = fp32(outlier_val).
//
// Packed parts (U = k / 64 units, RG = ceil(n / 16); words are little-endian uint32 stored as I32):
//   perm      i16 [G]          original group of each stored group (uint16 bits)
//   qa        i32 [n, U, 4]    one 128-bit word per (row, unit): words 0..2 = the 2-bit groups of slots 0..2
//                              (code i at bits 2i..2i+1), word 3 = codes 0..7 of the 4-bit group (code i at bits 4i)
//   qb        i32 [n, U]       codes 8..15 of the 4-bit group (code 8+i at bits 4i)
//   meta2     i16 [n, U]       bits 0-3 sc(slot 0), 4-6 sc(slot 1), 7-9 sc(slot 2), 10-11 z0, 12-13 z1, 14-15 z2
//   meta4     u8  [n, U]       bits 0-3 sc(slot 3), bits 4-7 z3
//   ss2, sm2  f16 [RG, 3U]     second-order step and offset of stored 2-bit group 3u + s
//   ss4, sm4  f16 [RG, U]      the same for the 4-bit group of unit u
//   outlier_rowptr i32 [n+1], outlier_col i16 [nnz] (stored columns, uint16 bits, increasing), outlier_val f16 [nnz]
// params: sparse (0/1), nnz.
// Stored bits per weight: (128 + 32 + 16 + 8) / 64 + 32 / 256 = 3.0, plus 16 G bits of perm (1/n per weight)
// and 32 (n + 1) + 32 nnz bits of outliers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_cpu/linear.h"
#include "model/weight_set.h"

namespace lowbit {

inline constexpr int64_t kAlignedUnit = 64;      // weights of a row per unit: three 2-bit groups + one 4-bit group

// Width of stored group p's codes and of its scale code.
constexpr int mixed24a_code_bits(int64_t p) { return p % 4 == 3 ? 4 : 2; }
constexpr int mixed24a_scale_bits(int64_t p) { return p % 4 == 1 || p % 4 == 2 ? 3 : 4; }

struct Mixed24AQuantized {
  int64_t n = 0, k = 0;
  std::vector<uint16_t> perm;                    // [G]
  std::vector<uint8_t> codes;                    // [n, k] stored column order
  std::vector<uint8_t> zero, scode;              // [n, G] per (row, stored group)
  std::vector<uint16_t> ss, sm;                  // [RG, G] fp16 bits per (16-row block, stored group)
  std::vector<int32_t> outlier_rowptr;           // [n+1] (empty: no outliers)
  std::vector<uint16_t> outlier_col;             // [nnz] stored columns
  std::vector<uint16_t> outlier_val;             // [nnz] fp16 bits

  int64_t groups() const { return k / 16; }
  int64_t units() const { return k / kAlignedUnit; }
  int64_t row_groups() const { return (n + 15) / 16; }
  float scale(int64_t r, int64_t p) const;       // ŝ of stored group p in row r
  float value(int64_t r, int64_t c) const;       // stored column c, exactly what the packed data encodes
  void dequantize(float* w) const;               // [n, k] in the ORIGINAL column order
};

PackedWeight pack_mixed24a(const Mixed24AQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage);
Mixed24AQuantized unpack_mixed24a(const PackedWeight& w, const std::string& where);
// The reference GEMV/GEMM straight from the packed parts (the CUDA kernel's CPU twin): y [m, n] = x [m, k] · Wᵀ
// (+ bias), x in the original column order (gathered through perm), fp64 accumulation, outliers from the CSR.
void mixed24a_gemm_packed_ref(const PackedWeight& w, const float* x, int64_t m, const float* bias, float* y);
std::unique_ptr<LinearOp> make_mixed24a_linear(const PackedWeight& w, const float* bias, const std::string& where);

}  // namespace lowbit
