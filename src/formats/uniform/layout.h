// Uniform (RTN / GPTQ) integer weights: the "uniform" packed format.
//
// What a uniform quantizer produces for one linear weight W [n, k] (n outputs, k inputs):
//   codes  q[r][c] in [0, 2^bits)               one per weight
//   scales s[r][g] (stored fp16)                one per row and group of group_size input columns
//   zeros  z[r][g] integer in [0, 2^bits)       asymmetric only; symmetric uses z = 2^(bits-1)
//   g_idx  group of each input column [k]       only with act-order (else g = c / group_size)
// and the weight it encodes, exactly, in fp32:  w[r][c] = (float(q[r][c]) - z[r][g]) * fp32(s_fp16[r][g]).
// The quantizer rounds scales to fp16 *before* choosing codes, so this is the value it optimised.
//
// Packed layout (see pack.cpp):
//   qweight i32    [n, ceil(k*bits/32)]   (uint32 words; safetensors has no U32) codes of row r as a little-endian bit stream, code c at bits
//                                         [c*bits, (c+1)*bits) of the row's stream (rows start 32-bit aligned)
//   scales  f16    [n, G]                 G = ceil(k / group_size)
//   zeros   u8     [n, G]                 present iff symmetric == 0
//   g_idx   i32    [k]                    present iff act_order == 1; values in [0, G)
// params: bits (2..8), group_size (1..k; k = per-channel), symmetric (0/1), act_order (0/1).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend_cpu/linear.h"
#include "model/weight_set.h"

namespace lowbit {

struct UniformQuantized {
  int bits = 4;
  int64_t n = 0, k = 0;
  int64_t group_size = 0;         // columns per group; == k for per-channel
  bool symmetric = false;
  std::vector<uint8_t> codes;     // [n, k]
  std::vector<uint16_t> scales;   // [n, G] fp16 bits
  std::vector<uint8_t> zeros;     // [n, G] (empty when symmetric)
  std::vector<int32_t> g_idx;     // [k] (empty unless act-order)

  int64_t groups() const { return (k + group_size - 1) / group_size; }
  int group_of(int64_t c) const { return g_idx.empty() ? static_cast<int>(c / group_size) : g_idx[static_cast<size_t>(c)]; }
  float zero(int64_t r, int g) const;                  // z as float (2^(bits-1) when symmetric)
  // w[r][c] exactly as the packed data encodes it.
  float dequant(int64_t r, int64_t c) const;
  void dequantize(float* w) const;                     // all of W, [n, k]
};

// Packs into the parts of a PackedWeight with format "uniform" (owned buffers are appended to `storage`, which
// must outlive the PackedWeight's views).
PackedWeight pack_uniform(const UniformQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage);
// Validates every part (dtype, shape, ranges of zeros/g_idx) and decodes; errors name `where` and the problem.
UniformQuantized unpack_uniform(const PackedWeight& w, const std::string& where);
// The CPU LinearOp for a uniform weight: decodes once to fp32 (exactly the encoded values) and runs BLAS;
// forward_ref decodes element by element from the packed bits.
std::unique_ptr<LinearOp> make_uniform_linear(const PackedWeight& w, const float* bias, const std::string& where);

}  // namespace lowbit
