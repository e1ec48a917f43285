// The any-precision code builders and register tables shared by the GEMV (anyprec_gemv.cu) and the fused GEMM
// (anyprec_gemm.cu): bit transposes of plane words into b-bit codes, and the PRMT lookups of a row's fp16 centroids
// held in registers (the register-table tensor-core kernels' A fragments, mma.sync m16n8k16 layout).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend_cuda/anyprec/anyprec.h"
#include "backend_cuda/common/stream.cuh"

namespace lowbit::cuda {

__device__ __forceinline__ int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

// The b-bit code of column c of `row`, read bit by bit from planes 0..B-1 (used for outlier corrections).
template <int B>
__device__ __forceinline__ int code_at(const AnyPrecDevice& w, int64_t row, int64_t c) {
  const int64_t tile = c / 1024, first = tile * 32;
  const int64_t nw = min_i64(32, w.words - first);
  const int64_t o = c - tile * 1024, u = o / (8 * nw), rest = o % (8 * nw);
  const int64_t word = first + rest / 8;
  const int bit = static_cast<int>(8 * u + rest % 8);
  int code = 0;
#pragma unroll
  for (int j = 0; j < B; ++j)
    code |= static_cast<int>((__ldg(w.plane_data + (j * w.n + row) * w.words + word) >> bit) & 1u) << (B - 1 - j);
  return code;
}


// Bit transpose of column slot i (0..7) of every byte: byte u of the result holds the B-bit code of column 8u + i,
// plane 0 the most significant bit. Plane j's bit is moved from position i to position B-1-j of each byte by one
// funnel shift and merged by one LOP3 ((t & mask) | v): 2B operations for four codes.
// kMask = 0x11111111: the same per nibble (slot i in 0..3, eight codes of B <= 3 bits, one per nibble).
template <int B, uint32_t kMask = 0x01010101u>
__device__ __forceinline__ uint32_t transpose_slot(const uint32_t (&p)[B], int i) {
  uint32_t v = 0;
#pragma unroll
  for (int j = 0; j < B; ++j) {
    const int sh = i - (B - 1 - j);
    const uint32_t t = sh >= 0 ? p[j] >> sh : p[j] << -sh;
    v |= t & (kMask << (B - 1 - j));
  }
  return v;
}

// All eight slots at once, idx[i] = transpose_slot<B>(p, i), as one 8x8 bit-matrix transpose per byte column (the
// four bytes of a word in parallel): rows r = B-1-j hold plane j (rows >= B zero), three stages of delta swaps at
// distances 4, 2, 1 (5 ops each, 12 swaps). 8 bits: 62 integer ops for 32 codes against 122 slot by slot (SASS of
// both forms, sm_90); 5 bits 57 against 77, 4 bits 56 against 62; at 3 bits it is no better (49 / 47).
template <int D>
__device__ __forceinline__ void delta_swap(uint32_t& lo, uint32_t& hi, uint32_t mask) {
  const uint32_t t = ((lo >> D) ^ hi) & mask;
  hi ^= t;
  lo ^= t << D;
}
template <int B>
__device__ __forceinline__ void transpose_codes(const uint32_t (&p)[B], uint32_t (&idx)[8]) {
  if constexpr (B <= 3) {
#pragma unroll
    for (int i = 0; i < 8; ++i) idx[i] = transpose_slot<B>(p, i);
  } else {
#pragma unroll
    for (int r = 0; r < 8; ++r) idx[r] = r < B ? p[B - 1 - r] : 0u;
#pragma unroll
    for (int r = 0; r < 4; ++r) delta_swap<4>(idx[r], idx[r + 4], 0x0F0F0F0Fu);
#pragma unroll
    for (int r = 0; r < 8; r += (r % 2 == 1 ? 3 : 1)) delta_swap<2>(idx[r], idx[r + 2], 0x33333333u);   // rows 0, 1, 4, 5
#pragma unroll
    for (int r = 0; r < 8; r += 2) delta_swap<1>(idx[r], idx[r + 1], 0x55555555u);
  }
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));   // generic mode: a nibble's msb replicates the byte's sign
  return d;
}

// One row's table in registers: lo[i] / hi[i] the low / high bytes of entries 4i .. 4i+3 (2 bits: entries 4-7 zero).
template <int B>
struct RegTable {
  static_assert(B >= 2 && B <= 4, "register tables: 2..4 bits");
  static constexpr int kWords = B == 4 ? 4 : 2;   // of each byte kind
  static constexpr int kRowWords = 1 << (B - 1);  // 32-bit words of a row's 2^B fp16 centroids
  uint32_t lo[kWords], hi[kWords];
};

// The table of one row from its 2^B fp16 centroids (u: the row's words; words past them are ignored).
template <int B>
__device__ __forceinline__ void register_table_from_words(const uint32_t (&u)[2 * RegTable<B>::kWords], RegTable<B>& r) {
#pragma unroll
  for (int i = 0; i < RegTable<B>::kWords; ++i) {
    const bool in = 2 * i < RegTable<B>::kRowWords;
    r.lo[i] = in ? prmt(u[2 * i], u[2 * i + 1], 0x6420u) : 0u;
    r.hi[i] = in ? prmt(u[2 * i], u[2 * i + 1], 0x7531u) : 0u;
  }
}
template <int B>
__device__ __forceinline__ void load_register_table(const __half* __restrict__ l, RegTable<B>& r) {
  uint32_t u[2 * RegTable<B>::kWords] = {};
  if constexpr (B == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(l));
    u[0] = v.x; u[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < RegTable<B>::kRowWords / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(l) + i);
      u[4 * i] = v.x; u[4 * i + 1] = v.y; u[4 * i + 2] = v.z; u[4 * i + 3] = v.w;
    }
  }
  register_table_from_words<B>(u, r);
}

// The two half2 A registers of one row for the four codes in the low 16 bits of sel (one 3-bit code per nibble) and,
// at 4 bits, msel (nibble i: i + 4 * code i's plane-0 bit).
template <int B>
__device__ __forceinline__ void register_lookup(const RegTable<B>& r, uint32_t sel, uint32_t msel, uint32_t& a_low_k,
                                                uint32_t& a_high_k) {
  uint32_t L, H;
  if constexpr (B == 4) {
    L = prmt(prmt(r.lo[0], r.lo[1], sel), prmt(r.lo[2], r.lo[3], sel), msel);
    H = prmt(prmt(r.hi[0], r.hi[1], sel), prmt(r.hi[2], r.hi[3], sel), msel);
  } else {
    L = prmt(r.lo[0], r.lo[1], sel);
    H = prmt(r.hi[0], r.hi[1], sel);
  }
  a_low_k = prmt(L, H, 0x5140u);    // codes 0, 1: fp16 (lo, hi) bytes interleaved
  a_high_k = prmt(L, H, 0x7362u);   // codes 2, 3
}

// Slot s of the 3-bit selector codes (nibble q: the code of word bit 4q + s) and, at 4 bits, its merge selector:
// planes 1..3 give the low 3 bits, plane 0's bit 4q + s is moved to bit 2 of nibble q over the nibble ids 0x3210.
template <int B>
__device__ __forceinline__ void register_selectors(const uint32_t (&w)[B], int s, uint32_t& sel, uint32_t& msel) {
  if constexpr (B == 4) {
    const uint32_t low[3] = {w[1], w[2], w[3]};
    sel = transpose_slot<3, 0x11111111u>(low, s);
    const uint32_t t = s >= 2 ? w[0] >> (s - 2) : w[0] << (2 - s);
    msel = (t & 0x44444444u) | 0x32103210u;
  } else {
    sel = transpose_slot<B, 0x11111111u>(w, s);
    msel = 0u;
  }
}

// The streamed GEMVs' plane copies of one work item: lane (g, t)'s words 16 gi + 4t .. +3 of planes 0..B-1 of rows
// row0 + g and row0 + g + 8 (clamped to n - 1), one 16-byte cp.async each, to st + ((h B + j) 32 + lane) 16 (row half
// h, plane j); zeros past the row's W words (W % 4 == 0: the lane's 4 words are all in or all out). Offsets in 32 bits
// (anyprec_offsets_fit: up to 4 planes of n W words below 2^31): the 64-bit form took ~70 of the int8 GEMV's ~475
// instructions per item at 3 bits.
struct PlaneCopy {
  const uint32_t* planes;
  uint32_t W, nW, last_row;
  __device__ __forceinline__ explicit PlaneCopy(const AnyPrecDevice& w)
      : planes(w.plane_data), W(static_cast<uint32_t>(w.words)), nW(static_cast<uint32_t>(w.n * w.words)), last_row(static_cast<uint32_t>(w.n - 1)) {}
  template <int B>
  __device__ __forceinline__ void issue(uint32_t st, uint32_t row0, uint32_t gi, int g, int t, int lane) const {
    const uint32_t word = 16 * gi + 4 * t;
    const bool ok = word < W;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t o = min(row0 + g + 8 * h, last_row) * W + (ok ? word : 0u);
#pragma unroll
      for (int j = 0; j < B; ++j) cp_async(st + ((h * B + j) * 32 + lane) * 16, planes + (o + j * nW), 16, ok);
    }
  }
};

// One row's int8 table in registers (int8_tables.h): the 2^B int8 centroids, four per word (2 bits: one word).
template <int B>
struct I8Table {
  static_assert(B >= 2 && B <= 4, "int8 register tables: 2..4 bits");
  static constexpr int kWords = B == 2 ? 1 : 1 << (B - 2);
  uint32_t v[kWords];
};

// The slot selectors of one word (transpose_slot<B, 0x11111111>'s values) from its planes rotated once per word,
// r[j] = rotl(p[j], B-1-j): plane j's bit of the code at word bit 4q + s then sits at bit 4q + s + B-1-j, so the B
// planes meet in disjoint bits and one AND-OR per plane gathers them (a LOP3 each, the masks immediates); one funnel
// shift moves nibble q to bits 4q..4q+3 (hi16: nibbles 4..7 to bits 0..15, the high selector). Per word and row
// 2 + 4 (3 + 2) - 1 = 21 operations for the four slots' low and high selectors, where shifting each plane per slot
// took 25 (SASS, 3 bits).
template <int B>
__device__ __forceinline__ void rotate_planes(const uint32_t (&p)[B], uint32_t (&r)[B]) {
#pragma unroll
  for (int j = 0; j < B; ++j) r[j] = B - 1 - j == 0 ? p[j] : __funnelshift_l(p[j], p[j], B - 1 - j);
}
// Slot s's bits before the shift: nibble q of the selector at bits 4q + s .. 4q + s + 3 (mod 32), plane j at 4q + s + B-1-j.
template <int B>
__device__ __forceinline__ uint32_t rotated_slot_bits(const uint32_t (&r)[B], int s) {
  static_assert(B >= 2 && B <= 3, "rotated selectors: 2..3 bits");
  uint32_t z = 0;
#pragma unroll
  for (int j = 0; j < B; ++j) z |= r[j] & (0x11111111u << ((s + B - 1 - j) & 3));
  return z;
}
// z shifted so that nibble q of slot s sits at bits 4q..4q+3 (lo16) and nibbles 4..7 at bits 0..15 (hi16).
__device__ __forceinline__ void slot_selectors(uint32_t z, int s, uint32_t& lo16, uint32_t& hi16) {
  lo16 = s == 0 ? z : __funnelshift_r(z, z, s);
  hi16 = s == 0 ? z >> 16 : __funnelshift_r(z, z, s + 16);
}

// Four int8 centroids, byte q for the code in nibble q of sel (transpose_slot<B, 0x11111111>'s selectors, or
// rotated_slot_bits + slot_selectors): one PRMT per four weights (2..3
// bits; the 4-bit tables are looked up in two halves, i8_split16, in the kernel).
template <int B>
__device__ __forceinline__ uint32_t i8_lookup(const I8Table<B>& t, uint32_t sel) {
  static_assert(B <= 3, "4 bits: two PRMT per code set (int8_tables.h, i8_split16)");
  if constexpr (B == 3) return prmt(t.v[0], t.v[1], sel);
  else return prmt(t.v[0], t.v[0], sel);
}

// The shared-table tensor-core kernels' A fragment of slab sj (word bits 4 sj .. 4 sj + 3: k slots 2t, 2t + 1, 2t + 8,
// 2t + 9) from the codes of rows g / g + 8 (i0 / i1: byte u of iX[i] = the code of word bit 8u + i). t0: the lane's
// table address, entry e of rows g (low half) and g + 8 (high half) at t0 + 128 e (the [2^B][8][4] layout: a
// warp-wide lookup reads 32 different banks whatever the codes).
__device__ __forceinline__ void shared_table_fragment(uint32_t t0, const uint32_t (&i0)[8], const uint32_t (&i1)[8], int sj,
                                                      uint32_t (&a)[4]) {
  const int u = sj / 2, ib = (sj % 2) * 4;
  uint32_t e0[4], e1[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    e0[q] = __byte_perm(i0[ib + q], 0u, 0x4440u + static_cast<uint32_t>(u));
    e1[q] = __byte_perm(i1[ib + q], 0u, 0x4440u + static_cast<uint32_t>(u));
  }
  a[0] = __byte_perm(lds_u32(t0 + e0[0] * 128u), lds_u32(t0 + e0[1] * 128u), 0x5410u);   // row g,   bits 4sj, 4sj+1
  a[1] = __byte_perm(lds_u32(t0 + e1[0] * 128u), lds_u32(t0 + e1[1] * 128u), 0x7632u);   // row g + 8 (high halves)
  a[2] = __byte_perm(lds_u32(t0 + e0[2] * 128u), lds_u32(t0 + e0[3] * 128u), 0x5410u);   // row g,   bits 4sj+2, +3
  a[3] = __byte_perm(lds_u32(t0 + e1[2] * 128u), lds_u32(t0 + e1[3] * 128u), 0x7632u);
}

}  // namespace lowbit::cuda
