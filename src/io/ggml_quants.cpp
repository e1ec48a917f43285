// Scalar reference (de)quantization of the ggml block formats found in GGUF files.
//
// Written from the block layouts described in ggml's ggml-common.h / ggml-quants.c (read, not copied). The
// arithmetic mirrors the reference dequantize_row_* expression by expression, because the goal is bit-exact
// agreement: tests/test_gguf.cpp compares every type against values produced by the Python `gguf` package
// (tools/make_quant_golden.py). Floating-point contraction is switched off below (after the includes): with
// -march=native the compiler fuses `a*b + c` into one FMA, which rounds once instead of twice. Dequantization
// happens to be immune (its products, small integers times fp16 scales, are exact in fp32), but the
// quantizers' `(x - min)*id + 0.5f` is not, and an FMA there flips a rounding decision now and then.
//
// Blocks are memcpy'd out of the source before use: tensor data inside a mapped file is only guaranteed to be
// byte aligned once a caller slices rows, and a local copy keeps every read well defined.
#include "io/ggml_quants.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

// After the includes, so that only this file's arithmetic is affected.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace lowbit {
namespace {

constexpr int kQK = 32;    // elements per block of the "legacy" formats (Q4_0 .. Q8_0)
constexpr int kQK_K = 256; // elements per super-block of the K-quants

// ---------------------------------------------------------------------------------------------------------------
// Block layouts. fp16 fields are kept as raw uint16_t bits. Sizes must equal kDTypeTable (STYLE habit 1).
// ---------------------------------------------------------------------------------------------------------------

struct BlockQ4_0 {
  uint16_t d;             // fp16 scale
  uint8_t qs[kQK / 2];    // element j in the low nibble of qs[j], element j+16 in the high nibble; value-8
};
struct BlockQ4_1 {
  uint16_t d, m;          // fp16 scale and minimum: x = q*d + m
  uint8_t qs[kQK / 2];    // nibbles as in Q4_0, unsigned 0..15
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];          // little-endian u32: bit j is the 5th bit of element j
  uint8_t qs[kQK / 2];    // low 4 bits, nibble order as in Q4_0; value-16
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // per 16 elements: low nibble scale, high nibble min (4 bits each)
  uint8_t qs[kQK_K / 4];       // 2-bit values; see dequantize_q2_k for the order
  uint16_t d, dmin;            // fp16 super-block scale for the scales and for the mins
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];    // 3rd bit of each value (set means "no -4 offset")
  uint8_t qs[kQK_K / 4];       // low 2 bits
  uint8_t scales[12];          // 16 six-bit scales, packed (see q3_k_scale)
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];          // 8 six-bit scales and 8 six-bit mins, packed (see k4_scale_min)
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];       // low 4 bits
  uint8_t qh[kQK_K / 4];       // high 2 bits
  int8_t scales[kQK_K / 16];   // signed 8-bit scale per 16 elements
  uint16_t d;
};
struct BlockQ8_K {
  float d;                     // fp32 scale (this is the activation format of the K-quant dot products)
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];   // sums of groups of 16 quants; unused by dequantization
};

template <typename Block>
constexpr bool block_matches(DType t, int elems) {
  return sizeof(Block) == static_cast<size_t>(dtype_info(t).block_bytes) && dtype_info(t).block_elems == elems;
}
static_assert(block_matches<BlockQ4_0>(DType::Q4_0, kQK), "Q4_0 block must be 18 bytes");
static_assert(block_matches<BlockQ4_1>(DType::Q4_1, kQK), "Q4_1 block must be 20 bytes");
static_assert(block_matches<BlockQ5_0>(DType::Q5_0, kQK), "Q5_0 block must be 22 bytes");
static_assert(block_matches<BlockQ5_1>(DType::Q5_1, kQK), "Q5_1 block must be 24 bytes");
static_assert(block_matches<BlockQ8_0>(DType::Q8_0, kQK), "Q8_0 block must be 34 bytes");
static_assert(block_matches<BlockQ2_K>(DType::Q2_K, kQK_K), "Q2_K block must be 84 bytes");
static_assert(block_matches<BlockQ3_K>(DType::Q3_K, kQK_K), "Q3_K block must be 110 bytes");
static_assert(block_matches<BlockQ4_K>(DType::Q4_K, kQK_K), "Q4_K block must be 144 bytes");
static_assert(block_matches<BlockQ5_K>(DType::Q5_K, kQK_K), "Q5_K block must be 176 bytes");
static_assert(block_matches<BlockQ6_K>(DType::Q6_K, kQK_K), "Q6_K block must be 210 bytes");
static_assert(block_matches<BlockQ8_K>(DType::Q8_K, kQK_K), "Q8_K block must be 292 bytes");

template <typename Block>
Block load_block(const uint8_t* src, int64_t i) {
  Block b;
  std::memcpy(&b, src + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

uint32_t load_u32_le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// ---------------------------------------------------------------------------------------------------------------
// Legacy 32-element formats. Element j < 16 lives in the low nibble of qs[j], element j + 16 in the high nibble.
// ---------------------------------------------------------------------------------------------------------------

void dequantize_q4_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

// The 5th bit of element j (0..31) is bit j of qh.
int q5_value(const uint8_t* qs, uint32_t qh, int j) {
  const int low = j < kQK / 2 ? (qs[j] & 0x0F) : (qs[j - kQK / 2] >> 4);
  return low | static_cast<int>((qh >> j) & 1u) << 4;
}

void dequantize_q5_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = f16_to_f32(b.d);
    const uint32_t qh = load_u32_le(b.qh);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q5_value(b.qs, qh, j) - 16) * d;
  }
}

void dequantize_q5_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    const uint32_t qh = load_u32_le(b.qh);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q5_value(b.qs, qh, j)) * d + m;
  }
}

void dequantize_q8_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// K-quants: 256-element super-blocks split into 16 (Q2_K, Q3_K, Q6_K) or 8 (Q4_K, Q5_K) sub-blocks, each with
// its own quantized scale. The sub-block values are interleaved across bit positions of shared bytes, so each
// routine walks the super-block in 128-element (or 64-element) halves exactly as ggml lays them out.
// ---------------------------------------------------------------------------------------------------------------

// Q2_K: each 128-element half uses 32 bytes of qs; output group g (0..3) takes bits [2g, 2g+1] of all 32 bytes,
// the first 16 bytes with one sub-block scale and the next 16 with the following one.
void dequantize_q2_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ2_K>(src, i);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    int sub = 0;  // sub-block index 0..15
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = b.qs + 32 * half;
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part, ++sub) {
          const float dl = d * static_cast<float>(b.scales[sub] & 0x0F);
          const float ml = dmin * static_cast<float>(b.scales[sub] >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[16 * part + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// Q3_K scale k (0..15): low 4 bits from the nibbles of bytes 0..7 (k < 8: low nibble of byte k, else high nibble
// of byte k-8); high 2 bits from byte 8 + k%4 at bit position 2*(k/4). Stored with a +32 bias.
int q3_k_scale(const uint8_t* scales, int k) {
  const int low = k < 8 ? (scales[k] & 0x0F) : (scales[k - 8] >> 4);
  const int high = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
  return (low | high << 4) - 32;
}

// Q3_K: same traversal as Q2_K for the low 2 bits; the 3rd bit comes from hmask, whose bit position advances
// once per 32-element group across the whole super-block (8 groups -> bits 0..7).
void dequantize_q3_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d_all = f16_to_f32(b.d);
    int sub = 0;
    int hbit = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = b.qs + 32 * half;
      for (int shift = 0; shift < 8; shift += 2, ++hbit) {
        for (int part = 0; part < 2; ++part, ++sub) {
          const float dl = d_all * static_cast<float>(q3_k_scale(b.scales, sub));
          for (int l = 0; l < 16; ++l) {
            const int idx = 16 * part + l;
            const int low = (q[idx] >> shift) & 3;
            const int offset = (b.hmask[idx] >> hbit) & 1 ? 0 : 4;
            *y++ = dl * static_cast<float>(low - offset);
          }
        }
      }
    }
  }
}

// Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes. Sub-blocks 0..3 use the low 6 bits of bytes
// 0..3 (scale) and 4..7 (min); sub-blocks 4..7 combine a nibble of bytes 8..11 with the top 2 bits of those.
void k4_scale_min(const uint8_t* q, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | (q[j - 4] >> 6) << 4;
    *min = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
  }
}

// Q4_K: each 64-element chunk uses 32 bytes of qs: low nibbles for the first 32 elements, high for the next 32.
void dequantize_q4_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ4_K>(src, i);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    for (int chunk = 0; chunk < 4; ++chunk) {
      const uint8_t* q = b.qs + 32 * chunk;
      for (int nib = 0; nib < 2; ++nib) {
        int sc, m;
        k4_scale_min(b.scales, 2 * chunk + nib, &sc, &m);
        const float d1 = d * static_cast<float>(sc);
        const float m1 = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((q[l] >> (4 * nib)) & 0x0F) - m1;
      }
    }
  }
}

// Q5_K: Q4_K plus a 5th bit; sub-block s (0..7) takes its 5th bits from bit s of qh[0..31].
void dequantize_q5_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ5_K>(src, i);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    for (int chunk = 0; chunk < 4; ++chunk) {
      const uint8_t* q = b.qs + 32 * chunk;
      for (int nib = 0; nib < 2; ++nib) {
        const int sub = 2 * chunk + nib;
        int sc, m;
        k4_scale_min(b.scales, sub, &sc, &m);
        const float d1 = d * static_cast<float>(sc);
        const float m1 = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) {
          const int v = ((q[l] >> (4 * nib)) & 0x0F) | ((b.qh[l] >> sub) & 1) << 4;
          *y++ = d1 * static_cast<float>(v) - m1;
        }
      }
    }
  }
}

// Q6_K: each 128-element half uses 64 bytes of ql and 32 of qh. Element 32*g + l (g = 0..3, l = 0..31) takes
// nibble g/2 of ql[l + 32*(g%2)] and bits [2g, 2g+1] of qh[l]; its scale is scales[8*half + 2*g + l/16].
void dequantize_q6_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = f16_to_f32(b.d);
    for (int half = 0; half < 2; ++half, y += 128) {
      const uint8_t* ql = b.ql + 64 * half;
      const uint8_t* qh = b.qh + 32 * half;
      const int8_t* sc = b.scales + 8 * half;
      for (int g = 0; g < 4; ++g) {
        for (int l = 0; l < 32; ++l) {
          const int low = (ql[l + 32 * (g % 2)] >> (4 * (g / 2))) & 0x0F;
          const int q = (low | ((qh[l] >> (2 * g)) & 3) << 4) - 32;
          y[32 * g + l] = d * static_cast<float>(sc[2 * g + l / 16]) * static_cast<float>(q);
        }
      }
    }
  }
}

void dequantize_q8_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const auto b = load_block<BlockQ8_K>(src, i);
    for (int j = 0; j < kQK_K; ++j) y[j] = b.d * static_cast<float>(b.qs[j]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Reference quantizers (ggml quantize_row_*_ref rounding: scale from the block's absmax or min/max, stored as
// fp16 with round-to-nearest-even, values truncated after adding 0.5 (or the zero point + 0.5), Q8_0 rounded
// half away from zero).
// ---------------------------------------------------------------------------------------------------------------

// ggml converts with a plain C cast, which is undefined for NaN or out-of-range values; those only arise from
// NaN/inf input, and clamping keeps our behaviour defined (and identical for every finite input).
int trunc_to_int(float v) {
  if (!(v > -1024.0f)) return -1024;  // also catches NaN
  if (v > 1024.0f) return 1024;
  return static_cast<int>(v);
}

int min_int(int a, int b) { return a < b ? a : b; }

// Index-stable absmax: the first element with the largest |x| wins, sign kept (ggml's `max`).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float* mn, float* mx) {
  *mn = 3.402823466e+38f;
  *mx = -3.402823466e+38f;
  for (int j = 0; j < n; ++j) {
    if (x[j] < *mn) *mn = x[j];
    if (x[j] > *mx) *mx = x[j];
  }
}

void store_u32_le(uint8_t* p, uint32_t v) {
  for (int k = 0; k < 4; ++k) p[k] = static_cast<uint8_t>(v >> (8 * k));
}

void quantize_q4_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockQ4_0 b{};
    const float d = signed_absmax(x, kQK) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = min_int(15, trunc_to_int(x[j] * id + 8.5f));
      const int hi = min_int(15, trunc_to_int(x[j + kQK / 2] * id + 8.5f));
      b.qs[j] = static_cast<uint8_t>((lo & 0x0F) | (hi & 0x0F) << 4);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void quantize_q4_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockQ4_1 b{};
    float mn, mx;
    min_max(x, kQK, &mn, &mx);
    const float d = (mx - mn) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(mn);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = min_int(15, trunc_to_int((x[j] - mn) * id + 0.5f));
      const int hi = min_int(15, trunc_to_int((x[j + kQK / 2] - mn) * id + 0.5f));
      b.qs[j] = static_cast<uint8_t>((lo & 0x0F) | (hi & 0x0F) << 4);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// Packs 32 five-bit values into the qs nibbles and the qh bit mask shared by Q5_0 and Q5_1.
void pack_q5(const int* q, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | (q[j + kQK / 2] & 0x0F) << 4);
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + kQK / 2] >> 4) & 1) << (j + kQK / 2);
  }
  store_u32_le(qh_bytes, qh);
}

void quantize_q5_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockQ5_0 b{};
    const float d = signed_absmax(x, kQK) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = min_int(31, trunc_to_int(x[j] * id + 16.5f));
    pack_q5(q, b.qs, b.qh);
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void quantize_q5_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockQ5_1 b{};
    float mn, mx;
    min_max(x, kQK, &mn, &mx);
    const float d = (mx - mn) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(mn);
    int q[kQK];
    // ggml applies no upper clamp here ((x-min)*id <= 31 up to rounding); the uint8 cast then keeps 5 bits.
    for (int j = 0; j < kQK; ++j) q[j] = trunc_to_int((x[j] - mn) * id + 0.5f);
    pack_q5(q, b.qs, b.qh);
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void quantize_q8_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockQ8_0 b{};
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) {
      const float r = std::round(x[j] * id);  // half away from zero, like C roundf
      b.qs[j] = static_cast<int8_t>(r >= -128.0f && r <= 127.0f ? r : 0.0f);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

}  // namespace

void dequantize_row(DType t, const void* src_void, float* dst, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  if (n < 0 || n % info.block_elems != 0) {
    fail("dequantize_row: ", n, " elements is not a multiple of the ", info.name, " block size ",
         info.block_elems);
  }
  const auto* src = static_cast<const uint8_t*>(src_void);
  const int64_t nb = n / info.block_elems;
  switch (t) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, src + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    case DType::Q4_0: return dequantize_q4_0(src, dst, nb);
    case DType::Q4_1: return dequantize_q4_1(src, dst, nb);
    case DType::Q5_0: return dequantize_q5_0(src, dst, nb);
    case DType::Q5_1: return dequantize_q5_1(src, dst, nb);
    case DType::Q8_0: return dequantize_q8_0(src, dst, nb);
    case DType::Q2_K: return dequantize_q2_k(src, dst, nb);
    case DType::Q3_K: return dequantize_q3_k(src, dst, nb);
    case DType::Q4_K: return dequantize_q4_k(src, dst, nb);
    case DType::Q5_K: return dequantize_q5_k(src, dst, nb);
    case DType::Q6_K: return dequantize_q6_k(src, dst, nb);
    case DType::Q8_K: return dequantize_q8_k(src, dst, nb);
    default:
      break;
  }
  fail("dequantize_row: type ", info.name, " is not a float or ggml quantized type");
}

void quantize_row_ref(DType t, const float* src, void* dst_void, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  if (n < 0 || n % info.block_elems != 0) {
    fail("quantize_row_ref: ", n, " elements is not a multiple of the ", info.name, " block size ",
         info.block_elems);
  }
  auto* dst = static_cast<uint8_t*>(dst_void);
  const int64_t nb = n / info.block_elems;
  switch (t) {
    case DType::Q4_0: return quantize_q4_0(src, dst, nb);
    case DType::Q4_1: return quantize_q4_1(src, dst, nb);
    case DType::Q5_0: return quantize_q5_0(src, dst, nb);
    case DType::Q5_1: return quantize_q5_1(src, dst, nb);
    case DType::Q8_0: return quantize_q8_0(src, dst, nb);
    default:
      break;
  }
  fail("quantize_row_ref: no reference quantizer for ", info.name, " (supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)");
}

}  // namespace lowbit
