// QUIK (Ashkboos et al.): weights and activations quantized, a few fp16 outlier input columns — the "quik" packed
// format and its exact arithmetic. Drawn in docs/formats/quik.md.
//
// A weight W [n, k] is split by input column: `outliers` columns (indices `outlier_idx`, increasing) stay in fp16;
// the other kb = k - outliers "base" columns (the complement, in increasing order) hold signed symmetric integer codes
// wq [n, kb] with one fp16 scale sw per output row: w = fp32(sw) * wq, wq in [-2^(wbits-1), 2^(wbits-1) - 1].
//
// At run time every token's base activations are quantized (QUIK Algorithm 1), for abits in {4, 8}:
//   mn = min_c x_c, mx = max_c x_c (fp32, base columns), L = 2^abits - 1, H = 2^(abits-1) (halfRange)
//   sa = (mx - mn) / L  in fp32 (scaleAct; sa = 1 when mx == mn: every code is then -H and decodes to mn exactly)
//   xq_c = clamp(nearbyint((x_c - mn) / sa), 0, L) - H         signed, in [-H, H - 1]
//   acc_r = Σ_c xq_c * wq_rc                                  exactly, in int32 (int64 in the reference)
//   y_r = sa * sw_r * acc_r + (H * sa + mn) * wReduced_r + Σ_o fp16(x_o) * w_out[r, o] (+ bias)
//         evaluated in fp64 from the fp32 values, then rounded once to fp32 (the reference; kernels compute the
//         epilogue in fp32 and are checked bit-exact on acc, within a tolerance on y)
//   wReduced_r = fp32(fp64(sw_r) * Σ_c wq_rc): the zero-point correction, stored (and checked on load).
// act_fp8 (wbits 4, abits 8): symmetric FP8-E4M3 activations instead: sa = max_c |x_c| / 448 (1 if 0),
//   x8_c = e4m3(x_c / sa) (round to nearest even, saturating), acc_r = Σ x8_c * wq_rc exactly (every e4m3 value is a
//   multiple of 2^-9, so acc * 2^9 is an integer), y_r = sa * sw_r * acc_r + outliers (no zero point).
// abits 16: activations are not quantized: y_r = Σ_c x_c * (sw_r * wq_rc) + outliers (W4A16 / W8A16).
// Non-finite activations are refused with an error (never quantized to garbage).
//
// Packed parts (the layout the GPU GEMM consumes: both operands K-contiguous, "TN"):
//   qweight8     i8  [n, kb]             wbits 8: codes, row-major
//   qweight4     u8  [n, ceil(kb/2)]     wbits 4: two codes per byte, base column 2j in the low nibble, 2j+1 in the
//                                        high nibble, two's complement nibbles; a last odd nibble is 0
//   scale        f16 [n]                 sw
//   wreduced     f32 [n]
//   outlier_idx  i32 [outliers]          increasing original column indices
//   outlier_w    f16 [n, outliers]
// params: wbits (4, 8), abits (4, 8, 16), act_fp8 (0/1), outliers (0..k).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_cpu/linear.h"
#include "model/weight_set.h"

namespace lowbit {

struct QuikQuantized {
  int64_t n = 0, k = 0;
  int wbits = 4, abits = 8;
  bool act_fp8 = false;
  std::vector<int32_t> outlier_idx;      // [no] increasing
  std::vector<int8_t> wq;                // [n, kb]
  std::vector<uint16_t> scale;           // [n] fp16 bits
  std::vector<float> wreduced;           // [n]
  std::vector<uint16_t> outlier_w;       // [n, no] fp16 bits

  int64_t outliers() const { return static_cast<int64_t>(outlier_idx.size()); }
  int64_t base() const { return k - outliers(); }
  std::vector<int64_t> base_columns() const;   // [kb] increasing
  void dequantize(float* w) const;             // [n, k] (the weight half of the arithmetic)
};

// wReduced of one row by its definition.
float quik_wreduced(uint16_t scale_f16, const int8_t* wq, int64_t kb);

// Per-token activation quantization of one row of base activations xb [kb] (the definition above): writes the
// signed codes (integer mode; fp8 mode: the e4m3 values times 2^9, integers) and returns {sa, mn}. Throws on
// non-finite input.
struct ActQuant {
  float sa = 1, mn = 0;
};
ActQuant quik_quantize_activations(const float* xb, int64_t kb, int abits, bool fp8, int32_t* codes);
// Nearest FP8-E4M3 value of v (round to nearest even, saturating at ±448), as an exact float.
float e4m3_round(float v);

PackedWeight pack_quik(const QuikQuantized& q, std::vector<std::shared_ptr<std::vector<uint8_t>>>& storage);
QuikQuantized unpack_quik(const PackedWeight& w, const std::string& where);
// The integer-exact reference: y [m, n] for x [m, k] straight from the packed parts (int64 accumulation).
// acc_out (optional, [m, n]): the integer accumulators, for bit-exact kernel checks.
void quik_gemm_packed_ref(const PackedWeight& w, const float* x, int64_t m, const float* bias, float* y,
                          std::vector<int64_t>* acc_out = nullptr);
std::unique_ptr<LinearOp> make_quik_linear(const PackedWeight& w, const float* bias, const std::string& where);

}  // namespace lowbit
