// Uniform (RTN / GPTQ) GEMV and dequantize kernels (uniform.h).
//
// Design
//   At batch 1..8 the GEMV is memory bound only if it reads each packed byte once, keeps enough bytes in flight and
//   spends few instructions per weight; and the activations (fp32: 4 bytes per column and batch row, against half a
//   byte per 4-bit weight) must be reused across many rows, or at batch 8 they, not the weights, are the traffic.
//
//   Tensor-core form (k a multiple of 128, groups a multiple of 128 columns, no g_idx: GPTQ / RTN g128 and
//   per-channel weights; uniform_gemv_tensor_core). mma.sync m16n8k16, fp16 inputs, fp32 accumulation:
//     A = q - z, an exact small integer in fp16, decoded in registers (below);
//     B = x as two fp16 pieces, hi = fp16(x) and lo = fp16(x - hi) (together ~22 bits of x), so each product (q - z) x
//         is formed to about 2^-22: within the GEMV budget, where one fp16 x (2^-11) would not be;
//     the sum over a 128-column block lies in one group and is multiplied by the fp32 scale once: the format's
//         (q - z) * scale, summed in another order.
//   At batch <= 4 one mma takes both pieces (B column 2b = batch row b's hi piece, 2b + 1 its lo piece; the two sums
//   are added at the end); at 5..8 two mma per k-step (hi, lo) share the accumulators. The mma's work is the same at
//   every batch, which is why batch 8 costs about what batch 1 does.
//
//   Work split. A tile is 16 rows (the mma's M); lane (g, t) holds rows g and g + 8. A block is 128 columns; lane t
//   takes the block's 32-column chunk t, which is exactly `bits` whole words of the row's stream (32 x bits bits), so
//   every code it decodes is in its registers. Persistent CTAs of 8 warps each own a contiguous range of tiles (the
//   grid is sized by occupancy; the ranges differ by at most one tile, so the SMs balance at 16-row granularity) and
//   walk it in sets of up to 4 tiles. The warps split a set's k blocks (warp w takes blocks w, w + 8, ...): a block's
//   x is read once per set and each decoded x fragment serves all the set's tiles. At the end of a set the 8 warps'
//   accumulator fragments are summed through shared memory in a fixed order (deterministic, no atomics).
//
//   x. When 4 k m bytes fit kTcResidentXBytes (Llama-7B decode shapes, 70B shapes at batch <= 2), the CTA splits all
//   of x into fp16 pieces once, into shared memory in B-fragment order; each item then reads its pieces with four
//   16-byte loads (eight at batch > 4). Otherwise each item's stage carries the block's fp32 x and the lanes split it
//   (about 100 instructions per item, shared by the set's tiles).
//
//   Memory side. Each warp streams its items (set, block) through a private ring of 3 shared-memory stages fed by
//   16-byte cp.async (two items in flight while one is computed): a stage holds the block's 16 x bits bytes of each
//   of the set's rows, copied by consecutive lanes (and the block's x when not resident). Shared-memory layouts are
//   XOR-swizzled so that each quarter-warp's 16-byte reads hit 8 different bank groups. Scales and zeros are loaded
//   four items ahead, lane t taking item i + t (the four blocks of a row share a cache line, where one load per lane
//   and item touches 16 lines per tile and item), and handed to the consuming lanes by shuffles. The first stages'
//   codes and the first scales are read before pdl_wait() (launch_pdl: they overlap the previous kernel's tail).
//
//   Decoding A. A pair of codes becomes one f16x2 register with one LOP3 and one HSUB2: a code q placed at bit s of a
//   half's mantissa under the exponent of 2^(10 - s) is the half 2^(10 - s) + q (exact), and subtracting the half
//   2^(10 - s) + z (one IMAD per row, block and (s_lo, s_hi) combination) leaves q - z exactly. So a pair is read from
//   one 32-bit window of the row's stream (a word, or a funnel shift of two) holding the low code within bits
//   [0, 10 - bits] and the high code within bits 16 + [0, 10 - bits]. The pairs and windows of each width (DecodePlan)
//   were searched for the fewest shifts plus combinations: per 32 codes 4 + 2 at 4 bits, 6 + 4 at 3 bits. The mma's
//   k index never has to match a column: the k slots of a pair get that pair's two columns in both A (the codes) and
//   B (the x pieces), the same for every row of the tile. Two accumulator chains (even and odd k-steps) halve the
//   mma dependency chain.
//
//   CUDA-core forms (act-order g_idx, groups of 32 or 64 columns, k not a multiple of 128). Chunked (k a multiple of
//   32, groups of a multiple of 32 columns or g_idx): two rows per warp, 8 warps per CTA; lane L takes the 32-column
//   chunks L, L + 32, ... of both rows, each chunk `bits` words read with 16-byte loads where aligned, codes out of
//   registers with compile-time shifts, converted to floats by OR-ing them into the mantissa of 2^23 (exact; no
//   int-to-float conversion). Without g_idx a chunk lies in one group: (q - z) x is summed over it and multiplied by
//   the scale once; with g_idx each weight is (q - z) * scale, the format's value. Per-column (any k, any group size):
//   lane L takes columns L, L + 32, ..., each code read from the one or two words holding it. Lane partial sums are
//   reduced across the warp with shuffles, in the same order for every row.
//
//   Dequantize to fp16 (above batch 8, before cuBLAS, where the mixed-input GEMM of uniform_fused.h does not serve):
//   one thread per 8 consecutive columns of a row (a 2D grid: no division per element), the 8 codes cut from one
//   64-bit window of the row's stream, (q - z) * scale in fp32 exactly as the format defines it (the product of a
//   9-bit integer and an 11-bit scale is exact), rounded once to fp16 and written as one 16-byte store (one store per
//   value where k is not a multiple of 8).
#include "backend_cuda/uniform/uniform.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "backend_cuda/common/common.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/common/stream.cuh"
#include "backend_cuda/dense/dense.h"
#include "backend_cuda/dispatch/kernel_choice.h"
#include "core/error.h"
#if LOWBIT_WITH_CUTLASS
#include "backend_cuda/uniform/uniform_fused.h"
#endif

namespace lowbit::cuda {
namespace {

// ---------------------------------------------------------------------------------------------------------------------
// Tensor-core form: decode plans.

// One pair of a 32-code chunk: codes lo and hi (chunk indices, code c at bits [bits c, bits (c + 1)) of the chunk's
// words), read from the window at stream bit o (o < 0: word 0 shifted left by -o). The low code lands at bit
// s_lo = bits lo - o of the window, the high code at bit 16 + s_hi, s_hi = bits hi - o - 16.
struct PairPlan {
  int lo, hi, o;
};

template <int BITS>
struct DecodePlan;
// Per width: 16 pairs covering the 32 codes once, searched for the fewest non-word windows (shifts) plus (s_lo, s_hi)
// combinations (one IMAD each per row and block): 2 bits 2 + 4, 3 bits 6 + 4, 4 bits 4 + 2, 5 bits 15 + 1,
// 6 bits 10 + 3, 7 bits 15 + 1, 8 bits 8 + 1.
template <>
struct DecodePlan<2> {
  static constexpr PairPlan p[16] = {{0, 8, 0},    {1, 9, 0},    {2, 10, 0},   {3, 11, 0},   {4, 12, 8},   {5, 13, 8},
                                     {6, 14, 8},   {7, 15, 8},   {16, 24, 32}, {17, 25, 32}, {18, 26, 32}, {19, 27, 32},
                                     {20, 28, 40}, {21, 29, 40}, {22, 30, 40}, {23, 31, 40}};
};
template <>
struct DecodePlan<3> {
  static constexpr PairPlan p[16] = {{0, 6, 0},    {1, 7, 0},    {2, 8, 6},    {3, 9, 6},    {4, 10, 12},  {5, 11, 12},
                                     {12, 16, 32}, {13, 17, 32}, {14, 18, 38}, {15, 19, 38}, {20, 24, 56}, {21, 25, 56},
                                     {22, 28, 66}, {23, 29, 66}, {26, 30, 74}, {27, 31, 74}};
};
template <>
struct DecodePlan<4> {
  static constexpr PairPlan p[16] = {{0, 4, 0},    {1, 5, 0},    {2, 6, 8},    {3, 7, 8},    {8, 12, 32},  {9, 13, 32},
                                     {10, 14, 40}, {11, 15, 40}, {16, 20, 64}, {17, 21, 64}, {18, 22, 72}, {19, 23, 72},
                                     {24, 28, 96}, {25, 29, 96}, {26, 30, 104}, {27, 31, 104}};
};
template <>
struct DecodePlan<5> {
  static constexpr PairPlan p[16] = {{0, 4, 0},     {1, 5, 5},     {2, 6, 10},    {3, 7, 15},    {8, 12, 40},   {9, 13, 45},
                                     {10, 14, 50},  {11, 15, 55},  {16, 20, 80},  {17, 21, 85},  {18, 22, 90},  {19, 23, 95},
                                     {24, 28, 120}, {25, 29, 125}, {26, 30, 130}, {27, 31, 135}};
};
template <>
struct DecodePlan<6> {
  static constexpr PairPlan p[16] = {{0, 3, 0},     {1, 4, 6},     {2, 5, 12},    {6, 8, 32},    {7, 9, 38},    {10, 12, 56},
                                     {11, 14, 64},  {13, 15, 74},  {16, 19, 96},  {17, 20, 100}, {18, 21, 106}, {22, 24, 128},
                                     {23, 25, 134}, {26, 28, 152}, {27, 30, 160}, {29, 31, 170}};
};
template <>
struct DecodePlan<7> {
  static constexpr PairPlan p[16] = {{0, 2, -3},    {1, 3, 4},     {4, 6, 25},    {5, 7, 32},    {8, 10, 53},   {9, 11, 60},
                                     {12, 14, 81},  {13, 15, 88},  {16, 18, 109}, {17, 19, 116}, {20, 22, 137}, {21, 23, 144},
                                     {24, 26, 165}, {25, 27, 172}, {28, 30, 193}, {29, 31, 200}};
};
template <>
struct DecodePlan<8> {
  static constexpr PairPlan p[16] = {{0, 2, 0},     {1, 3, 8},     {4, 6, 32},    {5, 7, 40},    {8, 10, 64},   {9, 11, 72},
                                     {12, 14, 96},  {13, 15, 104}, {16, 18, 128}, {17, 19, 136}, {20, 22, 160}, {21, 23, 168},
                                     {24, 26, 192}, {25, 27, 200}, {28, 30, 224}, {29, 31, 232}};
};

// Every plan covers each code once and places both codes of each pair inside a half's mantissa (checked here, at
// compile time, so that a table edit cannot decode wrongly).
template <int BITS>
constexpr bool plan_valid() {
  bool seen[32] = {};
  for (const PairPlan& q : DecodePlan<BITS>::p) {
    const int sl = BITS * q.lo - q.o, sh = BITS * q.hi - q.o - 16;
    if (q.lo < 0 || q.lo > 31 || q.hi < 0 || q.hi > 31 || seen[q.lo] || seen[q.hi] || q.lo == q.hi) return false;
    if (sl < 0 || sl > 10 - BITS || sh < 0 || sh > 10 - BITS || q.o < -(10 - BITS) || q.o >= 32 * BITS) return false;
    if (q.o < 0 && q.lo != 0) return false;   // a left-shifted window is word 0's
    seen[q.lo] = seen[q.hi] = true;
  }
  return true;
}
static_assert(plan_valid<2>() && plan_valid<3>() && plan_valid<4>() && plan_valid<5>() && plan_valid<6>() &&
                  plan_valid<7>() && plan_valid<8>(),
              "a decode plan must cover the 32 codes once, each inside a half's mantissa");

// Bits [o, o + 32) of the chunk's stream (zeros past its end; o < 0: word 0 shifted left).
template <int BITS, int O>
__host__ __device__ __forceinline__ uint32_t stream_window(const uint32_t (&v)[BITS]) {
  if constexpr (O < 0) return v[0] << (-O);
  else if constexpr (O % 32 == 0) return v[O / 32];
  else if constexpr (O / 32 + 1 < BITS)
    return static_cast<uint32_t>(((static_cast<uint64_t>(v[O / 32 + 1]) << 32) | v[O / 32]) >> (O % 32));
  else return v[O / 32] >> (O % 32);
}

// Pair P as the f16x2 (2^(10 - s_lo) + q_lo, 2^(10 - s_hi) + q_hi), and the f16x2 (2^(10 - s_lo) + z, 2^(10 - s_hi) + z)
// to subtract from it.
template <int BITS, int P>
struct PairCode {
  static constexpr PairPlan q = DecodePlan<BITS>::p[P];
  static constexpr int sl = BITS * q.lo - q.o, sh = BITS * q.hi - q.o - 16;
  static constexpr uint32_t kCodeMask = (1u << BITS) - 1u;
  static constexpr uint32_t kMask = (kCodeMask << sl) | (kCodeMask << (16 + sh));
  static constexpr uint32_t kExp = ((25u - sl) << 10) | ((25u - sh) << 26);
  static constexpr uint32_t kZeroMul = (1u << sl) + (1u << (16 + sh));
  __host__ __device__ static __forceinline__ uint32_t raw(const uint32_t (&v)[BITS]) {
#ifdef __CUDA_ARCH__
    // One LOP3 (a & mask) | exp: written as C++, the compiler splits it into two (one immediate per LOP3).
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(stream_window<BITS, q.o>(v)), "n"(kMask), "n"(kExp));
    return d;
#else
    return (stream_window<BITS, q.o>(v) & kMask) | kExp;
#endif
  }
  __host__ __device__ static __forceinline__ uint32_t zero(uint32_t z) { return kExp + z * kZeroMul; }
};

__host__ __device__ __forceinline__ uint32_t half2_u32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The 16 pairs of q - z of a 32-code chunk (z the row's zero point for the block).
template <int BITS, size_t... P>
__device__ __forceinline__ void decode_chunk(const uint32_t (&v)[BITS], uint32_t z, uint32_t (&a)[16], std::index_sequence<P...>) {
  ((a[P] = hsub2_bits(PairCode<BITS, static_cast<int>(P)>::raw(v), PairCode<BITS, static_cast<int>(P)>::zero(z))), ...);
}

// (hi, lo) fp16 pieces of the activations of pair P's columns: hi = fp16(x), lo = fp16(x - hi).
template <int BITS, int P>
__host__ __device__ __forceinline__ void split_x_pair(const float (&xv)[32], uint32_t& hi, uint32_t& lo) {
  constexpr PairPlan q = DecodePlan<BITS>::p[P];
  const __half2 h = __floats2half2_rn(xv[q.lo], xv[q.hi]);
  const float2 f = __half22float2(h);
  hi = half2_u32(h);
  lo = half2_u32(__floats2half2_rn(xv[q.lo] - f.x, xv[q.hi] - f.y));
}
// One piece per lane (the batch <= 4 form): hi where sel = 0, lo where sel = 1 (x - sel * hi is exact either way).
template <int BITS, int P>
__host__ __device__ __forceinline__ uint32_t piece_x_pair(const float (&xv)[32], float sel) {
  constexpr PairPlan q = DecodePlan<BITS>::p[P];
  const __half2 h = __floats2half2_rn(xv[q.lo], xv[q.hi]);
  const float2 f = __half22float2(h);
  return half2_u32(__floats2half2_rn(fmaf(-sel, f.x, xv[q.lo]), fmaf(-sel, f.y, xv[q.hi])));
}
template <int BITS, size_t... P>
__host__ __device__ __forceinline__ void split_chunk(const float (&xv)[32], uint32_t (&hi)[16], uint32_t (&lo)[16], std::index_sequence<P...>) {
  (split_x_pair<BITS, static_cast<int>(P)>(xv, hi[P], lo[P]), ...);
}
template <int BITS, size_t... P>
__host__ __device__ __forceinline__ void piece_chunk(const float (&xv)[32], float sel, uint32_t (&pc)[16], std::index_sequence<P...>) {
  ((pc[P] = piece_x_pair<BITS, static_cast<int>(P)>(xv, sel)), ...);
}

// mma.sync m16n8k16 (fp16 in, fp32 accumulate) without `volatile`, so that the compiler may schedule it among the
// decoding instructions and interleave independent accumulator chains.
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A lane's chunk of one row in a stage: BITS words at a 4 BITS-byte aligned shared address.
template <int BITS>
__device__ __forceinline__ void lds_chunk(uint32_t addr, uint32_t (&v)[BITS]) {
  if constexpr (BITS == 4) {
    lds_u32x4(addr, v);
  } else if constexpr (BITS == 8) {
    lds_u32x4(addr, reinterpret_cast<uint32_t(&)[4]>(v[0]));
    lds_u32x4(addr + 16, reinterpret_cast<uint32_t(&)[4]>(v[4]));
  } else if constexpr (BITS == 2 || BITS == 6) {
#pragma unroll
    for (int i = 0; i < BITS / 2; ++i) lds_u32x2(addr + 8 * i, reinterpret_cast<uint32_t(&)[2]>(v[2 * i]));
  } else {
#pragma unroll
    for (int i = 0; i < BITS; ++i) v[i] = lds_u32(addr + 4 * i);
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Tensor-core form: the kernel.

constexpr int kTcWarps = 8;        // warps per CTA, splitting the k blocks of the CTA's current set of tiles
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcStages = 3;       // ring stages per warp: two items in flight while one is computed
constexpr int kTcMaxTiles = 4;     // 16-row tiles per set: a block's x is split once for all of them
constexpr int kTcBlock = 128;      // columns per block (4 lanes x 32)
// x resident in shared memory as fp16 pieces (split once per CTA) when its 4 k m bytes are at most this: then the
// stages carry codes only and no lane splits x per item (at one tile per set the split is about a third of the
// instructions per item).
constexpr int64_t kTcResidentXBytes = 64 * 1024;

// The 16-byte unit where unit u of a block's resident pieces is stored: [batch row b][piece p][chunk t][4 units of 4
// pairs], u = 32 b + 4 (4 p + t) + i, XOR-swizzled so that a quarter-warp's reads (lanes (g, t) of one i) fall in 8
// different bank groups in both batch forms.
__host__ __device__ constexpr int xres_unit(int u) { return u ^ (((u >> 3) ^ ((u >> 5) << 1)) & 7); }

// Shared memory of a launch: the resident x ([block][m x 512 bytes]) if any, per warp kTcStages stages of [tiles x
// 16 rows x 16 BITS bytes of codes][m x 512 bytes of x unless resident], then the cross-warp reduction
// [warp][tile][lane][value] (values: 2 per lane at batch <= 4, 4 above).
constexpr uint32_t tc_weight_bytes(int bits, int tiles) { return static_cast<uint32_t>(tiles * 256 * bits); }
constexpr uint32_t tc_stage_bytes(int bits, int tiles, int m, bool xres) {
  return tc_weight_bytes(bits, tiles) + (xres ? 0u : static_cast<uint32_t>(512 * m));
}
constexpr size_t tc_smem_bytes(int bits, int tiles, int m, bool packed, bool xres, int64_t k) {
  return (xres ? static_cast<size_t>(k / kTcBlock) * 512 * m : 0) +
         static_cast<size_t>(kTcWarps) * kTcStages * tc_stage_bytes(bits, tiles, m, xres) +
         static_cast<size_t>(kTcWarps) * tiles * 32 * (packed ? 2 : 4) * sizeof(float);
}

// PACKED (batch <= 4): B column 2b / 2b + 1 = batch row b's hi / lo piece, one mma per k-step; otherwise B column b =
// batch row b, two mma per k-step (hi, lo). XRES: x resident (kTcResidentXBytes), else copied per item with the codes.
// set_tiles: tiles per set (<= kTcMaxTiles, sizing the stages); bpg: blocks per scale group (group size / 128).
// Registers: at batch <= 4 two CTAs fit an SM when the stages allow (<= 128 registers); above, one CTA per SM.
template <int BITS, bool PACKED, bool XRES>
__global__ void __launch_bounds__(kTcThreads, PACKED ? 2 : 1) uniform_gemv_tc_kernel(const UniformDevice w, const float* __restrict__ x,
                                                                                  float* __restrict__ y, int m, int set_tiles, int bpg) {
  extern __shared__ __align__(16) unsigned char tc_smem[];
  constexpr int V = PACKED ? 2 : 4;   // reduced values per lane and tile
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t T = (w.n + 15) >> 4;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * T / gridDim.x;
  const int ntiles = static_cast<int>((static_cast<int64_t>(blockIdx.x) + 1) * T / gridDim.x - t0);
  const int R = set_tiles;
  const int nsets = (ntiles + R - 1) / R;
  const int B = static_cast<int>(w.k / kTcBlock);
  const int nj = warp < B ? (B - warp + kTcWarps - 1) / kTcWarps : 0;   // the warp's blocks per set
  const int items = nsets * nj;
  const uint32_t wbytes = tc_weight_bytes(BITS, R);
  const uint32_t stage_bytes = wbytes + (XRES ? 0u : 512u * static_cast<uint32_t>(m));
  const uint32_t xres_bytes = XRES ? static_cast<uint32_t>(B) * 512u * static_cast<uint32_t>(m) : 0u;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(tc_smem));
  const uint32_t ring = smem0 + xres_bytes + static_cast<uint32_t>(warp * kTcStages) * stage_bytes;
  float* red = reinterpret_cast<float*>(tc_smem + xres_bytes + static_cast<size_t>(kTcWarps) * kTcStages * stage_bytes);
  // 32-bit element offsets (uniform_gemv_tensor_core: n * words < 2^32).
  const uint32_t words = static_cast<uint32_t>(w.words), G = static_cast<uint32_t>(w.G), n1 = static_cast<uint32_t>(w.n - 1);
  const int row_base = static_cast<int>(t0 * 16);
  auto set_size = [&](int si) { return min(R, ntiles - si * R); };

  // The copies of item (si, ii): the block's 16 BITS bytes of every row of the set (row i of the set at 16 BITS i;
  // rows past n are not copied: their stale codes decode to finite values in rows never stored), and unless x is
  // resident x's 512 bytes per batch row, unit u stored at u ^ ((u >> 3) & 7).
  auto issue_weights = [&](int si, int ii, uint32_t st) {
    const int pieces = set_size(si) * 16 * BITS;
    const uint32_t row0 = static_cast<uint32_t>(row_base + si * R * 16);
    const uint32_t col = static_cast<uint32_t>((warp + kTcWarps * ii) * 4 * BITS);
    for (int p = lane; p < pieces; p += 32) {
      const int rr = p / BITS, pc = p - rr * BITS;
      const uint32_t row = row0 + static_cast<uint32_t>(rr);
      if (row <= n1) cp_async(st + 16u * static_cast<uint32_t>(p), w.qweight + (row * words + col + 4u * static_cast<uint32_t>(pc)), 16);
    }
  };
  auto issue_x = [&](int ii, uint32_t st) {
    if constexpr (!XRES) {
      const float* src = x + static_cast<int64_t>(warp + kTcWarps * ii) * kTcBlock + 4 * lane;
      for (int b = 0; b < m; ++b) {
        const int u = 32 * b + lane;
        cp_async(st + wbytes + 16u * static_cast<uint32_t>(u ^ ((u >> 3) & 7)), src + static_cast<int64_t>(b) * w.k, 16);
      }
    }
  };
  // The issue cursor: item (isi, iii) into stage ist, kTcStages - 1 items ahead of the one computed.
  int isi = 0, iii = 0, ist = 0;
  auto live = [&] { return nj > 0 && isi < nsets; };
  auto advance = [&] {
    if (++iii >= nj) iii = 0, ++isi;
    ist = ist + 1 == kTcStages ? 0 : ist + 1;
  };

  // Scales and zeros, four items ahead: lane t loads item 4 q + t's (scale bits | zero << 16) of rows g and g + 8 of
  // each tile; the item's lanes take them from lane (g, item % 4) by shuffles.
  uint32_t cur[kTcMaxTiles][2], nxt[kTcMaxTiles][2];
  const uint32_t zsym = 1u << (BITS - 1);
  auto load_scales = [&](int q) {
    const int I = 4 * q + t;
#pragma unroll
    for (int r = 0; r < kTcMaxTiles; ++r) nxt[r][0] = nxt[r][1] = 0u;
    if (I < items) {
      const int si = I / nj, ii = I - si * nj;
      const int nt = set_size(si);
      const uint32_t grp = static_cast<uint32_t>((warp + kTcWarps * ii) / bpg);
      const uint32_t row0 = static_cast<uint32_t>(row_base + si * R * 16 + g);
#pragma unroll
      for (int r = 0; r < kTcMaxTiles; ++r)
        if (r < nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t e = min(row0 + static_cast<uint32_t>(16 * r + 8 * h), n1) * G + grp;
            const uint32_t sb = __ldg(reinterpret_cast<const unsigned short*>(w.scales) + e);
            const uint32_t zb = w.zeros != nullptr ? static_cast<uint32_t>(__ldg(w.zeros + e)) : zsym;
            nxt[r][h] = sb | (zb << 16);
          }
    }
  };

  load_scales(0);
  for (int p = 0; p + 1 < kTcStages; ++p) {   // the first stages' codes before the previous kernel's end
    if (live()) issue_weights(isi, iii, ring + static_cast<uint32_t>(ist) * stage_bytes);
    advance();
  }
  pdl_wait();   // x and y belong to the kernels before
  isi = iii = ist = 0;
  for (int p = 0; p + 1 < kTcStages; ++p) {
    if (live()) issue_x(iii, ring + static_cast<uint32_t>(ist) * stage_bytes);
    cp_async_commit();
    advance();
  }
  if constexpr (XRES) {
    // x's pieces for every block: one thread per (block, batch row, chunk), in the decode plans' pair order.
    for (int task = static_cast<int>(threadIdx.x); task < B * m * 4; task += kTcThreads) {
      const int tt = task & 3, b = (task >> 2) % m, j = (task >> 2) / m;
      const float4* src = reinterpret_cast<const float4*>(x + static_cast<int64_t>(b) * w.k + j * kTcBlock + 32 * tt);
      float xv[32];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 f = __ldg(src + i);
        xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
      }
      uint32_t hi[16], lo[16];
      split_chunk<BITS>(xv, hi, lo, std::make_index_sequence<16>{});
      const uint32_t base = smem0 + static_cast<uint32_t>(j * m) * 512u;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int uh = 32 * b + 4 * tt + i, ul = 32 * b + 4 * (4 + tt) + i;
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(base + 16u * static_cast<uint32_t>(xres_unit(uh))),
                     "r"(hi[4 * i]), "r"(hi[4 * i + 1]), "r"(hi[4 * i + 2]), "r"(hi[4 * i + 3]) : "memory");
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(base + 16u * static_cast<uint32_t>(xres_unit(ul))),
                     "r"(lo[4 * i]), "r"(lo[4 * i + 1]), "r"(lo[4 * i + 2]), "r"(lo[4 * i + 3]) : "memory");
      }
    }
    __syncthreads();
  }

  const int bx = PACKED ? g >> 1 : g;   // the lane's batch row of B
  const float sel = static_cast<float>(g & 1);
  int I = 0, stage = 0;
  for (int si = 0; si < nsets; ++si) {
    const int nt = set_size(si);
    if (si + 1 == nsets) pdl_launch_dependents();   // the CTA's last set
    float acc[kTcMaxTiles][4];
#pragma unroll
    for (int r = 0; r < kTcMaxTiles; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
    for (int ii = 0; ii < nj; ++ii, ++I) {
      if ((I & 3) == 0) {
#pragma unroll
        for (int r = 0; r < kTcMaxTiles; ++r) cur[r][0] = nxt[r][0], cur[r][1] = nxt[r][1];
        load_scales((I >> 2) + 1);
      }
      __syncwarp();   // every lane is done with the stage the next copies overwrite
      if (live()) {
        const uint32_t ws = ring + static_cast<uint32_t>(ist) * stage_bytes;
        issue_weights(isi, iii, ws);
        issue_x(iii, ws);
      }
      cp_async_commit();
      advance();
      cp_async_wait<kTcStages - 1>();
      __syncwarp();   // the other lanes' copies are visible
      const uint32_t st = ring + static_cast<uint32_t>(stage) * stage_bytes;
      stage = stage + 1 == kTcStages ? 0 : stage + 1;

      // B: the lane's fp16 pieces of x for chunk t of the block, batch row bx, in pair order.
      uint32_t xb[16], xl[16];
      if constexpr (XRES) {
        const uint32_t xj = smem0 + static_cast<uint32_t>((warp + kTcWarps * ii) * m) * 512u;
        if (bx < m) {
          const int q = PACKED ? 4 * (g & 1) + t : t;   // PACKED: the lane's piece; else hi here, lo at q + 4
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            lds_u32x4(xj + 16u * static_cast<uint32_t>(xres_unit(32 * bx + 4 * q + i)), reinterpret_cast<uint32_t(&)[4]>(xb[4 * i]));
            if constexpr (!PACKED)
              lds_u32x4(xj + 16u * static_cast<uint32_t>(xres_unit(32 * bx + 4 * (q + 4) + i)), reinterpret_cast<uint32_t(&)[4]>(xl[4 * i]));
          }
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i) xb[i] = xl[i] = 0u;
        }
      } else {
        float xv[32];   // the lane's 32 activations
        if (bx < m) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            uint32_t q4[4];
            lds_u32x4(st + wbytes + 16u * static_cast<uint32_t>(32 * bx + 8 * t + (i ^ ((4 * bx + t) & 7))), q4);
            xv[4 * i] = __uint_as_float(q4[0]), xv[4 * i + 1] = __uint_as_float(q4[1]);
            xv[4 * i + 2] = __uint_as_float(q4[2]), xv[4 * i + 3] = __uint_as_float(q4[3]);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 32; ++i) xv[i] = 0.0f;
        }
        if constexpr (PACKED) piece_chunk<BITS>(xv, sel, xb, std::make_index_sequence<16>{});
        else split_chunk<BITS>(xv, xb, xl, std::make_index_sequence<16>{});
      }

      const int src = 4 * g + (I & 3);
#pragma unroll
      for (int r = 0; r < kTcMaxTiles; ++r) {
        if (r >= nt) break;
        uint32_t v0[BITS], v1[BITS];
        const uint32_t rb = st + static_cast<uint32_t>((16 * r + g) * 16 * BITS + 4 * BITS * t);
        lds_chunk<BITS>(rb, v0);
        lds_chunk<BITS>(rb + 8 * 16 * BITS, v1);
        const uint32_t sz0 = __shfl_sync(0xffffffffu, cur[r][0], src), sz1 = __shfl_sync(0xffffffffu, cur[r][1], src);
        uint32_t a0[16], a1[16];
        decode_chunk<BITS>(v0, sz0 >> 16, a0, std::make_index_sequence<16>{});
        decode_chunk<BITS>(v1, sz1 >> 16, a1, std::make_index_sequence<16>{});
        // Two accumulator chains (even / odd k-steps), so that each mma waits on the one two before it.
        float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          mma_f16(c[s & 1], a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1], xb[2 * s], xb[2 * s + 1]);
          if constexpr (!PACKED) mma_f16(c[s & 1], a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1], xl[2 * s], xl[2 * s + 1]);
        }
        const float s0 = __half2float(__ushort_as_half(static_cast<unsigned short>(sz0 & 0xFFFFu)));
        const float s1 = __half2float(__ushort_as_half(static_cast<unsigned short>(sz1 & 0xFFFFu)));
        acc[r][0] = fmaf(s0, c[0][0] + c[1][0], acc[r][0]);
        acc[r][1] = fmaf(s0, c[0][1] + c[1][1], acc[r][1]);
        acc[r][2] = fmaf(s1, c[0][2] + c[1][2], acc[r][2]);
        acc[r][3] = fmaf(s1, c[0][3] + c[1][3], acc[r][3]);
      }
    }

    // The set's sums: each warp's fragments to shared memory, then one thread per (tile, lane, value) adds the 8
    // warps' in order. Lane (g, t): batch <= 4, value 0 / 1 = rows g / g + 8 of batch row t (hi + lo); above, values
    // 0..3 = (row g, batch 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
#pragma unroll
    for (int r = 0; r < kTcMaxTiles; ++r) {
      if (r >= nt) break;
      float* dst = red + ((warp * R + r) * 32 + lane) * V;
      if constexpr (PACKED) {
        dst[0] = acc[r][0] + acc[r][1];
        dst[1] = acc[r][2] + acc[r][3];
      } else {
#pragma unroll
        for (int v = 0; v < 4; ++v) dst[v] = acc[r][v];
      }
    }
    __syncthreads();
    const int outs = nt * 32 * V;
    const int64_t row0 = (t0 + static_cast<int64_t>(si) * R) * 16;
    for (int o = static_cast<int>(threadIdx.x); o < outs; o += kTcThreads) {
      float sum = 0.0f;
#pragma unroll
      for (int wi = 0; wi < kTcWarps; ++wi) sum += red[wi * R * 32 * V + o];
      const int r = o / (32 * V), l = (o / V) % 32, v = o % V;
      const int64_t row = row0 + 16 * r + (l >> 2) + (PACKED ? 8 * v : 8 * (v >> 1));
      const int b = PACKED ? (l & 3) : 2 * (l & 3) + (v & 1);
      if (row < w.n && b < m) y[static_cast<int64_t>(b) * w.n + row] = sum;
    }
    __syncthreads();   // the next set's fragments overwrite these
  }
  cp_async_wait<0>();   // no copy outlives the CTA
}

// ---------------------------------------------------------------------------------------------------------------------
// CUDA-core forms.

constexpr int kWarps = 8;   // warps per CTA

__device__ __forceinline__ float group_scale(const UniformDevice& w, int64_t r, int64_t g) {
  return __half2float(w.scales[r * w.G + g]);
}
__device__ __forceinline__ float group_zero(const UniformDevice& w, int64_t r, int64_t g) {
  return w.zeros != nullptr ? static_cast<float>(w.zeros[r * w.G + g]) : static_cast<float>(1 << (w.bits - 1));
}

// Code c of a row's bit stream (any bits 2..8; reads the second word only when the code straddles it).
__device__ __forceinline__ uint32_t code_at(const uint32_t* row, int64_t c, int bits) {
  const int64_t o = c * bits;
  const int64_t wi = o >> 5;
  const int s = static_cast<int>(o & 31);
  uint32_t v = __ldg(row + wi) >> s;
  if (s + bits > 32) v |= __ldg(row + wi + 1) << (32 - s);
  return v & ((1u << bits) - 1u);
}

template <int BITS>
__device__ __forceinline__ void load_chunk(const uint32_t* p, uint32_t (&v)[BITS]) {
  if constexpr (BITS == 4) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else if constexpr (BITS == 8) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else if constexpr (BITS == 2) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < BITS; ++i) v[i] = __ldg(p + i);
  }
}

// Code i (0..31) of a chunk held in BITS words: shifts known at compile time once the loop is unrolled.
template <int BITS>
__device__ __forceinline__ uint32_t chunk_code(const uint32_t (&v)[BITS], int i) {
  const int o = i * BITS, wi = o >> 5, s = o & 31;
  uint32_t c = v[wi] >> s;
  if (s + BITS > 32) c |= v[wi + 1] << (32 - s);
  return c & ((1u << BITS) - 1u);
}

template <int M>
__device__ __forceinline__ void reduce_and_store(float (&acc)[M], int64_t r, int64_t n, float* __restrict__ y) {
#pragma unroll
  for (int b = 0; b < M; ++b)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[b] += __shfl_xor_sync(0xffffffffu, acc[b], off);
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int b = 0; b < M; ++b) y[b * n + r] = acc[b];
}

// 2^23 + q as a float from the code's bits (q < 2^8): one OR in place of an int-to-float conversion, which runs at a
// quarter of the FP32 rate. (2^23 + q) - (2^23 + z) is then exactly float(q) - z.
constexpr uint32_t kMagic = 0x4B000000u;   // 2^23
constexpr float kMagicF = 8388608.0f;

// kRows rows per warp: each x element loaded is used for kRows rows.
constexpr int kRows = 2;

template <int BITS, int M, bool GIDX>
__global__ void __launch_bounds__(kWarps * 32) uniform_gemv_chunked_kernel(UniformDevice w, const float* __restrict__ x,
                                                                           float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kRows;
  if (r0 >= w.n) return;   // whole warps
  const int rows = w.n - r0 < kRows ? static_cast<int>(w.n - r0) : kRows;
  const int64_t chunks = w.k >> 5;
  float acc[kRows][M];
#pragma unroll
  for (int q = 0; q < kRows; ++q)
#pragma unroll
    for (int b = 0; b < M; ++b) acc[q][b] = 0.0f;
  for (int64_t j = lane; j < chunks; j += 32) {
    const int64_t c0 = j << 5;
    uint32_t v[kRows][BITS];
    float scale[kRows], zero[kRows];   // zero: 2^23 + z
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      const int64_t r = q < rows ? r0 + q : r0;   // a missing last row repeats the first (never stored)
      load_chunk<BITS>(w.qweight + r * w.words + j * BITS, v[q]);
      if constexpr (!GIDX) {
        const int64_t g = c0 / w.gs;
        scale[q] = group_scale(w, r, g);
        zero[q] = kMagicF + group_zero(w, r, g);
      }
    }
    // Without g_idx the chunk is one group: sum (q - z) x over it, then one multiply by the scale.
    float part[kRows][M];
#pragma unroll
    for (int q = 0; q < kRows; ++q)
#pragma unroll
      for (int b = 0; b < M; ++b) part[q][b] = 0.0f;
#pragma unroll
    for (int q4 = 0; q4 < 8; ++q4) {   // 4 columns at a time: one 16-byte load of x per batch row
      float wv[kRows][4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int i = q4 * 4 + t;
        int64_t g = 0;
        if constexpr (GIDX) g = __ldg(w.g_idx + c0 + i);
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          const float qf = __uint_as_float(kMagic | chunk_code<BITS>(v[q], i));
          if constexpr (GIDX) {
            const int64_t r = q < rows ? r0 + q : r0;
            wv[q][t] = (qf - (kMagicF + group_zero(w, r, g))) * group_scale(w, r, g);   // the format's value, exactly
          } else {
            wv[q][t] = qf - zero[q];
          }
        }
      }
#pragma unroll
      for (int b = 0; b < M; ++b) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(x + b * w.k + c0) + q4);
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          float& a = GIDX ? acc[q][b] : part[q][b];
          a = fmaf(wv[q][0], xv.x, a);
          a = fmaf(wv[q][1], xv.y, a);
          a = fmaf(wv[q][2], xv.z, a);
          a = fmaf(wv[q][3], xv.w, a);
        }
      }
    }
    if constexpr (!GIDX)
#pragma unroll
      for (int q = 0; q < kRows; ++q)
#pragma unroll
        for (int b = 0; b < M; ++b) acc[q][b] = fmaf(scale[q], part[q][b], acc[q][b]);
  }
#pragma unroll
  for (int q = 0; q < kRows; ++q)
    if (q < rows) reduce_and_store<M>(acc[q], r0 + q, w.n, y);
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32) uniform_gemv_columns_kernel(UniformDevice w, const float* __restrict__ x,
                                                                           float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= w.n) return;
  const uint32_t* row = w.qweight + r * w.words;
  float acc[M];
#pragma unroll
  for (int b = 0; b < M; ++b) acc[b] = 0.0f;
  for (int64_t c = lane; c < w.k; c += 32) {
    const int64_t g = w.g_idx != nullptr ? static_cast<int64_t>(__ldg(w.g_idx + c)) : c / w.gs;
    const float wv = (static_cast<float>(code_at(row, c, w.bits)) - group_zero(w, r, g)) * group_scale(w, r, g);
#pragma unroll
    for (int b = 0; b < M; ++b) acc[b] = fmaf(wv, __ldg(x + b * w.k + c), acc[b]);
  }
  reduce_and_store<M>(acc, r, w.n, y);
}

// ---------------------------------------------------------------------------------------------------------------------
// Dequantize to fp16.

constexpr int kDequantThreads = 256;

// A read-only load (through the non-coherent cache on the device; plain on the host, where the format checks run).
template <typename T>
__host__ __device__ __forceinline__ T ld_ro(const T* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}
__host__ __device__ __forceinline__ uint32_t ld_word(const uint32_t* p) { return ld_ro(p); }

// Codes c0 .. c0 + 7 of a row (c0 a multiple of 8, all inside the row) as one 64-bit window: code j at bits
// [BITS j, BITS (j + 1)). They are bits [o, o + 8 BITS) of the stream, o = BITS c0: at most 3 words (7 bits, o % 32 = 24).
template <int BITS>
__host__ __device__ __forceinline__ uint64_t codes8_window(const uint32_t* row, int64_t c0) {
  const int64_t o = c0 * BITS, wi = o >> 5;
  const int s = static_cast<int>(o & 31);
  const uint32_t w0 = ld_word(row + wi), w1 = s + 8 * BITS > 32 ? ld_word(row + wi + 1) : 0u,
                 w2 = s + 8 * BITS > 64 ? ld_word(row + wi + 2) : 0u;
  uint64_t win = ((static_cast<uint64_t>(w1) << 32) | w0) >> s;
  if (s + 8 * BITS > 64) win |= static_cast<uint64_t>(w2) << (64 - s);
  return win;
}

// Thread (blockIdx.x, threadIdx.x) of row blockIdx.y (+ gridDim.y, ...): columns 8 i .. 8 i + 7 of the row (fewer at
// its end). Each value (q - z) * scale in fp32 (exact: a 9-bit integer times an 11-bit scale), rounded once to fp16 as
// the reference f32_to_f16; one 16-byte store where the 8 outputs are 16-byte aligned (k a multiple of 8), else one
// store per value.
__host__ __device__ __forceinline__ float u32_as_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// The fp16 values of columns c0 .. c0 + cols - 1 (cols <= 8) of row r; one_group: they share group g0 (no g_idx).
template <int BITS>
__host__ __device__ __forceinline__ void dequant_run(const UniformDevice& w, int64_t r, int64_t c0, int cols, bool one_group,
                                                     int64_t g0, __half2 (&h)[4]) {
  constexpr uint32_t kCodeMask = (1u << BITS) - 1u;
  const uint32_t* row = w.qweight + r * w.words;
  uint32_t q[8];
  if (cols == 8) {
    const uint64_t win = codes8_window<BITS>(row, c0);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = static_cast<uint32_t>(win >> (BITS * j)) & kCodeMask;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {   // the code's one or two words
      const int64_t o = (c0 + (j < cols ? j : 0)) * BITS;
      const int s = static_cast<int>(o & 31);
      uint32_t v = ld_word(row + (o >> 5)) >> s;
      if (s + BITS > 32) v |= ld_word(row + (o >> 5) + 1) << (32 - s);
      q[j] = v & kCodeMask;
    }
  }
  float v[8];
  const float zsym = static_cast<float>(1 << (BITS - 1));
  if (one_group) {
    const int64_t e = r * w.G + g0;
    const float sc = __half2float(ld_ro(w.scales + e));
    const float zf = kMagicF + (w.zeros != nullptr ? static_cast<float>(ld_ro(w.zeros + e)) : zsym);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = (u32_as_float(kMagic | q[j]) - zf) * sc;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t c = c0 + (j < cols ? j : 0);
      const int64_t e = r * w.G + (w.g_idx != nullptr ? static_cast<int64_t>(ld_ro(w.g_idx + c)) : c / w.gs);
      const float sc = __half2float(ld_ro(w.scales + e));
      const float zf = kMagicF + (w.zeros != nullptr ? static_cast<float>(ld_ro(w.zeros + e)) : zsym);
      v[j] = (u32_as_float(kMagic | q[j]) - zf) * sc;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
}

// Thread (blockIdx.x, threadIdx.x) of row blockIdx.y (+ gridDim.y, ...): columns 8 i .. 8 i + 7 of the row (fewer at
// its end). Each value (q - z) * scale in fp32 (exact: a 9-bit integer times an 11-bit scale), rounded once to fp16 as
// the reference f32_to_f16; one 16-byte store where the 8 outputs are 16-byte aligned (k a multiple of 8), else one
// store per value.
template <int BITS>
__global__ void __launch_bounds__(kDequantThreads, 4) uniform_dequant_kernel(const UniformDevice w, __half* __restrict__ out) {
  const int64_t c0 = 8 * (static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x);
  if (c0 >= w.k) return;
  const int cols = static_cast<int>(min(static_cast<int64_t>(8), w.k - c0));
  const bool one_group = w.g_idx == nullptr && c0 % w.gs + cols <= w.gs;   // one scale for the thread's columns
  const int64_t g0 = w.g_idx == nullptr ? c0 / w.gs : 0;
  const bool out16 = reinterpret_cast<uintptr_t>(out) % 16 == 0 && w.k % 8 == 0;
  for (int64_t r = blockIdx.y; r < w.n; r += gridDim.y) {
    __half2 h[4];
    dequant_run<BITS>(w, r, c0, cols, one_group, g0, h);
    __half* dst = out + r * w.k + c0;
    if (out16) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(half2_u32(h[0]), half2_u32(h[1]), half2_u32(h[2]), half2_u32(h[3]));
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j < cols) dst[j] = j % 2 == 0 ? __low2half(h[j / 2]) : __high2half(h[j / 2]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Launchers.

// The most dynamic shared memory one CTA may have on the current device.
int max_smem_per_cta() {
  static const int bytes = [] {
    int dev = 0, v = 0;
    LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return v;
  }();
  return bytes;
}

// Sets of up to kTcMaxTiles tiles (fewer where the stages would not fit); the grid as many CTAs as fit the GPU, but at
// batch > 4 at most one per two tiles (with x copied per item, x is read once per set: at 8 batch rows a one-tile set
// reads 4x its code bytes of x). The set size and the occupancy depend on each other through the stages' size: a few
// rounds settle them.
template <int BITS, bool PACKED, bool XRES>
void launch_tc(const UniformDevice& w, const float* x, int m, float* y, cudaStream_t s) {
  auto kern = uniform_gemv_tc_kernel<BITS, PACKED, XRES>;
  static const int sms = device_sm_count();
  const int64_t T = (w.n + 15) / 16, per_cta_min = m > 4 ? 2 : 1;
  int cap = kTcMaxTiles;
  while (cap > 1 && tc_smem_bytes(BITS, cap, m, PACKED, XRES, w.k) > static_cast<size_t>(max_smem_per_cta())) --cap;
  int tiles = cap;
  int64_t grid = 1;
  for (int round = 0; round < 4; ++round) {
    const int per_sm = stream_blocks_per_sm(kern, kTcThreads, tc_smem_bytes(BITS, tiles, m, PACKED, XRES, w.k));
    grid = std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(sms) * per_sm, (T + per_cta_min - 1) / per_cta_min));
    const int want = static_cast<int>(std::min<int64_t>(cap, (T + grid - 1) / grid));
    if (want == tiles) break;
    tiles = want;
  }
  const size_t smem = tc_smem_bytes(BITS, tiles, m, PACKED, XRES, w.k);
  stream_blocks_per_sm(kern, kTcThreads, smem);   // raises the kernel's shared-memory limit to smem
  const int bpg = static_cast<int>(w.gs / kTcBlock);
  // In the dense GEMV's PDL class: a decode-chain weight-streaming GEMV under the same contract (codes and scales
  // before pdl_wait(), x and y after).
  launch_pdl(kPdlDense, kern, dim3(static_cast<unsigned>(grid)), dim3(kTcThreads), smem, s, w, x, y, m, tiles, bpg);
}

template <int BITS, int M>
void launch_chunked(const UniformDevice& w, const float* x, float* y, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((w.n + kWarps * kRows - 1) / (kWarps * kRows)));
  if (w.g_idx != nullptr) uniform_gemv_chunked_kernel<BITS, M, true><<<grid, kWarps * 32, 0, s>>>(w, x, y);
  else uniform_gemv_chunked_kernel<BITS, M, false><<<grid, kWarps * 32, 0, s>>>(w, x, y);
}

template <int M>
void launch_m(const UniformDevice& w, const float* x, float* y, cudaStream_t s) {
  if (!uniform_gemv_chunked(w)) {
    uniform_gemv_columns_kernel<M><<<static_cast<unsigned>((w.n + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(w, x, y);
    return;
  }
  switch (w.bits) {
    case 2: return launch_chunked<2, M>(w, x, y, s);
    case 3: return launch_chunked<3, M>(w, x, y, s);
    case 4: return launch_chunked<4, M>(w, x, y, s);
    case 5: return launch_chunked<5, M>(w, x, y, s);
    case 6: return launch_chunked<6, M>(w, x, y, s);
    case 7: return launch_chunked<7, M>(w, x, y, s);
    case 8: return launch_chunked<8, M>(w, x, y, s);
    default: fail("uniform_gemv: ", w.bits, " bits (2..8 served)");
  }
}

template <bool PACKED, bool XRES>
void launch_tc_bits(const UniformDevice& w, const float* x, int m, float* y, cudaStream_t s) {
  switch (w.bits) {
    case 2: return launch_tc<2, PACKED, XRES>(w, x, m, y, s);
    case 3: return launch_tc<3, PACKED, XRES>(w, x, m, y, s);
    case 4: return launch_tc<4, PACKED, XRES>(w, x, m, y, s);
    case 5: return launch_tc<5, PACKED, XRES>(w, x, m, y, s);
    case 6: return launch_tc<6, PACKED, XRES>(w, x, m, y, s);
    case 7: return launch_tc<7, PACKED, XRES>(w, x, m, y, s);
    case 8: return launch_tc<8, PACKED, XRES>(w, x, m, y, s);
    default: fail("uniform_gemv: ", w.bits, " bits (2..8 served)");
  }
}

// The mixed-input GEMM's MN-major operands: s_mn[g, r] = s[r, g] and zs_mn[g, r] = fp16(-z * s) (the product of an
// integer below 2^8 and an fp16 scale is exact in fp32; rounded once). One thread per (row, group), rows fastest so the
// writes coalesce.
__global__ void uniform_mn_operands_kernel(UniformDevice w, __half* __restrict__ s_mn, __half* __restrict__ zs_mn) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= w.n * w.G) return;
  const int64_t r = i % w.n, g = i / w.n;
  const __half s = w.scales[r * w.G + g];
  const float z = w.zeros != nullptr ? static_cast<float>(w.zeros[r * w.G + g]) : static_cast<float>(1 << (w.bits - 1));
  s_mn[i] = s;
  zs_mn[i] = __float2half_rn(-z * __half2float(s));
}

}  // namespace

bool uniform_gemm_serves(const UniformDevice& w) {
#if LOWBIT_WITH_CUTLASS
  return uniform_fused_fits(w.bits, w.n, w.k, w.gs, w.g_idx != nullptr) && uniform_fused_available();
#else
  (void)w;
  return false;
#endif
}

void uniform_mn_operands(const UniformDevice& w, __half* scales_mn, __half* zero_terms_mn, cudaStream_t s) {
  const int64_t count = w.n * w.G;
  if (count == 0) return;
  uniform_mn_operands_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, s>>>(w, scales_mn, zero_terms_mn);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void uniform_gemm(const UniformDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int tile) {
#if LOWBIT_WITH_CUTLASS
  LOWBIT_CHECK(uniform_gemm_serves(w) && w.scales_mn != nullptr && w.zero_terms_mn != nullptr,
               "uniform_gemm: not served for a w", w.bits, " ", w.n, "x", w.k, " g", w.gs,
               w.g_idx != nullptr ? " act-order" : "", " weight (uniform_gemm_serves, or its MN-major operands not derived)");
  UniformFusedArgs a;
  LOWBIT_CHECK(tile == 0 || tile == 128 || tile == 256, "uniform_gemm: tile ", tile, " (0, 128 or 256)");
  a.tile = tile == 128 ? UniformFusedTile::T128 : tile == 256 ? UniformFusedTile::T256 : UniformFusedTile::Auto;
  a.bits = w.bits;
  a.m = m, a.n = w.n, a.k = w.k, a.group = std::min(w.gs, w.k);
  a.codes = w.qweight;
  a.scales_mn = w.scales_mn;
  a.zero_terms_mn = w.zero_terms_mn;
  __half* xh = ctx.act_scratch(static_cast<size_t>(m * w.k));
  f32_to_f16(x, xh, m * w.k, ctx.stream());
  a.x = xh;
  a.y = y;
  const size_t ws_bytes = uniform_fused_workspace_bytes(a);
  void* ws = ws_bytes > 0 ? static_cast<void*>(ctx.weight_scratch((ws_bytes + 1) / 2)) : nullptr;
  uniform_fused_gemm(a, ws, ws_bytes, ctx.stream());
#else
  (void)x, (void)m, (void)y, (void)ctx, (void)tile;
  fail("uniform_gemm: this build has no CUTLASS kernels (a w", w.bits, " ", w.n, "x", w.k, " weight)");
#endif
}

bool uniform_gemv_tensor_core(const UniformDevice& w) {
  return w.k % kTcBlock == 0 && w.g_idx == nullptr && w.gs % kTcBlock == 0 && w.bits >= 2 && w.bits <= 8 &&
         static_cast<uint64_t>(w.n) * static_cast<uint64_t>(w.words) < (1ull << 32) &&
         static_cast<uint64_t>(w.n) * static_cast<uint64_t>(w.G) < (1ull << 32);
}

bool uniform_gemv_chunked(const UniformDevice& w) {
  return w.k % 32 == 0 && (w.g_idx != nullptr || w.gs % 32 == 0);
}

void uniform_gemv(const UniformDevice& w, const float* x, int m, float* y, cudaStream_t s) {
  LOWBIT_CHECK(m >= 1 && m <= 8, "uniform_gemv: batch ", m, " (1..8 served; above, dequantize + cuBLAS)");
  LOWBIT_CHECK(!uniform_gemv_chunked(w) || reinterpret_cast<uintptr_t>(x) % 16 == 0,
               "uniform_gemv: x must be 16-byte aligned");
  if (uniform_gemv_tensor_core(w)) {
    const bool xres = 4 * w.k * m <= kTcResidentXBytes;
    if (m <= 4) xres ? launch_tc_bits<true, true>(w, x, m, y, s) : launch_tc_bits<true, false>(w, x, m, y, s);
    else xres ? launch_tc_bits<false, true>(w, x, m, y, s) : launch_tc_bits<false, false>(w, x, m, y, s);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  switch (m) {
    case 1: launch_m<1>(w, x, y, s); break;
    case 2: launch_m<2>(w, x, y, s); break;
    case 3: launch_m<3>(w, x, y, s); break;
    case 4: launch_m<4>(w, x, y, s); break;
    case 5: launch_m<5>(w, x, y, s); break;
    case 6: launch_m<6>(w, x, y, s); break;
    case 7: launch_m<7>(w, x, y, s); break;
    default: launch_m<8>(w, x, y, s); break;
  }
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void uniform_dequant_f16(const UniformDevice& w, __half* out, cudaStream_t s) {
  if (w.n == 0 || w.k == 0) return;
  const dim3 grid(static_cast<unsigned>(((w.k + 7) / 8 + kDequantThreads - 1) / kDequantThreads),
                  static_cast<unsigned>(std::min<int64_t>(w.n, 65535)));
  const bool served = dispatch_int<2, 3, 4, 5, 6, 7, 8>(w.bits, [&](auto b) {
    uniform_dequant_kernel<decltype(b)::value><<<grid, kDequantThreads, 0, s>>>(w, out);
  });
  if (!served) fail("uniform_dequant_f16: ", w.bits, " bits (2..8 served)");
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
