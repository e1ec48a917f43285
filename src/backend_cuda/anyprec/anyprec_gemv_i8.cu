// The any-precision GEMV on int8 tensor cores (GemvPath::TensorCoreInt8LutStream; 2..4 bits, batch 1..8, k a
// multiple of 128 and >= 2048).
//
// Why: the register-table kernels (anyprec_gemv.cu) are bound by their integer instructions, not by memory (ncu,
// H200, 3 bits 28672x8192 batch 1: 3.1 instructions per weight, the ALU pipe the busiest; a third of all instructions
// PRMT). An fp16 centroid is two bytes, so a lookup of four codes takes four PRMT: the low bytes, the high bytes, and
// two interleaves into half2 pairs. Here each row's centroids are int8 under a row scale (int8_tables.h, derived at
// upload from the fp16 LUT: each centroid off by at most max|c| / 254), so one PRMT looks up four codes as the four
// bytes of an int8 A register of mma.sync m16n8k32. At 4 bits the centroids carry a second int8 piece (c ~ sigma (hi +
// lo / 254), off by at most max|c| / 64008): one piece cost +0.69% perplexity there (a what-if on every layer of
// SmolLM2, docs/PERF.md; +0.09% at 3 bits), and the second piece's lookup and mma (into the x low piece's
// accumulator, the same 1/254 scale) keep the 4-bit kernel exact to fp16 level. A 16-entry table is two 8-byte
// halves; each piece's table is stored so that the two halves' PRMT lookups (the code's msb, flipped for the second
// half, making PRMT return the sign of a byte: 0 or -1) sum to the value (int8_tables.h, i8_split16), and the mma adds
// them: two PRMT and two mma per four codes and piece, where a merge PRMT made it three PRMT and one mma (SASS of the
// 4-bit loop: 896 -> 800 instructions per item, 384 -> 256 PRMT). The activations become two int8 pieces under one
// scale per batch column (x ~ s (hi + lo / 254), off by at most max|x| / 64516), one mma each into int32 accumulators:
// the sums are exact, and y = sigma_row * s_col * (sum_hi + sum_lo / 254) in fp32 at the end.
//
// Fragments: lane (g, t) holds rows g and g + 8 of its 16-row tile and words 16 gi + 4t + e (e = 0..3) of group gi of
// each plane row, as the streamed register-table kernel. Slot s = 0..3 of word e is one mma: the selector of slot s
// (transpose_slot<B, 0x11111111>, or its rotated form at 2..3 bits: nibble q = the code of word bit 4q + s) gives A
// bytes q of a0 / a1 (rows g / g + 8, k 4t + q) and, shifted by 16, the codes of bits 16 + 4q + s for a2 / a3 (k 16 +
// 4t + q). The activation pieces of those
// bits are written in that order by anyprec_i8_x_kernel, so the mma's k index never has to match a column of x:
// each lane's B bytes are the x pieces of its own codes' columns. At batch 1..4 one mma can take both pieces (B column g
// = batch column g / 2's piece g % 2; kPackPieces, where i8_form measured it faster), and the CTA's warps' int32 sums are
// summed as integers before the one fp32 scaling (reduce_i8_fragments), so no CTA form changes the result.
//
// Memory side as the streamed register-table kernel: persistent CTAs of 4 warps, each warp streaming its work items
// (tile, group of 16 words) through a private cp.async ring; a stage holds the group's plane words of the lane's two
// rows, at the tile's first group the tile's 16 int8 table rows and scales, and the group's x pieces of every batch
// column (1 KB per column).
#include <cstdlib>

#include "core/knobs.h"
#include "backend_cuda/anyprec/anyprec_codes.cuh"
#include "backend_cuda/anyprec/int8_tables.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/common/mma.cuh"
#include "backend_cuda/anyprec/anyprec.h"
#include "backend_cuda/common/row_absmax.cuh"
#include "backend_cuda/common/stream.cuh"
#include "backend_cuda/ops/swiglu.cuh"

namespace lowbit::cuda {
namespace {

constexpr int kI8XHeaderBytes = 256;   // the xq scratch: float scale[8], padded; then the pieces

// The x pieces of batch column col, group gi, word e, slot s, lane t: one uint4 {b0 hi, b1 hi, b0 lo, b1 lo}, where byte q of
// b0 / b1 is the piece of the column of word bit 4q + s / 16 + 4q + s. Index within the pieces: gi * 64 M + ((4e + s) M
// + col) * 4 + t, M columns per group (columns m .. M - 1 zero).
__host__ __device__ constexpr int64_t i8_x_index(int64_t gi, int e, int s, int col, int t, int M) {
  return gi * 64 * M + (static_cast<int64_t>(4 * e + s) * M + col) * 4 + t;
}

// Entry (gi, e, s, t) of column col: its 8 activations' pieces under scale sc as one 16-byte store.
__device__ __forceinline__ void i8_x_store(uint8_t* xq, int64_t gi, int e, int sl, int col, int t, int M, float sc, const float (&xv)[8]) {
  uint32_t b[4] = {0u, 0u, 0u, 0u};   // b0 hi, b1 hi, b0 lo, b1 lo
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    int8_t hi, lo;
    i8_x_pieces(xv[i], sc, hi, lo);
    b[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(hi)) << (8 * (i % 4));
    b[2 + i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(lo)) << (8 * (i % 4));
  }
  reinterpret_cast<uint4*>(xq + kI8XHeaderBytes)[i8_x_index(gi, e, sl, col, t, M)] = make_uint4(b[0], b[1], b[2], b[3]);
}

// The activations' int8 pieces (int8_tables.h) in the GEMV's order, and each column's scale in the header. Grid (chunks, M)
// of kI8XThreads threads, one entry (gi, e, s, t) each: every block first loads its entries' 8 activations, then reduces
// max |x| over its column's whole row (k floats from L2, 8 float4 loads in flight per thread: a loop waiting on one
// load per iteration took k / 1024 round trips; the blocks of a column agree), then writes its entries; columns >= m
// are zero. xmax != nullptr: the rows' max |x| as the kernel producing x computed them (exact, the same value): no
// row-wide reduction (that reduction is most of this kernel's time in a decode step: H200, Llama-2-7B 3 bits, the step
// 477.8 -> 513.5 tok/s without it).
constexpr int kI8XThreads = 512;
__global__ void __launch_bounds__(kI8XThreads) anyprec_i8_x_kernel(int64_t k, int64_t W, const float* __restrict__ x, int m, int M,
                                                                  bool vec, uint8_t* __restrict__ xq, const float* __restrict__ xmax) {
  pdl_launch_dependents();
  pdl_wait();
  const int col = static_cast<int>(blockIdx.y);
  const float* xr = x + static_cast<int64_t>(col) * k;
  const int64_t G = (W + 15) / 16;
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;   // (gi, e, s, t)
  const int t = static_cast<int>(id % 4), sl = static_cast<int>(id / 4 % 4), e = static_cast<int>(id / 16 % 4);
  const int64_t gi = id / 64, word = 16 * gi + 4 * t + e, T = word / 32;
  const bool live = id < G * 64 && col < m && word < W;
  float xv[8];   // the columns of word bits 16 h + 4 q + sl, index 4 h + q (0 past k or the row's words)
  {
    const int nw = static_cast<int>(min_i64(32, W - 32 * T)), wt = static_cast<int>(word % 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int bit = 16 * (i / 4) + 4 * (i % 4) + sl;
      const int64_t c = 1024 * T + static_cast<int64_t>(bit / 8) * 8 * nw + 8 * wt + bit % 8;
      xv[i] = live && c < k ? __ldg(xr + c) : 0.0f;
    }
  }
  if (xmax != nullptr) {
    const float s = col < m ? xmax[col] / kI8Max : 0.0f;
    if (blockIdx.x == 0 && threadIdx.x == 0) reinterpret_cast<float*>(xq)[col] = s;
    if (id < G * 64) i8_x_store(xq, gi, e, sl, col, t, M, s, xv);
    return;
  }
  const float mx = block_row_absmax<kI8XThreads>(xr, k, vec, col < m);
  const float s = mx / kI8Max;
  if (blockIdx.x == 0 && threadIdx.x == 0) reinterpret_cast<float*>(xq)[col] = col < m ? s : 0.0f;
  if (id < G * 64) i8_x_store(xq, gi, e, sl, col, t, M, s, xv);
}

// The fused outliers' coefficient of entry e: val - sigma * q[code] (4 bits: sigma * (q + lo / 254)), the int8 centroid
// the dense part used.
template <int B>
struct I8OutlierEntry {
  AnyPrecDevice w;
  __device__ __forceinline__ float operator()(int64_t row, int64_t e, int64_t& xcol) const {
    const int64_t c = __ldg(w.col + e);
    xcol = c;
    const int code = code_at<B>(w, row, c);
    float q;
    if constexpr (B == 4) {   // the tables in i8_split16's form
      q = static_cast<float>(i8_split16_at(w.lut8[B] + row * 16, code)) +
          static_cast<float>(i8_split16_at(w.lut8_lo4 + row * 16, code)) * (1.0f / kI8LoSteps);
    } else {
      q = static_cast<float>(w.lut8[B][row * (1 << B) + code]);
    }
    return __half2float(w.val[e]) - __ldg(w.lut8_scale[B] + row) * q;
  }
};

// The batch columns a stage holds for batch m (the kernel forms M = 1, 2, 4, 8; columns m .. M - 1 are zero).
constexpr int i8_columns(int m) { return m <= 2 ? m : m <= 4 ? 4 : 8; }

template <int B, int M, int kStages, int kWarps>
struct I8Stage {
  static constexpr int kPlaneBytes = 2 * B * 32 * 16;   // [row half][plane][lane] uint4
  static constexpr int kPieces = B == 4 ? 2 : 1;         // centroid pieces (int8_tables.h: two at 4 bits)
  static constexpr int kTabBytes = kPieces * (16 << B);  // [piece] 16 rows x 2^B int8
  static constexpr int kTabChunks = kTabBytes / 16;
  static constexpr int kScaleBytes = 64;                // 16 row scales
  static constexpr int kXBytes = 1024 * M;              // [e][s][col][t] uint4
  static constexpr int kBytes = kPlaneBytes + kTabBytes + kScaleBytes + kXBytes;
  static constexpr int kWarpBytes = kStages * kBytes;
  // The registers' cap: 4-warp CTAs with two stages, 4 per SM at batch <= 2, 3 above (larger stages); 8 warps: 2.
  // (Five per SM, one accumulator chain per piece, 88 registers: 8192x28672 3 bits batch 1 at 42.6-43.4 us against
  // 36.4-36.6; H200.)
  // Three stages (4 bits at batch 1, below): 4-warp CTAs capped for three per SM (4 bits: 5.7 KB stages), 8 warps two.
  static constexpr int kMinBlocks = kWarps == 4 ? (kStages == 2 ? (M <= 2 ? 4 : 3) : 3) : 2;
};

// The int8 GEMV's epilogue: the CTA's warps' exact int32 sums of the tile (per lane: kPack, rows g / g + 8 of batch column
// t; else the m16n8 fragment, rows g / g + 8 and columns 2t / 2t + 1) summed as integers over the warps, then scaled
// once: lane (row 4 warp + lane % 4, batch column lane / 4) of warps 0..3 returns (hi + lo / 254) sigma_row s_col plus,
// with outliers, outlier_corrections'. Integer sums make the value the same for every CTA form (4 or 8 warps) and any
// split of the groups over the warps. sg0 / sg1: the row scales of rows g / g + 8 (every warp loads them with its
// first group: G >= kWarps), sxm: the scale of batch column lane / 4. buf: the double-buffered scratch's half.
template <int kWarps, bool kOutliers, bool kPack, int kE, typename Entry>
__device__ __forceinline__ float reduce_i8_fragments(const int (&hi)[kE], const int (&lo)[kE], float sg0, float sg1, float sxm, int warp,
                                                     int lane, int64_t row0, int64_t n, int m_total, const int32_t* __restrict__ rowptr,
                                                     OutlierX xo, Entry entry, int buf) {
  static_assert(kWarps >= 4 && kE == (kPack ? 2 : 4), "warps 0..3 store the 16 rows");
  __shared__ int part[2][kWarps][32][2 * kE];   // each warp's sums, (hi, lo) per element
  const int lr = 4 * warp + lane % 4, mm = lane / 4;   // the lane's row within the tile (warps 0..3) and batch column
  // The row scale of row lr, held by lanes 4 (lr % 8) + t as sg0 (lr < 8) or sg1.
  const float s0 = __shfl_sync(0xffffffffu, sg0, 4 * (lr % 8)), s1 = __shfl_sync(0xffffffffu, sg1, 4 * (lr % 8));
  float extra = 0.0f;
  if constexpr (kOutliers) {   // before the barrier: the warps' outlier loads overlap the others' arrival
    if (warp < 4 && rowptr != nullptr && row0 + 4 * warp < n) extra = outlier_corrections(rowptr, row0 + 4 * warp, n, xo, m_total, lane, entry);
  }
#pragma unroll
  for (int i = 0; i < kE; ++i) {
    part[buf][warp][lane][2 * i] = hi[i];
    part[buf][warp][lane][2 * i + 1] = lo[i];
  }
  __syncthreads();
  float v = 0.0f;
  if (warp < 4 && mm < m_total && row0 + lr < n) {
    // (row lr, column mm): kPack lane 4 (lr % 8) + mm, element lr / 8; else lane 4 (lr % 8) + mm / 2, element 2 (lr / 8) + mm % 2.
    const int src = kPack ? 4 * (lr % 8) + mm : 4 * (lr % 8) + mm / 2, e = kPack ? lr / 8 : 2 * (lr / 8) + mm % 2;
    int h = 0, l = 0;
    for (int wi = 0; wi < kWarps; ++wi) {
      h += part[buf][wi][src][2 * e];
      l += part[buf][wi][src][2 * e + 1];
    }
    const float sum = static_cast<float>(h) + static_cast<float>(l) * (1.0f / kI8LoSteps);
    v = sum * (lr < 8 ? s0 : s1) * sxm + extra;
  }
  return v;
}

// kI8Warps: the warps of a CTA, each taking every kI8Warps-th group of the tile's rows (4, or 8 for grids of few tiles).
// kSwiGlu (a stacked gate/up weight, n = 2 H, H = 16 hp): the CTA takes its tiles in pairs, gate tile u then up tile
// u + hp, keeps the gate tile's reduced values in the storing lanes and writes h = silu(gate) * up to y [m, H] (the
// same expression as swiglu_kernel) after the up tile, and each batch column's max |h| (atomicMax of its bits into
// hmax_bits[col], a slot zeroed earlier in the step) for the down GEMV's activation kernel: no SwiGLU kernel.
template <int B, bool kFusedOutliers, int M, int kStages, int kI8Warps, bool kSwiGlu, bool kPackPieces>
__global__ void __launch_bounds__(kI8Warps * 32, (I8Stage<B, M, kStages, kI8Warps>::kMinBlocks)) anyprec_gemv_i8_stream_kernel(
    AnyPrecDevice w, const float* __restrict__ x, int m_total, float* __restrict__ y, const uint8_t* __restrict__ xq,
    int64_t hp, unsigned* __restrict__ hmax_bits) {
  using S = I8Stage<B, M, kStages, kI8Warps>;
  extern __shared__ __align__(16) unsigned char i8_smem[];
  const int64_t n = w.n, k = w.k, W = w.words, G = (W + 15) / 16, tiles = (n + 15) / 16;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int8_t* tab = w.lut8[B];
  const float* tab_scale = w.lut8_scale[B];
  const int8_t* tab_lo = w.lut8_lo4;   // 4 bits: the centroids' second pieces
  const uint4* xp = reinterpret_cast<const uint4*>(xq + kI8XHeaderBytes);
  StreamRing<kStages, kI8Warps> ring(static_cast<uint32_t>(__cvta_generic_to_shared(i8_smem)) + warp * S::kWarpBytes, S::kBytes,
                                     tiles, G, warp);
  const PlaneCopy planes(w);
  auto issue_weights = [&] {   // the lane's plane words and, at a tile's first group, the tile's tables and scales
    const uint32_t st = ring.issue_stage();
    const uint32_t it_gi = static_cast<uint32_t>(ring.it_item), row0 = static_cast<uint32_t>(ring.it_tile) * 16;
    planes.issue<B>(st, row0, it_gi, g, t, lane);
    if (it_gi == static_cast<uint32_t>(warp)) {   // rows are padded to 16 (lut8, lut8_scale): the tile's copies are always in bounds
      constexpr int kPieceChunks = S::kTabChunks / S::kPieces;
#pragma unroll
      for (int c = lane; c < S::kTabChunks + 4; c += 32) {   // the pieces' tables, then the 16 row scales
        if (c < S::kTabChunks)
          cp_async(st + S::kPlaneBytes + 16 * c, (c < kPieceChunks ? tab : tab_lo) + ((row0 << B) + 16 * (c % kPieceChunks)), 16);
        else
          cp_async(st + S::kPlaneBytes + S::kTabBytes + 16 * (c - S::kTabChunks), tab_scale + (row0 + 4 * (c - S::kTabChunks)), 16);
      }
    }
  };
  auto issue_x = [&] {   // the group's pieces of all M columns
    const uint32_t st = ring.issue_stage() + S::kPlaneBytes + S::kTabBytes + S::kScaleBytes;
    const uint32_t o = static_cast<uint32_t>(ring.it_item) * (64 * M) + lane;
#pragma unroll
    for (int c = 0; c < S::kXBytes / 16 / 32; ++c) cp_async(st + 16 * (lane + 32 * c), xp + (o + 32 * c), 16);
  };
  if constexpr (kSwiGlu) ring.pair = static_cast<int32_t>(hp);
  ring.prologue(issue_weights, issue_x);   // xq and y belong to the kernels before
  const float* xscale = reinterpret_cast<const float*>(xq);
  // kPack (batch 1..4, kPackPieces): B column g is batch column g / 2's piece g % 2, so one mma sums a slot's both
  // activation pieces (C columns 2t, 2t + 1: batch column t's hi and lo sums) where the unpacked form (B column g is
  // batch column g) takes one mma per piece. The same integer sums, so the same bits. (Which is faster: i8_form.)
  constexpr bool kPack = M <= 4 && kPackPieces;
  const float sxm = lane / 4 < m_total ? __ldg(xscale + lane / 4) : 0.0f;   // the scale of the batch column the lane stores
  // The lane's B bytes: lanes of batch columns >= M read column 0's pieces (not stored).
  const int xcol = kPack ? g / 2 : g;
  const uint32_t xl = 16 * ((xcol < M ? xcol : 0) * 4 + t) + (kPack ? 8 * (g % 2) : 0);
  int buf = 0;
  const int64_t units = kSwiGlu ? hp : tiles;
  float gate = 0.0f, hmax = 0.0f;   // kSwiGlu: the lane's gate value, its batch column's max |h| so far
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x)
  for (int half = 0; half < (kSwiGlu ? 2 : 1); ++half) {
    const int64_t tile = unit + half * hp, row0 = tile * 16;
    I8Table<B> tab0, tab1, tlo0, tlo1;   // tlo: 4 bits, the centroids' second pieces
    float sg0 = 0.0f, sg1 = 0.0f;
    // Two chains per piece (slot parity); 4 bits: two more, for the tables' second half (i8_split16: each code's value is
    // the sum of two PRMT lookups, one mma each). kPack: acc_h both x pieces, acc_l (4 bits) the centroids' second pieces.
    constexpr int kChains = B == 4 ? 4 : 2;
    int acc_h[kChains][4] = {}, acc_l[kChains][4] = {};
    for (int64_t gi = warp; gi < G; gi += kI8Warps) {
      const uint32_t st = ring.next(issue_weights, issue_x);
      if (gi == warp) {   // the tile's first group: its tables and scales
        const uint32_t tb = st + S::kPlaneBytes;
        if constexpr (B == 2) {
          tab0.v[0] = lds_u32(tb + 4 * g);
          tab1.v[0] = lds_u32(tb + 4 * (g + 8));
        } else if constexpr (B == 3) {
          uint32_t a[2], b[2];
          lds_u32x2(tb + 8 * g, a);
          lds_u32x2(tb + 8 * (g + 8), b);
          tab0.v[0] = a[0]; tab0.v[1] = a[1]; tab1.v[0] = b[0]; tab1.v[1] = b[1];
        } else {
          lds_u32x4(tb + 16 * g, tab0.v);
          lds_u32x4(tb + 16 * (g + 8), tab1.v);
          lds_u32x4(tb + 256 + 16 * g, tlo0.v);
          lds_u32x4(tb + 256 + 16 * (g + 8), tlo1.v);
        }
        sg0 = __uint_as_float(lds_u32(tb + S::kTabBytes + 4 * g));
        sg1 = __uint_as_float(lds_u32(tb + S::kTabBytes + 4 * (g + 8)));
      }
      uint32_t p0[B][4], p1[B][4];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        lds_u32x4(st + (j * 32 + lane) * 16, p0[j]);
        lds_u32x4(st + ((B + j) * 32 + lane) * 16, p1[j]);
      }
      const uint32_t xs = st + S::kPlaneBytes + S::kTabBytes + S::kScaleBytes + xl;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        uint32_t w0[B], w1[B];
#pragma unroll
        for (int j = 0; j < B; ++j) { w0[j] = p0[j][e]; w1[j] = p1[j][e]; }
        // 2..3 bits: the planes rotated once per word (rotated_slot_bits). At 4 bits that form moved shifts from IMAD onto
        // the busier ALU pipe (+24 SHF per item) and made the 8-warp batch-8 forms spill: 4 bits transpose per slot.
        uint32_t r0[B <= 3 ? B : 1], r1[B <= 3 ? B : 1];
        if constexpr (B <= 3) {
          rotate_planes<B>(w0, r0);
          rotate_planes<B>(w1, r1);
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t xb[4];
          if constexpr (kPack) lds_u32x2(xs + 16 * 4 * M * (4 * e + s), reinterpret_cast<uint32_t(&)[2]>(xb));
          else lds_u32x4(xs + 16 * 4 * M * (4 * e + s), xb);
          if constexpr (B == 4) {
            // Nibble q of c0 / c1: the 4-bit code of word bit 4q + s (plane 0 its msb), of rows g / g + 8. The tables'
            // first halves take the codes as they are, the second halves with the msb flipped (i8_split16).
            const uint32_t c0 = transpose_slot<4, 0x11111111u>(w0, s), c1 = transpose_slot<4, 0x11111111u>(w1, s);
#pragma unroll
            for (int part = 0; part < 2; ++part) {
              const uint32_t f0 = part == 0 ? c0 : c0 ^ 0x88888888u, f1 = part == 0 ? c1 : c1 ^ 0x88888888u;
              const int ch = (s & 1) + 2 * part;
              uint32_t a[4], al[4];
              a[0] = prmt(tab0.v[2 * part], tab0.v[2 * part + 1], f0);
              a[1] = prmt(tab1.v[2 * part], tab1.v[2 * part + 1], f1);
              a[2] = prmt(tab0.v[2 * part], tab0.v[2 * part + 1], f0 >> 16);
              a[3] = prmt(tab1.v[2 * part], tab1.v[2 * part + 1], f1 >> 16);
              al[0] = prmt(tlo0.v[2 * part], tlo0.v[2 * part + 1], f0);
              al[1] = prmt(tlo1.v[2 * part], tlo1.v[2 * part + 1], f1);
              al[2] = prmt(tlo0.v[2 * part], tlo0.v[2 * part + 1], f0 >> 16);
              al[3] = prmt(tlo1.v[2 * part], tlo1.v[2 * part + 1], f1 >> 16);
              mma_s8_16832(acc_h[ch], a, xb[0], xb[1]);
              if constexpr (!kPack) mma_s8_16832(acc_l[ch], a, xb[2], xb[3]);
              mma_s8_16832(acc_l[ch], al, xb[0], xb[1]);   // the centroids' second pieces times x's first (kPack: even C columns)
            }
          } else {
            uint32_t v0, v0h, v1, v1h;
            slot_selectors(rotated_slot_bits<B>(r0, s), s, v0, v0h);
            slot_selectors(rotated_slot_bits<B>(r1, s), s, v1, v1h);
            uint32_t a[4];
            a[0] = i8_lookup<B>(tab0, v0);
            a[1] = i8_lookup<B>(tab1, v1);
            a[2] = i8_lookup<B>(tab0, v0h);
            a[3] = i8_lookup<B>(tab1, v1h);
            mma_s8_16832(acc_h[s & 1], a, xb[0], xb[1]);
            if constexpr (!kPack) mma_s8_16832(acc_l[s & 1], a, xb[2], xb[3]);
          }
        }
      }
    }
    // The lane's exact sums (hi: x's first pieces; lo: the 1/254-scaled terms). kPack: rows g, g + 8 of batch column t;
    // else c0, c1: row g, columns 2t, 2t + 1; c2, c3: row g + 8.
    constexpr int kE = kPack ? 2 : 4;
    int hi[kE], lo[kE];
#pragma unroll
    for (int i = 0; i < kE; ++i) {
      const int c = kPack ? 2 * i : i;
      hi[i] = 0, lo[i] = 0;
#pragma unroll
      for (int ch = 0; ch < kChains; ++ch) {
        hi[i] += acc_h[ch][c];
        lo[i] += kPack ? acc_h[ch][c + 1] + (B == 4 ? acc_l[ch][c] : 0) : acc_l[ch][c];
      }
    }
    if (unit + gridDim.x >= units && half == (kSwiGlu ? 1 : 0)) pdl_launch_dependents();   // the CTA's last tile
    const float v = reduce_i8_fragments<kI8Warps, kFusedOutliers, kPack>(hi, lo, sg0, sg1, sxm, warp, lane, row0, n, m_total, w.rowptr,
                                                                       OutlierX{x, k, 1}, I8OutlierEntry<B>{w}, buf);
    if constexpr (kSwiGlu) {
      const int mm = lane / 4;
      const int64_t j = unit * 16 + warp * 4 + lane % 4;   // the hidden unit of this lane's row in both tiles
      if (half == 0) {
        gate = v;
      } else if (warp < 4 && mm < m_total) {
        const float h = silu_mul(gate, v);
        y[mm * (hp * 16) + j] = h;
        hmax = i8_absmax_step(hmax, h);
      }
    } else {
      const int64_t row = row0 + warp * 4 + lane % 4;
      if (warp < 4 && lane / 4 < m_total && row < n) y[(lane / 4) * n + row] = v;
    }
    buf ^= 1;
  }
  if constexpr (kSwiGlu) {   // each batch column's max over the CTA's units: lanes 4 mm .. 4 mm + 3 of warps 0..3
    if (warp < 4) {
      hmax = i8_absmax_step(hmax, __shfl_xor_sync(0xffffffffu, hmax, 1));
      hmax = i8_absmax_step(hmax, __shfl_xor_sync(0xffffffffu, hmax, 2));
      if (lane % 4 == 0 && lane / 4 < m_total) atomicMax(hmax_bits + lane / 4, __float_as_uint(hmax));
    }
  }
  cp_async_wait<0>();   // no copy outlives the CTA
}

// The kernel of a form; pack: kPackPieces (instantiated where it can differ: batch 1..4; 4 bits always pack).
template <int B, int M, int kStages, int kWarps, bool kPackPieces>
auto i8_kernel_of(bool fused, bool sw) {
  return sw ? (fused ? anyprec_gemv_i8_stream_kernel<B, true, M, kStages, kWarps, true, kPackPieces>
                     : anyprec_gemv_i8_stream_kernel<B, false, M, kStages, kWarps, true, kPackPieces>)
            : (fused ? anyprec_gemv_i8_stream_kernel<B, true, M, kStages, kWarps, false, kPackPieces>
                     : anyprec_gemv_i8_stream_kernel<B, false, M, kStages, kWarps, false, kPackPieces>);
}
template <int B, int M, int kStages, int kWarps>
auto i8_kernel(bool fused, bool sw, bool pack = true) {
  if constexpr (M <= 4 && B <= 3) {
    if (!pack) return i8_kernel_of<B, M, kStages, kWarps, false>(fused, sw);
  }
  return i8_kernel_of<B, M, kStages, kWarps, (M <= 4)>(fused, sw);
}

// The most work items one warp of the persistent grid takes (its makespan in items) with kWarps warps per CTA: units (tiles,
// or SwiGLU's tile pairs) spread over the resident CTAs, each unit's G groups over the CTA's warps.
template <int B, int M, int kStages, int kWarps>
int64_t i8_items_per_warp(const AnyPrecDevice& w, bool fused, bool sw) {
  static const int sms = device_sm_count();
  const size_t smem = static_cast<size_t>(kWarps) * I8Stage<B, M, kStages, kWarps>::kWarpBytes;
  const int64_t ctas = static_cast<int64_t>(sms) * stream_blocks_per_sm(i8_kernel<B, M, kStages, kWarps>(fused, sw), kWarps * 32, smem);
  const int64_t G = (w.words + 15) / 16, units = sw ? w.n / 32 : (w.n + 15) / 16;
  return (units + ctas - 1) / ctas * (sw ? 2 : 1) * ((G + kWarps - 1) / kWarps);
}

template <int B, int M, int kStages, int kWarps>
void launch_i8(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s, bool fused, uint8_t* xq, unsigned* hmax_bits,
               bool pack) {
  const size_t smem = static_cast<size_t>(kWarps) * I8Stage<B, M, kStages, kWarps>::kWarpBytes;
  const bool sw = hmax_bits != nullptr;
  auto kern = i8_kernel<B, M, kStages, kWarps>(fused, sw, pack);
  const int64_t hp = sw ? w.n / 32 : 0;   // SwiGLU: tile pairs, one per 16 hidden units
  launch_pdl(kPdlRegLut, kern, persistent_grid(kern, kWarps * 32, smem, sw ? hp : (w.n + 15) / 16), kWarps * 32, smem, s, w, x, m, y,
             static_cast<const uint8_t*>(xq), hp, hmax_bits);
}

// The int8 GEMV's ring stages at batch 1 for width b and an n x k matrix: 3 at 4 bits on rows of at most 4096 inputs,
// and at 2 and 4 bits where the grid has at most two tiles per SM (eight-warp CTAs, one tile each: the three-stage
// CTAs' lower occupancy costs no tile rounds there), else 2;
// LOWBIT_I8_STAGES=2|3 (core/knobs.h) sets every case (bench runs compare them).
int i8_stages(int b, int64_t n, int64_t k) {
  static const int forced = [] {
    const int64_t s = knob_int(Knob::I8Stages);
    return s == 2 || s == 3 ? static_cast<int>(s) : 0;
  }();
  static const int sms = device_sm_count();
  return forced != 0 ? forced : (b == 4 && k <= 4096) || (b != 3 && (n + 15) / 16 <= 2LL * sms) ? 3 : 2;
}

// The CTA form of the int8 GEMV for a weight, batch form M and epilogue (sw: SwiGLU's tile pairs): warps per CTA and
// ring stages.
struct I8Form {
  int warps, stages;
  bool pack;   // kPackPieces
};
template <int B, int M>
I8Form i8_form(const AnyPrecDevice& w, bool fused, bool sw) {
  static const int sms = device_sm_count();
  const int64_t G = (w.words + 15) / 16, tiles = (w.n + 15) / 16;
  // Grids of at most two tiles per SM (the 4096-row matrices of 7B models: 256 tiles) have few warps to hide the
  // latency with four per tile (ncu, H200, 4096x11008 3 bits batch 1: 1.8 warps per scheduler, 64% of cycles without an
  // eligible warp): eight warps per tile there (rows of at least 8 groups). Measured against four warps with two or
  // four stages (H200): within run-to-run noise on the 4096-row
  // shapes (4096x11008 3 bits batch 1: 14.3-14.6 us against 15.0 / 14.7), so the gain is small; elsewhere four
  // warps, two stages (four stages no faster on any of the seven 7B..70B shapes).
  // Batch 5..8 at 2..3 bits on matrices of at least 8192 x 8192: eight warps as well (one CTA of 183 KB per SM where
  // four warps ran two of 92 KB). H200, 3 bits batch 8 (forced both ways in one run): 57344x8192 93.6 against 111.0 us, 28672x8192 50.3 against 55.2, 10240x8192 23.1 against 25.0,
  // 8192x28672 47.5 against 49.7; Llama-2-70B 3-bit decode batch 8 455.4 -> 485.5 tok/s, while 4 bits (larger
  // stages) went 332.8 -> 326.6 and keeps four warps; at batch 1 four warps measured as fast or faster (28672x8192
  // 36.4-37.5 against 37.8 us).
  // 4 bits at batch 1 on rows of at most 4096 inputs: three ring stages (two items of every warp loaded before the PDL
  // wait, while the norm or attention and the activation kernel before it run). H200, Llama-2-7B decode, runs of one
  // binary alternated (docs/PERF.md): 4-bit 328.7 / 328.8 tok/s with two stages on every matrix, 342.3 / 340.5 with
  // three, 342.3 / 343.6 with four; at 2 and 3 bits three stages were slower (3-bit 540.3 -> 507.8, 2-bit 600.4 ->
  // 583.1), and on Llama-2-70B (rows of 8192 and 28672) too: 4-bit 51.2 -> 44.3, 3-bit with four stages 92.5 -> 82.1.
  // Three stages at 4 bits on Llama-2-7B's down projection (4096 x 11008, 256 tiles) as well, 369.1 / 369.1 -> 372.5 /
  // 372.2 tok/s (LOWBIT_I8_STAGES=3, which also set 2..3 bits, slower there); 2 bits there too: Llama-2-7B 655.4 /
  // 653.8 -> 665.4 / 664.2, Llama-3-8B 541.8 / 541.9 -> 544.8 / 544.8, while 3 bits lost (562.6 / 562.5 -> 552.8 /
  // 552.8) and keep two stages.
  // Balance: a grid of 4-warp CTAs takes whole tiles, so where the tiles are few per CTA the busiest warp can run a
  // third more items than the average (Llama-2-7B q/k/v, 768 tiles of 8 groups on 528 CTAs: 4 items where the mean is
  // 2.9; SwiGLU's gate/up pairs: 8 where it is 5.2); eight warps per tile where that takes fewer items per warp, at
  // batch 1..2. H200, Llama-2-7B decode, same runs: 3 bits batch 1
  // 552.0-552.4 -> 564.1 tok/s with it, 2 and 4 bits unchanged (their forms do not change or the tiles are balanced);
  // at batch 8 it cost 4 bits 3.4% (2,251-2,265 -> 2,185: eight-warp CTAs of 4-bit stages fit one per SM), so M <= 2.
  const int stages = M == 1 ? i8_stages(B, w.n, w.k) : 2;
  auto items = [&](bool eight_warps) -> int64_t {   // i8_items_per_warp of the form with these stages
    if constexpr (M == 1) {
      if (stages == 3) return eight_warps ? i8_items_per_warp<B, M, 3, 8>(w, fused, sw) : i8_items_per_warp<B, M, 3, 4>(w, fused, sw);
    }
    return eight_warps ? i8_items_per_warp<B, M, 2, 8>(w, fused, sw) : i8_items_per_warp<B, M, 2, 4>(w, fused, sw);
  };
  bool eight = tiles <= 2LL * sms && G >= 8;   // few tiles (above)
  if (!eight && gemv_balance_enabled() && M <= 2 && G >= 8) eight = items(true) < items(false);
  if (stages == 2 && B <= 3 && M == 8 && w.n * w.k >= 8192LL * 8192 && G >= 8) eight = true;
  // Both activation pieces in one mma (kPackPieces) at batch 1..4: faster at 4 bits on every shape measured, and at 2..3
  // bits where the busiest warp has few items, slower where it has many. H200, 3 bits batch 1, runs of one binary
  // alternated, packed / unpacked, us: 12288x4096 (4 items per warp)
  // 13.9-14.4 / 14.6-14.9, 4096x11008 (3) 14.2-14.7 / 14.7-15.2, 28672x8192 (14) 37.1-38.0 / 36.3-36.6, 8192x28672
  // (14) 39.3-40.1 / 36.4-36.5; 4 bits packed 64.1-64.4 / 66.5-66.9 on 28672x8192; Llama-2-7B decode 3 / 4 bits 561.0 /
  // 349.7 tok/s packed everywhere, 549.0 / 342.4 unpacked at batch 1.
  bool pack = M <= 4;
  if (pack && B <= 3) {
    const int mode = i8_pack_mode();
    pack = mode >= 0 ? mode == 1 : items(eight) < 8;
  }
  return {eight ? 8 : 4, stages, pack};
}

template <int B, int M>
void launch_i8_batch(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s, bool fused, uint8_t* xq,
                     const float* xmax, unsigned* hmax_bits) {
  const int64_t G = (w.words + 15) / 16;
  const dim3 xgrid(static_cast<unsigned>((G * 64 + kI8XThreads - 1) / kI8XThreads), static_cast<unsigned>(M));
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  launch_pdl(kPdlXfrag, anyprec_i8_x_kernel, xgrid, kI8XThreads, 0, s, w.k, w.words, x, m, M, vec, xq, xmax);
  const I8Form f = i8_form<B, M>(w, fused, hmax_bits != nullptr);
  if (f.stages == 3) {
    if constexpr (M == 1) {
      if (f.warps == 8) return launch_i8<B, M, 3, 8>(w, x, m, y, s, fused, xq, hmax_bits, f.pack);
      return launch_i8<B, M, 3, 4>(w, x, m, y, s, fused, xq, hmax_bits, f.pack);
    }
  }
  if (f.warps == 8) return launch_i8<B, M, 2, 8>(w, x, m, y, s, fused, xq, hmax_bits, f.pack);
  launch_i8<B, M, 2, 4>(w, x, m, y, s, fused, xq, hmax_bits, f.pack);
}

}  // namespace

int anyprec_i8_cta_warps(const AnyPrecDevice& w, int bits, int m, bool fused, bool swiglu) {
  LOWBIT_CHECK(bits >= 2 && bits <= 4 && anyprec_i8_fits(w.n, w.k, m), "anyprec int8 GEMV: no CTA form for ", w.n, "x", w.k, ", ", bits,
               " bits, batch ", m);
  fused = fused && w.rowptr != nullptr;
  int warps = 0;
  dispatch_int<2, 3, 4>(bits, [&](auto b) {
    dispatch_int<1, 2, 4, 8>(i8_columns(m), [&](auto mm) { warps = i8_form<decltype(b)::value, decltype(mm)::value>(w, fused, swiglu).warps; });
  });
  return warps;
}

size_t anyprec_i8_x_bytes(int64_t k, int m) {
  const int M = i8_columns(m);
  return kI8XHeaderBytes + static_cast<size_t>((k / 32 + 15) / 16) * 1024 * M;
}

void anyprec_gemv_i8(const AnyPrecDevice& w, int bits, const float* x, int m, float* y, cudaStream_t s, bool fused, void* xq,
                     const float* xmax, unsigned* hmax_bits) {
  LOWBIT_CHECK(hmax_bits == nullptr || (w.n % 32 == 0 && w.n > 0), "anyprec int8 GEMV: the SwiGLU epilogue needs gate and up of 16-row tiles (n ",
               w.n, ")");
  LOWBIT_CHECK(bits >= 2 && bits <= 4 && w.lut8[bits] != nullptr && w.lut8_scale[bits] != nullptr,
               "anyprec int8 GEMV: no int8 tables for width ", bits, " (they serve the weight's widths among 2..4)");
  LOWBIT_CHECK(anyprec_i8_fits(w.n, w.k, m) && xq != nullptr, "anyprec int8 GEMV: needs k a multiple of 128 and >= 2048, n * k <= 2^34, batch 1..",
               kMaxGemvBatch, " and an xfrag scratch (asked: ", w.n, "x", w.k, ", batch ", m, ")");
  fused = fused && w.rowptr != nullptr;
  auto* q = static_cast<uint8_t*>(xq);
  auto run = [&](auto b) {
    constexpr int B = decltype(b)::value;
    dispatch_int<1, 2, 4, 8>(i8_columns(m), [&](auto mm) { launch_i8_batch<B, decltype(mm)::value>(w, x, m, y, s, fused, q, xmax, hmax_bits); });
  };
  dispatch_int<2, 3, 4>(bits, run);
}

namespace {
int& i8_pack_state() {   // from the knob on first use; tests and benchmarks override it
  static int mode = [] {
    const int64_t v = knob_int(Knob::I8Pack);
    return v == 0 || v == 1 ? static_cast<int>(v) : -1;
  }();
  return mode;
}
bool& gemv_balance_state() {
  static bool on = knob_bool(Knob::GemvBalance);
  return on;
}
}  // namespace

bool gemv_balance_enabled() { return gemv_balance_state(); }
int i8_pack_mode() { return i8_pack_state(); }
void set_i8_pack_mode(int mode) { i8_pack_state() = mode < 0 ? -1 : mode > 0 ? 1 : 0; }
void set_gemv_balance(bool on) { gemv_balance_state() = on; }

}  // namespace lowbit::cuda
