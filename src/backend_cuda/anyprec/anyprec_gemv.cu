// The any-precision bitplane GEMV (Park et al., ICML 2024, sec. 5), written for Hopper's bandwidth.
//
// One warp computes kRows output rows over the whole input width; lane t of the warp owns word t of every
// 32-word tile of a plane row (one coalesced 128-byte load per plane and row), i.e. columns 8t..8t+7 of each of
// the tile's four quarters (docs/formats/anyprec.md), so its activations are two 16-byte loads per quarter and batch
// row, shared by the kRows rows. Only planes 0..b-1 are read: the width is a run-time argument, the same planes
// serve every width.
//
// Bit transpose, SIMD within a register (transpose_slot): for column slot i (0..7) of every byte, plane j's word is
// funnel-shifted so that bit i of each byte lands on bit b-1-j and merged under the mask 0x01010101 << (b-1-j) by
// one LOP3: each byte then holds its column's b-bit code, four codes from 2b operations.
//
// Centroid lookup: the row's LUT is expanded into shared memory as kCopies interleaved copies, entry e of copy c at
// word e * kCopies + c, and lane l reads copy l % kCopies; the lookup is PRMT (the byte) + one IMAD (its shared
// address) + LDS + FFMA per weight at batch 1. With 32 copies (b <= 5) the 32 lanes of a lookup hit 32
// different banks whatever their codes: one shared-memory wavefront per warp-wide lookup. A single table of 2^b
// words (the obvious layout) takes 4-5 wavefronts per lookup on random codes and makes the kernel bank-conflict
// bound (115 us for 3 bits at 28672x8192 on the H200). Wider tables keep 4 KB per row: 16, 8, 4 copies for 6, 7,
// 8 bits (2-way or so conflicts). Accumulation is fp32.
//
// Sparse outliers replace the table value at their (row, column): fused, the warp adds (val - lut[code]) * x for
// its rows' CSR entries (the code re-read from the planes); or a separate SpMV kernel does the same afterwards.
//
// Measured and not kept (docs/PERF.md, "Designs measured and not kept"): the paper's merged lookup of centroid pairs
// (one 64-bit lookup per two weights at 3 and 4 bits) took 0.4-0.85x the plain lookups' speed (H100); activations
// rounded to fp16 instead of hi + lo in the register-table kernels made the kernels 6-14% faster on 70B-class shapes
// but Llama-2-7B / Llama-3-8B decode 3% slower (H100).
#include <algorithm>

#include "core/knobs.h"
#include "backend_cuda/anyprec/anyprec_codes.cuh"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/common/mma.cuh"
#include "backend_cuda/dispatch/packed.h"
#include "backend_cuda/common/stream.cuh"

namespace lowbit::cuda {
namespace {

constexpr int kWarps = 4;

static_assert(kXtColumns == kMaxGemvBatch, "the transposed x copy holds every batch column of a GEMV");
// The xfrag scratch (anyprec_xfrag_bytes): the fragments, then x transposed [k, kXtColumns] at xfrag_xt.
size_t xfrag_part_bytes(int64_t k) { return static_cast<size_t>(4 * (((k + 31) / 32 + 15) / 16)) * 8 * 32 * sizeof(uint4); }
float* xfrag_xt(const void* xfrag, int64_t k) {
  return xfrag == nullptr ? nullptr : reinterpret_cast<float*>(static_cast<char*>(const_cast<void*>(xfrag)) + xfrag_part_bytes(k));
}

template <int B>
struct Table {
  static constexpr int kEntries = 1 << B;
  static constexpr int kCopies = B <= 5 ? 32 : 1024 >> B;        // 4 KB per row at most
  static constexpr int kFloats = kEntries * kCopies;
  static constexpr int kRowsMax = B <= 4 ? 4 : 2;                // rows per warp: x loads shared by the rows
};

// Eight consecutive activations from column c (a multiple of 8), zero past k.
__device__ __forceinline__ void load_x8(const float* __restrict__ xr, int64_t c, int64_t k, bool vec, float (&v)[8]) {
  if (vec && c + 8 <= k) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(xr + c));
    const float4 b = __ldg(reinterpret_cast<const float4*>(xr + c + 4));
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = c + i < k ? __ldg(xr + c + i) : 0.0f;
  }
}

// The fused outlier entries (add_outlier_partials, store_tc_fragments): entry e of `row` adds (val - lut[code]) * x[c],
// the code re-read from the planes.
template <int B>
struct OutlierEntry {
  AnyPrecDevice w;   // by value (a kernel parameter's copy in registers, not a reference to parameter space)
  const __half* lut;
  __device__ __forceinline__ float operator()(int64_t row, int64_t e, int64_t& xcol) const {
    const int64_t c = __ldg(w.col + e);
    xcol = c;
    return __half2float(w.val[e]) - __half2float(lut[row * (1 << B) + code_at<B>(w, row, c)]);
  }
};

template <int B, int M, bool kFusedOutliers, int kRows>
__global__ void __launch_bounds__(kWarps * 32) anyprec_gemv_kernel(AnyPrecDevice w, const float* __restrict__ x,
                                                                   float* __restrict__ y) {
  using T = Table<B>;
  extern __shared__ float smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= w.n) {   // the warp leaves as a whole; nothing below synchronises the block
    pdl_wait();
    return;
  }
  const int64_t n = w.n, k = w.k, W = w.words;
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min_i64(row0 + r, n - 1);   // a missing last row recomputes row n-1, unstored

  // Per-row tables, kCopies interleaved copies; this lane reads copy lane % kCopies. my_tab: the byte address of this
  // lane's copy of row r's entry 0 (+ r * kRowBytes); entry e is e * kStride bytes further.
  const __half* lut = w.lut[B];
  constexpr uint32_t kStride = 4u * T::kCopies;
  constexpr uint32_t kRowBytes = 4u * T::kFloats;
  float* tab = smem + static_cast<int64_t>(warp) * kRows * T::kFloats;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const __half* l = lut + rows[r] * (1 << B);
    for (int i = lane; i < T::kFloats; i += 32) tab[r * T::kFloats + i] = __half2float(l[i / T::kCopies]);
  }
  const uint32_t my_tab = static_cast<uint32_t>(__cvta_generic_to_shared(tab)) + 4u * (lane % T::kCopies);
  __syncwarp();
  pdl_wait();   // the tables came from the weights; x and y belong to the kernels before

  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  const bool vec = (k % 4) == 0;
  const int64_t plane_stride = n * W;

  for (int64_t t0 = 0; t0 < W; t0 += 32) {
    const int nw = static_cast<int>(min_i64(32, W - t0));
    if (lane >= nw) continue;
    uint32_t p[kRows][B];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int j = 0; j < B; ++j) p[r][j] = __ldg(w.plane_data + j * plane_stride + rows[r] * W + t0 + lane);
    // Codes of all four quarters at once, one byte per quarter: idx[r][i] byte u = code of column i of quarter u.
    uint32_t idx[kRows][8];
#pragma unroll
    for (int r = 0; r < kRows; ++r) transpose_codes<B>(p[r], idx[r]);
    const int64_t col0 = t0 * 32;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t c = col0 + static_cast<int64_t>(u) * 8 * nw + 8 * lane;
      float xv[M][8];
#pragma unroll
      for (int m = 0; m < M; ++m) load_x8(x + m * k, c, k, vec, xv[m]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint32_t tr = my_tab + static_cast<uint32_t>(r) * kRowBytes;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float wv = lds_f32(tr + __byte_perm(idx[r][i], 0u, 0x4440u + static_cast<uint32_t>(u)) * kStride);
#pragma unroll
          for (int m = 0; m < M; ++m) acc[r][m] = fmaf(xv[m][i], wv, acc[r][m]);
        }
      }
    }
  }

  pdl_launch_dependents();   // late: dependents launched earlier would sit in pdl_wait() holding SM slots
  if constexpr (kFusedOutliers) {
    if (w.rowptr != nullptr) add_outlier_partials<kRows, M>(w.rowptr, row0, n, OutlierX{x, w.k, 1}, M, lane, OutlierEntry<B>{w, w.lut[B]}, acc);
  }
  store_warp_sums<kRows, M>(acc, lane, row0, n, y);
}

// One lane's share of a row's outlier correction (lut: the width's LUTs, w.lut[B]) for one activation row xr: (val - lut[code]) * x over the row's
// CSR entries lane, lane + 32, ... (the code re-read from the planes). The warp sums the lanes.
template <int B>
__device__ __forceinline__ float outlier_lane_sum(const AnyPrecDevice& w, const __half* lut, int64_t row,
                                                  const float* __restrict__ xr, int lane) {
  const OutlierEntry<B> entry{w, lut};
  float v = 0.0f;
  for (int e = __ldg(w.rowptr + row) + lane; e < __ldg(w.rowptr + row + 1); e += 32) {
    int64_t c;
    const float coef = entry(row, e, c);
    v = fmaf(coef, __ldg(xr + c), v);
  }
  return v;
}

// The separate outlier pass: one warp per row adds (val - lut[code]) * x over the row's CSR entries.
template <int B>
__global__ void anyprec_outliers_kernel(AnyPrecDevice w, const float* __restrict__ x, int m_total, float* __restrict__ y) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= w.n) return;
  for (int m = 0; m < m_total; ++m) {
    float v = outlier_lane_sum<B>(w, w.lut[B], row, x + m * w.k, lane);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) y[m * w.n + row] += v;
  }
}

// One thread per (row, word): the word's 32 columns are 8 consecutive columns in each quarter, written as one
// 16-byte store per quarter (coalesced across the warp) when the row allows it.
template <int B>
__global__ void anyprec_dequant_kernel(AnyPrecDevice w, __half* __restrict__ out) {
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gid >= w.n * w.words) return;
  const int64_t row = gid / w.words, word = gid % w.words;
  const int64_t tile = word / 32, t = word % 32, nw = min_i64(32, w.words - tile * 32);
  uint32_t p[B];
#pragma unroll
  for (int j = 0; j < B; ++j) p[j] = w.plane_data[(j * w.n + row) * w.words + word];
  uint32_t idx[8];   // byte u of idx[i]: the code of bit 8u + i
  transpose_codes<B>(p, idx);
  const __half* l = w.lut[B] + row * (1 << B);
  __half* o = out + row * w.k;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t c = tile * 1024 + u * 8 * nw + 8 * t;
    alignas(16) __half v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = l[__byte_perm(idx[i], 0u, 0x4440u + static_cast<uint32_t>(u))];
    if (w.k % 8 == 0 && c + 8 <= w.k) {
      *reinterpret_cast<uint4*>(o + c) = *reinterpret_cast<const uint4*>(v);
    } else {
      for (int i = 0; i < 8; ++i)
        if (c + i < w.k) o[c + i] = v[i];
    }
  }
}

__global__ void anyprec_dequant_outliers_kernel(AnyPrecDevice w, __half* __restrict__ out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= w.n) return;
  for (int e = w.rowptr[row]; e < w.rowptr[row + 1]; ++e) out[row * w.k + w.col[e]] = w.val[e];
}

template <int B, int M, int R>
void launch_rows(const AnyPrecDevice& w, const float* x, float* y, cudaStream_t s, bool fused) {
  const int64_t rows_per_block = kWarps * R;
  const unsigned grid = static_cast<unsigned>((w.n + rows_per_block - 1) / rows_per_block);
  const size_t smem = sizeof(float) * kWarps * R * Table<B>::kFloats;
  auto kern = fused ? anyprec_gemv_kernel<B, M, true, R> : anyprec_gemv_kernel<B, M, false, R>;
  if (smem > 48 * 1024) LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  launch_pdl(kPdlScalar, kern, grid, kWarps * 32, smem, s, w, x, y);
}

template <int B, int M>
void launch_gemv(const AnyPrecDevice& w, const float* x, float* y, cudaStream_t s, bool fused) {
  fused = fused && w.rowptr != nullptr;   // without outliers, the instantiation without their code (see launch_tc)
  if constexpr (M <= kNarrowMaxBatch) {
    if (narrow_rows(w.n, w.k, M, B)) return launch_rows<B, M, 1>(w, x, y, s, fused);
  }
  launch_rows<B, M, Table<B>::kRowsMax>(w, x, y, s, fused);
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core path with shared-memory tables (any width when asked; kernel_choice.h takes it at 5..8 bits):
// mma.sync m16n8k16 with A = the rows' fp16 LUT values (exact: the LUTs are stored in fp16) and B = the activations
// split into hi + lo fp16 halves, fp32 accumulation.
//
// A CTA is one block of 16 rows and 4 warps that split the row's word quads between them. Lane (g, t) takes word
// 4q + t of quad q (with kSpan = 1; see kSpan below) from planes 0..b-1 of rows g and g + 8, so a quad of 4 words
// (128 columns) is 8 k16 slabs; in slab j the lane feeds word bits 4j .. 4j+3 (k = 2t, 2t+1, 2t+8, 2t+9), i.e. columns u·8nw + 8w + 4(j&1) + 0..3 of
// its word w, quarter u = j/2: one 16-byte activation load per slab and batch column. Codes are built four quarters
// at a time as in the CUDA-core kernel. The LUTs of the 16 rows sit in shared memory as 32-bit words at
// (e·8 + g)·4 + t, entry e of row g in the low half and of row g + 8 in the high half (the merging PRMT takes one or
// the other), so a warp-wide lookup reads 32 different banks, and a CTA's tables take 2^b · 128 bytes (32 KB at
// 8 bits; one fp16 per 32-bit word takes twice that and holds 8-bit CTAs to 3 per SM).
constexpr int kTcWarps = 4;

// The activations of every (quad, slab, lane) as the lane feeds them to mma_split: {b0 hi, b1 hi, b0 lo, b1 lo}, zero
// past k; written only for the lanes of batch columns < m (g < m), the only ones the GEMVs read. One thread per
// entry; the GEMV then reads one 16-byte word per slab instead of loading, bounds-checking and splitting four floats
// (the pre-split path). The entries also write x transposed into xt [k, kXtColumns] (the fused outliers' gathers).
// Slab order: kNibble = false, slab sj takes word bits 4 sj + q (the LDS-table kernel); kNibble = true, slab
// sj = 2 s + h takes bits 16 h + 4 q + s (the register-table kernel), q = 0..3 the k slot (2t, 2t+1, 2t+8, 2t+9).
// Quad qi, lane t: word 4 kSpan (qi / kSpan) + kSpan t + qi % kSpan of the row (kSpan = 1: word 4 qi + t; kSpan = 2: the
// shared-table kernel's 8-byte loads; kSpan = 4:
// each lane reads 4 consecutive words, a group of 16 words being 4 quads).
// kTwoTiles (batch 9..16, the register-table kernel's two-tile form): every lane's entry holds x rounded to fp16 for
// two batch columns, {b0, b1} of column g and {b0, b1} of column g + 8 (zero for columns >= m), in place of hi / lo.
template <bool kNibble, int kSpan, bool kTwoTiles = false>
__global__ void anyprec_xfrag_kernel(AnyPrecDevice w, const float* __restrict__ x, int m_total, uint4* __restrict__ out,
                                     int64_t quads, float* __restrict__ xt) {
  pdl_launch_dependents();
  pdl_wait();
  const int lanes = kTwoTiles ? 32 : 4 * m_total;   // lane = 4 g + t, g < m
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= quads * 8 * lanes) return;
  const int lane = static_cast<int>(id % lanes), sj = static_cast<int>((id / lanes) % 8);
  const int64_t qi = id / (8 * lanes), k = w.k;
  const int g = lane / 4, t = lane % 4;
  const int64_t word = 4 * kSpan * (qi / kSpan) + kSpan * t + qi % kSpan, T = word / 32;
  const int nw = static_cast<int>(min_i64(32, w.words - 32 * T));
  const int wt = static_cast<int>(word % 32);
  float xv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xv2[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // xv2: column g + 8 (kTwoTiles)
  if (word < w.words) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int bit = kNibble ? 16 * (sj % 2) + 4 * q + sj / 2 : 4 * sj + q;
      const int64_t c = 1024 * T + static_cast<int64_t>(bit / 8) * 8 * nw + 8 * wt + bit % 8;
      if constexpr (kTwoTiles) {
        xv[q] = c < k && g < m_total ? x[static_cast<int64_t>(g) * k + c] : 0.0f;
        xv2[q] = c < k && g + 8 < m_total ? x[static_cast<int64_t>(g + 8) * k + c] : 0.0f;
      } else {
        xv[q] = c < k ? x[static_cast<int64_t>(g) * k + c] : 0.0f;
        if (xt != nullptr && c < k) xt[c * kXtColumns + g] = xv[q];   // the outlier gathers' copy (OutlierX): each column once
      }
    }
  }
  uint4 v;
  if constexpr (kTwoTiles) {
    v = make_uint4(half2_bits(__floats2half2_rn(xv[0], xv[1])), half2_bits(__floats2half2_rn(xv[2], xv[3])),
                   half2_bits(__floats2half2_rn(xv2[0], xv2[1])), half2_bits(__floats2half2_rn(xv2[2], xv2[3])));
  } else {
    split_pair(xv[0], xv[1], v.x, v.z);
    split_pair(xv[2], xv[3], v.y, v.w);
  }
  out[(qi * 8 + sj) * 32 + lane] = v;
}

// The shared-table tensor-core kernels' A fragments of one plane word per row (p0 / p1: the word of planes 0..B-1 of
// rows g / g + 8), slab by slab: mma(a, sj) for slab sj = 0..7 (shared_table_fragment, anyprec_codes.cuh).
template <int B, typename Mma>
__device__ __forceinline__ void shared_table_slabs(uint32_t t0, const uint32_t (&p0)[B], const uint32_t (&p1)[B], Mma mma) {
  uint32_t i0[8], i1[8];   // byte u of iX[i] = code of bit 8u + i
  transpose_codes<B>(p0, i0);
  transpose_codes<B>(p1, i1);
#pragma unroll
  for (int sj = 0; sj < 8; ++sj) {
    uint32_t a[4];
    shared_table_fragment(t0, i0, i1, sj, a);
    mma(a, sj);
  }
}

// kSpan: plane words per lane and load. 1: lane t's word of quad qi is 4 qi + t. 2 (rows of an even number of words,
// x pre-split in anyprec_xfrag_kernel<false, 2> order): words 8 gi + 2t and + 1 of load group gi, quads 2 gi and
// 2 gi + 1, from one 8-byte load. ncu (H200, 8 bits, 28672x8192, batch 1, kSpan 1): L1/TEX 87% busy with
// conflict-free table lookups. By our count (not ncu's per-instruction figures) a warp's 4-byte
// plane load touches 8 rows' lines, about 8 wavefronts, which per quad outnumber the 64 lookups; kSpan 2 halves them.
// kPrefetch = false: no register double buffer (the group's planes loaded at its start): fewer registers, more CTAs.
// kTwoTiles: batch 9..16 (anyprec_gemv_two_tiles), x entries of columns g and g + 8 in fp16 in place of hi / lo (as
// the register-table kernel's two-tile form), the second mma into the second tile's accumulators; outliers apart.
template <int B, bool kFusedOutliers, bool kPreSplit, int kSpan = 1, bool kPrefetch = true, bool kTwoTiles = false>
__global__ void __launch_bounds__(kTcWarps * 32) anyprec_gemv_tc_kernel(AnyPrecDevice w, const float* __restrict__ x,
                                                                        int m_total, float* __restrict__ y,
                                                                        const uint4* __restrict__ xfrag,
                                                                        const float* __restrict__ xt) {   // x transposed (OutlierX)
  extern __shared__ uint32_t tabs[];   // [2^B][8][4]: rows g (low half) and g + 8 (high half)
  const int64_t n = w.n, k = w.k, W = w.words;
  const TcTile tile(n);
  const int warp = tile.warp, lane = tile.lane, g = tile.g, t = tile.t;
  const int64_t row0 = tile.row0, r0 = tile.r0, r1 = tile.r1;
  const __half* lut = w.lut[B];
  constexpr int E = 1 << B;
  for (int q = static_cast<int>(threadIdx.x); q < E * 32; q += kTcWarps * 32) {
    const int l = q % 32, e = q / 32;
    const int64_t row_lo = min_i64(row0 + l / 4, n - 1), row_hi = min_i64(row0 + l / 4 + 8, n - 1);
    tabs[q] = static_cast<uint32_t>(__half_as_ushort(lut[row_lo * E + e])) | static_cast<uint32_t>(__half_as_ushort(lut[row_hi * E + e])) << 16;
  }
  __syncthreads();
  pdl_wait();   // the tables came from the weights; x, xfrag and y belong to the kernels before
  const uint32_t t0 = static_cast<uint32_t>(__cvta_generic_to_shared(tabs)) + 4u * lane;   // entry e at t0 + 128 e
  const bool col_ok = g < m_total;
  const float* xg = x + static_cast<int64_t>(col_ok ? g : 0) * k;
  const bool vec = (k % 4) == 0;
  const int64_t plane_stride = n * W;
  static_assert(kSpan == 1 || kSpan == 2, "one or two plane words per lane and load");
  const int64_t groups = (W + 4 * kSpan - 1) / (4 * kSpan);   // load groups of kSpan quads
  static_assert(!kTwoTiles || (kPreSplit && !kFusedOutliers), "two tiles: pre-split fp16 x of two columns, outliers apart");
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc_b[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // acc_b: columns 8..15 (kTwoTiles)
  // The lane's plane words of load group gi (zero past the row or past the last group). The next group's are loaded
  // while this one is computed (register double buffer): without it every quad waited a DRAM round trip, and at 8
  // bits (32 KB of tables per CTA) too few warps share an SM to hide it.
  auto load_planes = [&](int64_t gi, uint32_t (&p0)[B][kSpan], uint32_t (&p1)[B][kSpan]) {
    const int64_t word = 4 * kSpan * gi + kSpan * t;
    const bool ok = gi < groups && word < W;   // kSpan 2: W even, so word + 1 < W too
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const uint32_t* q0 = w.plane_data + j * plane_stride + r0 * W + (ok ? word : 0);
      const uint32_t* q1 = w.plane_data + j * plane_stride + r1 * W + (ok ? word : 0);
      if constexpr (kSpan == 2) {
        const uint2 v0 = ok ? __ldg(reinterpret_cast<const uint2*>(q0)) : make_uint2(0u, 0u);
        const uint2 v1 = ok ? __ldg(reinterpret_cast<const uint2*>(q1)) : make_uint2(0u, 0u);
        p0[j][0] = v0.x; p0[j][1] = v0.y; p1[j][0] = v1.x; p1[j][1] = v1.y;
      } else {
        p0[j][0] = ok ? __ldg(q0) : 0u;
        p1[j][0] = ok ? __ldg(q1) : 0u;
      }
    }
  };
  uint32_t pg0[B][kSpan], pg1[B][kSpan];
  if constexpr (kPrefetch) load_planes(warp, pg0, pg1);

  for (int64_t gi = warp; gi < groups; gi += kTcWarps) {
    uint32_t n0[B][kSpan], n1[B][kSpan];
    if constexpr (kPrefetch) load_planes(gi + kTcWarps, n0, n1);
    else load_planes(gi, pg0, pg1);
#pragma unroll
    for (int e = 0; e < kSpan; ++e) {
      const int64_t qi = kSpan * gi + e;
      const int64_t word = 4 * kSpan * gi + kSpan * t + e;
      const int64_t T = word / 32;   // a group's words lie in one 32-word tile
      const int nw = static_cast<int>(min_i64(32, W - 32 * T));
      const int wt = static_cast<int>(word % 32);   // word within the tile
      const bool word_ok = word < W;
      uint32_t p0[B], p1[B];
#pragma unroll
      for (int j = 0; j < B; ++j) { p0[j] = pg0[j][e]; p1[j] = pg1[j][e]; }
      shared_table_slabs<B>(t0, p0, p1, [&](const uint32_t (&a)[4], int sj) {
        if constexpr (kPreSplit) {
          // Lanes of batch columns >= m read column 0's fragment (written; a broadcast): their outputs are not stored.
          const uint4 xb = __ldg(xfrag + (qi * 8 + sj) * 32 + (col_ok ? lane : t));
          mma_16816(acc, a, xb.x, xb.y);                           // hi halves (kTwoTiles: column g)
          mma_16816(kTwoTiles ? acc_b : acc, a, xb.z, xb.w);   // lo halves (kTwoTiles: column g + 8)
        } else {
          float xv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if (col_ok && word_ok) {
            const int u = sj / 2, ib = (sj % 2) * 4;   // the slab's quarter and its first code bit within the byte column
            const int64_t c = 1024 * T + static_cast<int64_t>(u) * 8 * nw + 8 * wt + ib;
            if (vec && c + 4 <= k) {
              const float4 v = __ldg(reinterpret_cast<const float4*>(xg + c));
              xv[0] = v.x; xv[1] = v.y; xv[2] = v.z; xv[3] = v.w;
            } else {
#pragma unroll
              for (int q = 0; q < 4; ++q) xv[q] = c + q < k ? __ldg(xg + c + q) : 0.0f;
            }
          }
          mma_split(acc, a, xv[0], xv[1], xv[2], xv[3]);
        }
      });
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int j = 0; j < B; ++j)
#pragma unroll
        for (int e = 0; e < kSpan; ++e) { pg0[j][e] = n0[j][e]; pg1[j][e] = n1[j][e]; }
    }
  }

  pdl_launch_dependents();   // late: dependents launched earlier would sit in pdl_wait() holding SM slots
  if constexpr (kTwoTiles) {
    store_tc_fragments<kTcWarps, false>(acc, warp, lane, row0, n, m_total < 8 ? m_total : 8, nullptr, OutlierX{}, y,
                                        OutlierEntry<B>{w, lut}, 0);
    store_tc_fragments<kTcWarps, false>(acc_b, warp, lane, row0, n, m_total - 8, nullptr, OutlierX{}, y + 8 * n,
                                        OutlierEntry<B>{w, lut}, 1);
  } else {
    store_tc_fragments<kTcWarps, kFusedOutliers>(acc, warp, lane, row0, n, m_total, w.rowptr,
                                                 kPreSplit ? OutlierX{xt, 1, kXtColumns} : OutlierX{x, k, 1}, y, OutlierEntry<B>{w, lut});
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Register-table tensor-core path, 2..4 bits (GemvPath::TensorCoreRegisterLut; x pre-split; the tables, selectors
// and lookups are in anyprec_codes.cuh, shared with the fused GEMM). The shared-memory
// lookups of the kernel above cost one LDS per weight: 32 weights per clock per SM, about the 85%-of-bandwidth time
// of a 3-bit GEMV by themselves. Here a row's 2^b fp16 centroids sit in registers of the lane (RegTable: the low bytes
// of entries 0-3, 4-7, ... and their high bytes) and PRMT looks up four codes at once: a selector whose four nibbles
// are 3-bit codes picks their four low bytes in one PRMT and their high bytes in a second; two more interleave them
// into the two half2 A registers (k slots 2t, 2t+1 and 2t+8, 2t+9). One ALU op per weight, no shared memory. Codes
// are built eight at a time, one per nibble (transpose_slot with the nibble mask: bit s of each nibble), and slab
// (s, h) of a word is its bits 16h + 4q + s, so the selector of slab (s, h) is codes word s shifted by 16h.
// 4 bits: PRMT selects among 8 bytes, so the 16 entries are two tables of 8 (entries 0-7 and 8-15), both looked up
// with the low 3 bits of the codes (planes 1..3), and a third PRMT per byte kind merges them under a selector whose
// nibble i is i + 4 * (code i's plane-0 bit): 8 ops per four weights against 4.
// The selectors' nibbles are codes of <= 3 bits: bit 3 of a nibble, PRMT's sign-replicate flag, is always 0. The
// table loads below are 32 / 16 / 8 bytes per row: each LUT part is its own cudaMalloc buffer (DevicePackedWeight),
// so rows of 2^B halves stay aligned.
// The A fragments of one word quad (w0 / w1: the lane's word of planes 0..B-1 for rows g / g + 8), slab by slab:
// mma(a, s, h) for slab (s, h), s = 0..3 the code bit of each nibble, h = 0..1 the half-word (x fragment 2s + h).
template <int B, typename Mma>
__device__ __forceinline__ void register_table_slabs(const RegTable<B>& t0, const RegTable<B>& t1, const uint32_t (&w0)[B],
                                                     const uint32_t (&w1)[B], Mma mma) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t v0, m0, v1, m1;
    register_selectors<B>(w0, s, v0, m0);
    register_selectors<B>(w1, s, v1, m1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t a[4];
      register_lookup<B>(t0, h ? v0 >> 16 : v0, h ? m0 >> 16 : m0, a[0], a[2]);   // row g
      register_lookup<B>(t1, h ? v1 >> 16 : v1, h ? m1 >> 16 : m1, a[1], a[3]);   // row g + 8
      mma(a, s, h);
    }
  }
}

// The plane words of a register-table lane (rows r0 = g and r1 = g + 8 of its tile, lane t of the group), a group of
// 4 kSpan words per row at a time. kSpan = 4 (rows of a multiple of 4 words): lane t reads words 16 gi + 4t .. +3 of
// each plane as one 16-byte load, 64 contiguous bytes per row and plane per warp; kSpan = 1: word 4 gi + t (16 bytes
// per row and plane). Words past the row read as 0.
template <int B, int kSpan>
struct PlaneGroups {
  static_assert(kSpan == 1 || kSpan == 4, "one or four words per lane and load");
  static constexpr int kGroupWords = 4 * kSpan;
  const uint32_t* pl0[B];   // plane j, row r0, this lane's first word
  const uint32_t* pl1[B];   // row r1
  int64_t W, groups;
  int t;
  __device__ __forceinline__ PlaneGroups(const AnyPrecDevice& w, int64_t r0, int64_t r1, int lane_t)
      : W(w.words), groups((w.words + kGroupWords - 1) / kGroupWords), t(lane_t) {
#pragma unroll
    for (int j = 0; j < B; ++j) {
      pl0[j] = w.plane_data + (j * w.n + r0) * W + kSpan * t;
      pl1[j] = w.plane_data + (j * w.n + r1) * W + kSpan * t;
    }
  }
  __device__ __forceinline__ void load(int64_t gi, uint32_t (&p0)[B][kSpan], uint32_t (&p1)[B][kSpan]) const {
    const bool ok = kGroupWords * gi + kSpan * t < W;   // kSpan = 4: W % 4 == 0, a lane's 4 words are all in or all out
#pragma unroll
    for (int j = 0; j < B; ++j) {
      if constexpr (kSpan == 4) {
        const uint4 u0 = ok ? __ldg(reinterpret_cast<const uint4*>(pl0[j] + 16 * gi)) : make_uint4(0u, 0u, 0u, 0u);
        const uint4 u1 = ok ? __ldg(reinterpret_cast<const uint4*>(pl1[j] + 16 * gi)) : make_uint4(0u, 0u, 0u, 0u);
        p0[j][0] = u0.x; p0[j][1] = u0.y; p0[j][2] = u0.z; p0[j][3] = u0.w;
        p1[j][0] = u1.x; p1[j][1] = u1.y; p1[j][2] = u1.z; p1[j][3] = u1.w;
      } else {
        p0[j][0] = ok ? __ldg(pl0[j] + 4 * gi) : 0u;
        p1[j][0] = ok ? __ldg(pl1[j] + 4 * gi) : 0u;
      }
    }
  }
};

// kSpan: PlaneGroups. kCompact: the x fragments loaded at the start of each quad instead of a quad ahead, registers capped for four CTAs
// per SM (three otherwise): for grids that then fit one wave (measured, 3 bits 8192x28672 batch 1 / 8: 66.1 / 73.2
// against 75.1 / 94.5 us; the default is faster where both run the same number of waves: 4096x4096 12.4 against 13.2).
// (minimum blocks 0 = no register constraint: the compiler's choice, 142 registers at 3 bits)
// kTwoTiles: batch 9..16 (anyprec_gemv_two_tiles): the x entries hold columns g and g + 8 rounded to fp16 (xfrag
// kernel's kTwoTiles form), so the second mma of each A fragment computes the second 8-column tile instead of the lo
// halves: the work of a batch-8 call, for twice the columns. Outliers run as the separate CSR pass.
template <int B, bool kFusedOutliers, int kSpan, bool kCompact = false, bool kTwoTiles = false>
__global__ void __launch_bounds__(kTcWarps * 32, kCompact ? (B == 4 ? 3 : 4) : 0) anyprec_gemv_reglut_kernel(AnyPrecDevice w, const float* __restrict__ x,
                                                                            int m_total, float* __restrict__ y,
                                                                            const uint4* __restrict__ xfrag,
                                                                            const float* __restrict__ xt) {   // x transposed (OutlierX)
  static_assert(!kTwoTiles || !kFusedOutliers, "two tiles: fp16 x entries of two columns, outliers apart");
  const int64_t n = w.n;
  const TcTile tile(n);
  const int warp = tile.warp, lane = tile.lane, g = tile.g, t = tile.t;
  const int64_t row0 = tile.row0, r0 = tile.r0, r1 = tile.r1;
  constexpr int E = 1 << B;
  const __half* lut = w.lut[B];
  RegTable<B> tab0, tab1;
  load_register_table<B>(lut + r0 * E, tab0);
  load_register_table<B>(lut + r1 * E, tab1);
  const PlaneGroups<B, kSpan> planes(w, r0, r1, t);
  const int64_t groups = planes.groups;
  // Lanes of batch columns >= m read column 0's fragments (a broadcast, no extra traffic): their outputs are not stored.
  // The x fragments of the next quad are loaded while this one is computed; four accumulator sets (slab half h x
  // hi / lo) keep four mma chains independent (one chain waited on each mma's latency, 16 deep per quad).
  const uint4* xq = xfrag + (g < m_total ? lane : t);
  const int64_t last_quad = kSpan * groups - 1;
  auto load_x = [&](int64_t qi, uint4 (&xb)[8]) {
    qi = min_i64(qi, last_quad);
#pragma unroll
    for (int sj = 0; sj < 8; ++sj) xb[sj] = __ldg(reinterpret_cast<const uint4*>(xq + (qi * 8 + sj) * 32));
  };
  float acc4[4][4] = {};
  uint32_t p0[B][kSpan], p1[B][kSpan];
  planes.load(warp, p0, p1);
  pdl_wait();   // the tables and the first planes came from the weights; xfrag and y belong to the kernels before
  uint4 xb[8];
  if (!kCompact) load_x(kSpan * warp, xb);
  for (int64_t gi = warp; gi < groups; gi += kTcWarps) {
    uint32_t n0[B][kSpan], n1[B][kSpan];   // the next group's planes, in flight while this one is computed
    planes.load(gi + kTcWarps, n0, n1);
#pragma unroll
    for (int e = 0; e < kSpan; ++e) {
      // This quad's x fragments are in xb (anyprec_xfrag_kernel<true, kSpan> order); fetch the next quad's.
      uint4 xn[8];
      if constexpr (kCompact) load_x(kSpan * gi + e, xb);
      else load_x(e + 1 < kSpan ? kSpan * gi + e + 1 : kSpan * (gi + kTcWarps), xn);
      uint32_t w0[B], w1[B];
#pragma unroll
      for (int j = 0; j < B; ++j) { w0[j] = p0[j][e]; w1[j] = p1[j][e]; }
      register_table_slabs<B>(tab0, tab1, w0, w1, [&](const uint32_t (&a)[4], int s, int h) {
        const uint4 b = xb[2 * s + h];
        mma_16816(acc4[2 * h], a, b.x, b.y);       // hi halves
        mma_16816(acc4[2 * h + 1], a, b.z, b.w);   // lo halves
      });
      if constexpr (!kCompact) {
#pragma unroll
        for (int sj = 0; sj < 8; ++sj) xb[sj] = xn[sj];
      }
    }
#pragma unroll
    for (int j = 0; j < B; ++j)
#pragma unroll
      for (int e = 0; e < kSpan; ++e) { p0[j][e] = n0[j][e]; p1[j][e] = n1[j][e]; }
  }
  if constexpr (kTwoTiles) {
    float acc_a[4], acc_b[4];   // columns 0..7 (acc4[0], [2]) and 8..15 (acc4[1], [3])
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc_a[i] = acc4[0][i] + acc4[2][i];
      acc_b[i] = acc4[1][i] + acc4[3][i];
    }
    pdl_launch_dependents();
    store_tc_fragments<kTcWarps, false>(acc_a, warp, lane, row0, n, m_total < 8 ? m_total : 8, nullptr, OutlierX{}, y,
                                        OutlierEntry<B>{w, lut}, 0);
    store_tc_fragments<kTcWarps, false>(acc_b, warp, lane, row0, n, m_total - 8, nullptr, OutlierX{}, y + 8 * n,
                                        OutlierEntry<B>{w, lut}, 1);
  } else {
    float acc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = (acc4[0][i] + acc4[1][i]) + (acc4[2][i] + acc4[3][i]);

    pdl_launch_dependents();   // late: dependents launched earlier would sit in pdl_wait() holding SM slots
    store_tc_fragments<kTcWarps, kFusedOutliers>(acc, warp, lane, row0, n, m_total, w.rowptr, OutlierX{xt, 1, kXtColumns}, y,
                                                 OutlierEntry<B>{w, lut});
  }
}

// The register-table kernel instantiation for run-time choices (kCompact only exists with kSpan = 4).
template <int B, bool kFused, bool kTwoTiles = false>
auto reglut_form(int span, bool compact) {
  if (span == 1) return anyprec_gemv_reglut_kernel<B, kFused, 1, false, kTwoTiles>;
  if (compact) return anyprec_gemv_reglut_kernel<B, kFused, 4, true, kTwoTiles>;
  return anyprec_gemv_reglut_kernel<B, kFused, 4, false, kTwoTiles>;
}
template <int B>
auto reglut_kernel(bool fused, int span, bool compact) {
  return fused ? reglut_form<B, true>(span, compact) : reglut_form<B, false>(span, compact);
}
// Grids that fit one wave only at four CTAs per SM run the compact form (2..3 bits, 16-byte plane loads); 4 bits:
// 3 CTAs per SM under the cap (their tables and planes take 16 more registers; 128 spilled 64-112 bytes), so no
// compact form.
template <int B>
bool reglut_compact(int span, unsigned grid) {
  static const int sms = device_sm_count();
  return B <= 3 && span == 4 && grid > 3u * sms && grid <= 4u * sms;
}
// The shared-table kernel's form for pre-split x (launch_tc's plane-load choice): 8-byte plane loads (span 2), without
// the register double buffer on 8-bit matrices of more than 8192 rows; one word per lane otherwise.
template <int B, bool kFused, bool kTwoTiles = false>
auto tc_table_form(int span, int64_t n) {
  if (span == 2 && B == 8 && n > 8192) return anyprec_gemv_tc_kernel<B, kFused, true, 2, false, kTwoTiles>;
  if (span == 2) return anyprec_gemv_tc_kernel<B, kFused, true, 2, true, kTwoTiles>;
  return anyprec_gemv_tc_kernel<B, kFused, true, 1, true, kTwoTiles>;
}
// The separate outlier pass (CSR, any batch) after a dense kernel.
template <int B>
void launch_outliers(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s) {
  launch_pdl(kPdlScalar, anyprec_outliers_kernel<B>, static_cast<unsigned>((w.n + 7) / 8), 256, 0, s, w, x, m, y);
}

// ---------------------------------------------------------------------------------------------------------------
// Streamed register-table path (GemvPath::TensorCoreRegisterLutStream; 2-4 bits, batch 1..2, x pre-split, rows of a
// multiple of 4 words and at least kStreamWarps groups of 16 words). The same decode and mma as the kernel above,
// with the memory side reorganised after ncu's source-level stall sampling of that kernel (3 bits, 28672x8192,
// batch 1, H100): 20% of all warp samples sat on the first use of the planes loaded before the loop. Its CTAs live
// for one 16-row tile, 4 groups per warp at k = 8192 (2 at 4096), so every CTA start pays a DRAM round trip that
// the single group of register prefetch cannot cover; the prefetch buffers (the next group's planes, the next
// quad's x fragments) hold 56 of its 142 registers, three CTAs per SM.
// Here CTAs are persistent (one wave, each looping over tiles blockIdx.x, + gridDim.x, ...), and each warp streams
// its work items (tile, group) through a private ring of kStages shared-memory stages with cp.async: a stage holds
// the group's plane words of the lane's two rows, the tile's 16 LUT rows (read at the tile's first group) and the
// group's pre-split x fragments of the lanes of batch columns < kMX. The copies of item i + kStages - 1 are issued
// before item i is computed, across tile boundaries, so nothing waits on DRAM but the very first item; prefetching
// costs no registers. Lanes read their own plane words back (16-byte LDS, conflict-free) and the x fragments as
// broadcasts. A tile's partial fragments are summed across the CTA's warps as in the kernel above.
constexpr int kStreamWarps = 4;


// kStages: the ring's depth.
template <int B, int kMX, int kStages>
struct StreamStage {
  static constexpr int kPlaneBytes = 2 * B * 32 * 16;      // [row half][plane][lane] uint4
  static constexpr int kLutRowBytes = 2 << B;              // 2^B fp16 centroids
  static constexpr int kLutSlotBytes = kLutRowBytes < 16 ? 16 : kLutRowBytes;
  static constexpr int kLutChunks = kLutSlotBytes / 16;    // 16-byte copies per row
  static constexpr int kLutBytes = 16 * kLutSlotBytes;     // [tile row] slot
  static constexpr int kXEntries = 4 * 8 * 4 * kMX;        // [quad][slab][lane < 4 kMX]
  static constexpr int kXEntryBytes = 16;                  // {b0 hi, b1 hi, b0 lo, b1 lo}
  static constexpr int kBytes = kPlaneBytes + kLutBytes + kXEntryBytes * kXEntries;
  static constexpr int kWarpBytes = kStages * kBytes;
  // The ring's CTAs per SM: 4 at two stages (registers capped at 128; 3 at 4 bits, whose tables and planes take 16
  // more), 2 deeper (the one-wave grids of few tiles).
  static constexpr int kMinBlocks = kStages == 2 ? (B == 4 ? 3 : B == 2 && kMX == 1 ? 5 : 4) : 2;
};

template <int B, bool kFusedOutliers, int kMX, int kStages>
__global__ void __launch_bounds__(kStreamWarps * 32, (StreamStage<B, kMX, kStages>::kMinBlocks)) anyprec_gemv_reglut_stream_kernel(AnyPrecDevice w, const float* __restrict__ x,
                                                                                         int m_total, float* __restrict__ y,
                                                                                         const uint4* __restrict__ xfrag,
                                                                                         const float* __restrict__ xt) {   // x transposed (OutlierX)
  using S = StreamStage<B, kMX, kStages>;
  extern __shared__ __align__(16) unsigned char stream_smem[];
  const int64_t n = w.n, W = w.words, G = (W + 15) / 16, tiles = (n + 15) / 16;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  constexpr int E = 1 << B;
  const __half* lut = w.lut[B];
  // Work items: (tile, group of 16 words).
  StreamRing<kStages, kStreamWarps> ring(static_cast<uint32_t>(__cvta_generic_to_shared(stream_smem)) + warp * S::kWarpBytes,
                                         S::kBytes, tiles, G, warp);
  const PlaneCopy planes(w);
  auto issue_weights = [&] {   // the plane words of the lane's rows and, at a tile's first group, the tile's LUT rows
    const uint32_t st = ring.issue_stage();
    const int64_t it_gi = ring.it_item, row0 = ring.it_tile * 16;
    planes.issue<B>(st, static_cast<uint32_t>(row0), static_cast<uint32_t>(it_gi), g, t, lane);
    if (it_gi == warp && lane < 16 * S::kLutChunks) {   // row lane / chunks, its 16-byte chunk lane % chunks
      const int64_t row = min_i64(row0 + lane / S::kLutChunks, n - 1);
      cp_async(st + S::kPlaneBytes + 16 * lane, lut + row * E + 8 * (lane % S::kLutChunks), S::kLutRowBytes < 16 ? S::kLutRowBytes : 16);
    }
  };
  auto issue_x = [&] {   // the group's x fragments of the lanes < 4 kMX (one stage entry per lane and slab)
    const uint32_t st = ring.issue_stage() + S::kPlaneBytes + S::kLutBytes;
    const int64_t it_gi = ring.it_item;
#pragma unroll
    for (int c = 0; c < S::kXEntries / 32; ++c) {
      const int idx = lane + 32 * c, qs = idx / (4 * kMX), l = idx % (4 * kMX);
      cp_async(st + S::kXEntryBytes * idx, xfrag + (32 * it_gi + qs) * 32 + l, S::kXEntryBytes);
    }
  };
  ring.prologue(issue_weights, issue_x);   // xfrag and y belong to the kernels before
  const int xl = g < m_total ? lane : t;   // lanes of batch columns >= m read column 0's fragments (not stored)
  int buf = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const TcTile tt(n, tile);
    RegTable<B> tab0, tab1;
    float acc4[4][4] = {};
    for (int64_t gi = warp; gi < G; gi += kStreamWarps) {
      const uint32_t st = ring.next(issue_weights, issue_x);
      if (gi == warp) {   // the tile's first group: its tables
        uint32_t l0[2 * RegTable<B>::kWords], l1[2 * RegTable<B>::kWords];
#pragma unroll
        for (int c = 0; c < S::kLutChunks; ++c) {
          uint32_t (&d0)[4] = *reinterpret_cast<uint32_t (*)[4]>(l0 + 4 * c);
          uint32_t (&d1)[4] = *reinterpret_cast<uint32_t (*)[4]>(l1 + 4 * c);
          lds_u32x4(st + S::kPlaneBytes + S::kLutSlotBytes * g + 16 * c, d0);
          lds_u32x4(st + S::kPlaneBytes + S::kLutSlotBytes * (g + 8) + 16 * c, d1);
        }
        register_table_from_words<B>(l0, tab0);
        register_table_from_words<B>(l1, tab1);
      }
      uint32_t p0[B][4], p1[B][4];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        lds_u32x4(st + (j * 32 + lane) * 16, p0[j]);
        lds_u32x4(st + ((B + j) * 32 + lane) * 16, p1[j]);
      }
      const uint32_t xs = st + S::kPlaneBytes + S::kLutBytes + S::kXEntryBytes * xl;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        uint32_t w0[B], w1[B];
#pragma unroll
        for (int j = 0; j < B; ++j) { w0[j] = p0[j][e]; w1[j] = p1[j][e]; }
        register_table_slabs<B>(tab0, tab1, w0, w1, [&](const uint32_t (&a)[4], int s, int h) {
          const uint32_t xa = xs + S::kXEntryBytes * 4 * kMX * (8 * e + 2 * s + h);
          uint32_t b[4];
          lds_u32x4(xa, b);
          mma_16816(acc4[2 * h], a, b[0], b[1]);       // hi halves
          mma_16816(acc4[2 * h + 1], a, b[2], b[3]);   // lo halves
        });
      }
    }
    float acc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = (acc4[0][i] + acc4[1][i]) + (acc4[2][i] + acc4[3][i]);
    if (tile + gridDim.x >= tiles) pdl_launch_dependents();   // the CTA's last tile
    store_tc_fragments<kStreamWarps, kFusedOutliers>(acc, warp, lane, tt.row0, n, m_total, w.rowptr,
                                                     OutlierX{xt, 1, kXtColumns}, y, OutlierEntry<B>{w, lut}, buf);
    buf ^= 1;
  }
  cp_async_wait<0>();   // no copy outlives the CTA
}


template <int B, int kMX, int kStages>
void launch_stream(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s, bool fused, const uint4* xf) {
  const size_t smem = static_cast<size_t>(kStreamWarps) * StreamStage<B, kMX, kStages>::kWarpBytes;
  LOWBIT_CHECK(anyprec_offsets_fit(w.n, w.k), "anyprec streamed GEMV: ", w.n, "x", w.k, " passes the 32-bit plane offsets (n * k <= 2^34)");
  auto kern = fused ? anyprec_gemv_reglut_stream_kernel<B, true, kMX, kStages>
                    : anyprec_gemv_reglut_stream_kernel<B, false, kMX, kStages>;
  launch_pdl(kPdlRegLut, kern, persistent_grid(kern, kStreamWarps * 32, smem, (w.n + 15) / 16), kStreamWarps * 32, smem, s,
             w, x, m, y, xf, static_cast<const float*>(xfrag_xt(xf, w.k)));
}

// ---------------------------------------------------------------------------------------------------------------
// Streamed shared-table path (GemvPath::TensorCoreSharedLutStream; 5..8 bits, batch 1..8, x pre-split in the
// shared-table kernel's span-2 order, k a multiple of 64 and >= 2048). The shared-table kernel above loads its plane
// words straight into registers, 4 or 8 bytes per lane from 8 rows at a time, and at 8 bits those loads outnumber its
// table lookups on L1 (ncu: L1/TEX 87% busy); it ran Llama-2-7B's 8-bit GEMVs at ~1.2 TB/s. Here, as in the streamed
// register-table kernel, persistent CTAs of four warps stream their work items (tile, group of 8 words) through
// per-warp cp.async rings: a stage holds the lane's words 8 gi + 2t, + 1 of planes 0..B-1 for rows g and g + 8 (read
// back with one conflict-free 8-byte LDS per plane and row) and, at batch 1 (kMX = 1), the group's x fragments of the
// lanes of batch column 0 (batch 2..8, kMX = 0: the lanes read their fragments from global memory, where every tile
// reads them again; staged, batch 8's 8 KB a stage would leave one CTA per SM, and at batch 2 staging measured
// slower). The copies of item i + kStages - 1 go out before item i is computed, across tile boundaries. The table of a
// CTA's tile (the [2^B][8][4] layout of shared_table_slabs: 32 KB at 8 bits) is one per CTA: its LUT rows are read
// into registers a tile ahead and written to shared memory between the tile's epilogue barrier and one more barrier.
constexpr int kLutStreamWarps = 4;

template <int B, int kMX, int kStages>
struct LutStreamStage {
  static constexpr int kPlaneBytes = 2 * B * 32 * 8;   // [row half][plane][lane] 8 bytes
  static constexpr int kXEntries = 2 * 8 * 4 * kMX;     // [quad][slab][lane < 4 kMX], 16 bytes each (kMX = 0: none)
  static constexpr int kBytes = kPlaneBytes + 16 * kXEntries;
  static constexpr int kTableBytes = (1 << B) * 128;
  static constexpr int kSmem = kTableBytes + kLutStreamWarps * kStages * kBytes;
  // 8 bits: 32 KB of table + 60 KB of rings, two CTAs per SM; 5..7 bits three.
  static constexpr int kMinBlocks = B == 8 ? 2 : 3;
};

// The 16 LUT rows of a tile in registers (the CTA's thread th holds pairs th, th + 128, ...: pair (g, c) is 16-byte chunk
// c, entries 8c .. 8c + 7, of rows g and g + 8), written to shared memory in the [2^B][8][4] layout: entry e of rows
// g (low half) and g + 8 (high half), the word repeated for the four lanes t.
template <int B>
struct TileLut {
  static constexpr int kChunks = 1 << (B - 3);                               // per row
  static constexpr int kPairs = (8 * kChunks + kLutStreamWarps * 32 - 1) / (kLutStreamWarps * 32);   // per thread
  uint4 lo[kPairs], hi[kPairs];
  __device__ __forceinline__ void load(const __half* __restrict__ lut, int64_t tile, int64_t n) {
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int p = static_cast<int>(threadIdx.x) + kLutStreamWarps * 32 * i, g = p % 8, c = p / 8;
      if (p < 8 * kChunks) {
        const int64_t r0 = min_i64(16 * tile + g, n - 1), r1 = min_i64(16 * tile + g + 8, n - 1);
        lo[i] = __ldg(reinterpret_cast<const uint4*>(lut + (r0 << B)) + c);
        hi[i] = __ldg(reinterpret_cast<const uint4*>(lut + (r1 << B)) + c);
      }
    }
  }
  __device__ __forceinline__ void store(uint32_t tab) const {
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int p = static_cast<int>(threadIdx.x) + kLutStreamWarps * 32 * i, g = p % 8, c = p / 8;
      if (p < 8 * kChunks) {
        const uint32_t l[4] = {lo[i].x, lo[i].y, lo[i].z, lo[i].w}, h[4] = {hi[i].x, hi[i].y, hi[i].z, hi[i].w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t v = __byte_perm(l[j / 2], h[j / 2], j % 2 ? 0x7632u : 0x5410u);
          asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(tab + ((8 * c + j) * 8 + g) * 16), "r"(v) : "memory");
        }
      }
    }
  }
};

template <int B, bool kFusedOutliers, int kMX, int kStages>
__global__ void __launch_bounds__(kLutStreamWarps * 32, (LutStreamStage<B, kMX, kStages>::kMinBlocks)) anyprec_gemv_lut_stream_kernel(
    AnyPrecDevice w, const float* __restrict__ x, int m_total, float* __restrict__ y, const uint4* __restrict__ xfrag,
    const float* __restrict__ xt) {   // x transposed (OutlierX)
  using S = LutStreamStage<B, kMX, kStages>;
  extern __shared__ __align__(16) unsigned char lut_stream_smem[];
  const int64_t n = w.n, W = w.words, G = (W + 7) / 8, tiles = (n + 15) / 16;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const __half* lut = w.lut[B];
  const uint32_t tab = static_cast<uint32_t>(__cvta_generic_to_shared(lut_stream_smem));
  StreamRing<kStages, kLutStreamWarps> ring(tab + S::kTableBytes + warp * kStages * S::kBytes, S::kBytes, tiles, G, warp);
  auto issue_weights = [&] {   // the lane's words 8 gi + 2t, + 1 of planes 0..B-1, rows g and g + 8 (zeros past the row)
    const uint32_t st = ring.issue_stage();
    const int64_t word = 8 * ring.it_item + 2 * t;
    const bool ok = word < W;   // W even: both words in or both out
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = min_i64(ring.it_tile * 16 + g + 8 * h, n - 1);
#pragma unroll
      for (int j = 0; j < B; ++j) cp_async(st + ((h * B + j) * 32 + lane) * 8, w.plane_data + (j * n + row) * W + (ok ? word : 0), 8, ok);
    }
  };
  auto issue_x = [&] {   // the group's x fragments of the lanes < 4 kMX (quads 2 gi, 2 gi + 1; slabs 0..7)
    if constexpr (kMX > 0) {
      const uint32_t st = ring.issue_stage() + S::kPlaneBytes;
#pragma unroll
      for (int c = 0; c < S::kXEntries / 32; ++c) {
        const int idx = lane + 32 * c, qs = idx / (4 * kMX), l = idx % (4 * kMX);
        cp_async(st + 16 * idx, xfrag + (16 * ring.it_item + qs) * 32 + l, 16);
      }
    }
  };
  TileLut<B> next;
  next.load(lut, blockIdx.x, n);   // the LUT is a weight: read before the previous kernel's end
  ring.prologue(issue_weights, issue_x);   // xfrag and y belong to the kernels before
  const uint32_t t0 = tab + 4u * lane;
  const int xl = g < m_total ? lane : t;   // lanes of batch columns >= m read column 0's fragments (not stored)
  int buf = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // The previous tile's lookups are over: every warp has passed its epilogue's barrier (store_tc_fragments).
    next.store(tab);
    __syncthreads();
    if (tile + gridDim.x < tiles) next.load(lut, tile + gridDim.x, n);
    float acc4[4][4] = {};   // [slab parity][x hi, lo]: four independent mma chains
    for (int64_t gi = warp; gi < G; gi += kLutStreamWarps) {
      const uint32_t st = ring.next(issue_weights, issue_x);
      uint32_t p0[B][2], p1[B][2];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        lds_u32x2(st + (j * 32 + lane) * 8, p0[j]);
        lds_u32x2(st + ((B + j) * 32 + lane) * 8, p1[j]);
      }
      const uint32_t xs = st + S::kPlaneBytes + 16 * xl;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        uint32_t w0[B], w1[B];
#pragma unroll
        for (int j = 0; j < B; ++j) { w0[j] = p0[j][e]; w1[j] = p1[j][e]; }
        shared_table_slabs<B>(t0, w0, w1, [&](const uint32_t (&a)[4], int sj) {
          uint32_t b[4];
          if constexpr (kMX > 0) {
            lds_u32x4(xs + 16 * 4 * kMX * (8 * e + sj), b);
          } else {   // batch 3..8: from the fragments in global memory (each read by every tile: L1 / L2 hits)
            const uint4 v = __ldg(xfrag + (16 * gi + 8 * e + sj) * 32 + xl);
            b[0] = v.x; b[1] = v.y; b[2] = v.z; b[3] = v.w;
          }
          mma_16816(acc4[2 * (sj & 1)], a, b[0], b[1]);       // hi halves
          mma_16816(acc4[2 * (sj & 1) + 1], a, b[2], b[3]);   // lo halves
        });
      }
    }
    float acc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = (acc4[0][i] + acc4[1][i]) + (acc4[2][i] + acc4[3][i]);
    if (tile + gridDim.x >= tiles) pdl_launch_dependents();   // the CTA's last tile
    store_tc_fragments<kLutStreamWarps, kFusedOutliers>(acc, warp, lane, tile * 16, n, m_total, w.rowptr,
                                                        OutlierX{xt, 1, kXtColumns}, y, OutlierEntry<B>{w, lut}, buf);
    buf ^= 1;
  }
  cp_async_wait<0>();   // no copy outlives the CTA
}

// 5..8 bits: three ring stages.
template <int B, int kMX>
void launch_lut_stream(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s, bool fused, const uint4* xf) {
  constexpr int kStages = 3;
  constexpr int kSmem = LutStreamStage<B, kMX, kStages>::kSmem;
  auto kern = fused ? anyprec_gemv_lut_stream_kernel<B, true, kMX, kStages> : anyprec_gemv_lut_stream_kernel<B, false, kMX, kStages>;
  launch_pdl(kPdlTcTable, kern, persistent_grid(kern, kLutStreamWarps * 32, kSmem, (w.n + 15) / 16), kLutStreamWarps * 32, kSmem, s, w, x,
             m, y, xf, static_cast<const float*>(xfrag_xt(xf, w.k)));
}


template <int B>
void launch_tc(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s, bool fused, void* xfrag,
               GemvPath path) {
  const bool register_lut = is_register_table(path);
  const unsigned grid = static_cast<unsigned>((w.n + 15) / 16);
  uint4* xf = static_cast<uint4*>(xfrag);
  // 16-byte plane loads (kSpan = 4) when rows are a multiple of 4 words: measured on the H100 against one word per
  // lane (kSpan = 1) and 8-byte loads, 3 bits batch 1: 59.2 vs 73.0 / 78.0 us at 28672x8192, 12.3 vs 14.6 / 13.5 at
  // 4096x4096 (8192x28672: 74.4 vs 69.8 / 99.0).
  // The shared-table kernel (pre-split x): 8-byte plane loads (kSpan = 2) on rows of an even number of words. Measured
  // on the H200 against one word per lane (batch 1 / 8): 5 bits faster on all six shapes (28672x8192 97.2 / 100.7
  // against 120.1 / 127.9 us); 8 bits faster up to 8192 rows (8192x28672 168.2 / 179.1 against 192.9 / 217.4) but
  // slower on taller ones (28672x8192 198.2 / 216.2 against 188.2 / 200.9): 110 registers with the double buffer, 4
  // CTAs per SM. Without it (kPrefetch = false, 88 registers, 5 CTAs) the tall 8-bit matrices gain instead (28672x8192
  // 148.0 / 152.7, 22016x4096 batch 8 83.3), so that is their form.
  const bool span2 = xf != nullptr && w.words % 2 == 0;
  const int span = register_lut ? (w.words % 4 == 0 ? 4 : 1) : span2 ? 2 : 1;
  // Weights without outliers run the CUDA-core and register-table kernels instantiated without the outlier code, and
  // the shared-table tensor-core kernel with it (its outlier branch is then skipped at run time). Measured on the H100
  // (same runs): the register-table / CUDA-core kernels' outlier instantiations cost 1.1% / 2.5% of 3- / 4-bit
  // batch-1 decode, while the shared-table kernel's (80 registers against 63) ran faster at batch 8 (4-bit 4096x11008
  // 38.3 against 47.0 us, 8-bit 67.8 against 79.1) for a reason not established (its main loop is the same source).
  const bool fused_rt = fused && w.rowptr != nullptr;
  if (xf != nullptr) {
    float* xt_out = fused_rt ? xfrag_xt(xf, w.k) : nullptr;   // only the fused outliers read it
    const int64_t quads = span * ((w.words + 4 * span - 1) / (4 * span)), entries = quads * 8 * 4 * m;
    const unsigned xgrid = static_cast<unsigned>((entries + 255) / 256);
    if (!register_lut) launch_pdl(kPdlXfrag, span == 2 ? anyprec_xfrag_kernel<false, 2> : anyprec_xfrag_kernel<false, 1>, xgrid, 256, 0, s, w, x, m, xf, quads, xt_out);
    else if (span == 4) launch_pdl(kPdlXfrag, anyprec_xfrag_kernel<true, 4>, xgrid, 256, 0, s, w, x, m, xf, quads, xt_out);
    else launch_pdl(kPdlXfrag, anyprec_xfrag_kernel<true, 1>, xgrid, 256, 0, s, w, x, m, xf, quads, xt_out);
  }
  if constexpr (B <= 4) {
    if (is_streamed(path)) {   // requirements checked by gemv_bits
      // Four stages for grids of at most two tiles per SM with at least four groups per warp, two otherwise
      // (measured on the H100, 3 bits batch 1: 4096x11008 18.7 against 20.4 us; 4096x4096, two groups per warp,
      // 9.8 with two stages against 10.7; 28672x8192 54.6 against 59.8).
      static const int sms = device_sm_count();
      const bool deep = static_cast<int64_t>(grid) <= 2LL * sms && (w.words + 15) / 16 >= 4 * kStreamWarps;
      if (m == 1) deep ? launch_stream<B, 1, 4>(w, x, m, y, s, fused_rt, xf) : launch_stream<B, 1, 2>(w, x, m, y, s, fused_rt, xf);
      else deep ? launch_stream<B, 2, 4>(w, x, m, y, s, fused_rt, xf) : launch_stream<B, 2, 2>(w, x, m, y, s, fused_rt, xf);
      return;
    }
    if (register_lut) {
      const bool compact = reglut_compact<B>(span, grid);
      auto kern = reglut_kernel<B>(fused_rt, span, compact);
      launch_pdl(kPdlRegLut, kern, grid, kTcWarps * 32, 0, s, w, x, m, y, xf, static_cast<const float*>(xfrag_xt(xf, w.k)));
      return;
    }
  }
  if (path == GemvPath::TensorCoreSharedLutStream) {   // requirements checked by gemv_bits
    if constexpr (B >= 5) {
      // x staged in the ring at batch 1, read from global memory above: H200, same runs (docs/PERF.md), Llama-2-7B
      // 8-bit decode batch 1 217.3 / 217.0 tok/s staged against 204.5 / 204.5, batch 2 380.8-381.0 against 401.9;
      // LOWBIT_LUT_STREAM_RING_X=0 reads x from global memory at batch 1 too (a measurement switch).
      static const bool ring_x = knob_bool(Knob::LutStreamRingX);
      if (m == 1 && ring_x) launch_lut_stream<B, 1>(w, x, m, y, s, fused_rt, xf);
      else launch_lut_stream<B, 0>(w, x, m, y, s, fused_rt, xf);
    }
    return;
  }
  const size_t smem = sizeof(uint32_t) * (1u << B) * 32;
  auto kern = xf == nullptr ? (fused ? anyprec_gemv_tc_kernel<B, true, false> : anyprec_gemv_tc_kernel<B, false, false>)
              : fused       ? tc_table_form<B, true>(span, w.n)
                            : tc_table_form<B, false>(span, w.n);
  if (smem > 40 * 1024) LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  launch_pdl(kPdlTcTable, kern, grid, kTcWarps * 32, smem, s, w, x, m, y, xf, static_cast<const float*>(xfrag_xt(xf, w.k)));
}

// Batch 9..16 in the two-tile form of the GEMV kernels: the fragment kernel writes both columns' fp16 entries, the
// GEMV runs as at batch 8 (2..4 bits the register-table kernel, 5..8 the shared-table one with launch_tc's plane-load
// choices), the outliers follow as the CSR pass.
template <int B>
void launch_two_tiles(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s, void* xfrag) {
  const unsigned grid = static_cast<unsigned>((w.n + 15) / 16);
  uint4* xf = static_cast<uint4*>(xfrag);
  const float* no_xt = nullptr;
  if constexpr (B <= 4) {
    const int span = w.words % 4 == 0 ? 4 : 1;
    const int64_t quads = span * ((w.words + 4 * span - 1) / (4 * span)), entries = quads * 8 * 32;
    const unsigned xgrid = static_cast<unsigned>((entries + 255) / 256);
    if (span == 4) launch_pdl(kPdlXfrag, anyprec_xfrag_kernel<true, 4, true>, xgrid, 256, 0, s, w, x, m, xf, quads, nullptr);
    else launch_pdl(kPdlXfrag, anyprec_xfrag_kernel<true, 1, true>, xgrid, 256, 0, s, w, x, m, xf, quads, nullptr);
    auto kern = reglut_form<B, false, true>(span, reglut_compact<B>(span, grid));
    launch_pdl(kPdlRegLut, kern, grid, kTcWarps * 32, 0, s, w, x, m, y, xf, no_xt);
  } else {
    const int span = w.words % 2 == 0 ? 2 : 1;
    const int64_t quads = span * ((w.words + 4 * span - 1) / (4 * span)), entries = quads * 8 * 32;
    const unsigned xgrid = static_cast<unsigned>((entries + 255) / 256);
    if (span == 2) launch_pdl(kPdlXfrag, anyprec_xfrag_kernel<false, 2, true>, xgrid, 256, 0, s, w, x, m, xf, quads, nullptr);
    else launch_pdl(kPdlXfrag, anyprec_xfrag_kernel<false, 1, true>, xgrid, 256, 0, s, w, x, m, xf, quads, nullptr);
    auto kern = tc_table_form<B, false, true>(span, w.n);
    const size_t smem = sizeof(uint32_t) * (1u << B) * 32;
    if (smem > 40 * 1024) LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    launch_pdl(kPdlTcTable, kern, grid, kTcWarps * 32, smem, s, w, x, m, y, xf, no_xt);
  }
  if (w.rowptr != nullptr) launch_outliers<B>(w, x, m, y, s);
}

template <int B>
void gemv_bits(const AnyPrecDevice& w, const float* x, int m, float* y, cudaStream_t s, bool fused, GemvPath path,
               void* xfrag) {
  LOWBIT_CHECK(path != GemvPath::TensorCoreStream, "anyprec GEMV: the streamed tensor-core kernel is a 2/4/16 path "
               "(any-precision: TensorCoreRegisterLutStream)");
  LOWBIT_CHECK(path != GemvPath::Dp2aStream && path != GemvPath::Int8MmaStream, "anyprec GEMV: the integer-dot and int8 ",
               "tensor-core 2/4/16 kernels are 2/4/16 paths (any-precision: TensorCoreInt8LutStream)");
  if (is_register_table(path))
    LOWBIT_CHECK(B <= 4 && xfrag != nullptr, "anyprec GEMV: register tables serve 2..4 bits with pre-split activations (asked: ",
                 B, " bits", xfrag == nullptr ? ", no xfrag scratch" : "", ")");
  if (path == GemvPath::TensorCoreSharedLutStream)
    LOWBIT_CHECK(B >= 5 && xfrag != nullptr && anyprec_lut_stream_fits(w.n, w.k, m),
                 "anyprec GEMV: the streamed shared-table kernel serves 5..8 bits with pre-split activations, k a multiple of 64 "
                 "and >= 2048 (asked: ", B, " bits, ", w.n, "x", w.k, ", batch ", m, xfrag == nullptr ? ", no xfrag scratch" : "", ")");
  if (is_streamed(path))
    LOWBIT_CHECK(anyprec_stream_fits(w.n, w.k, m), "anyprec GEMV: the streamed register-table kernel needs k a multiple of 128 and >= ",
                 16 * 32 * kStreamWarps, ", and batch <= 2 (asked: ", w.n, "x", w.k, ", batch ", m, ")");
  if (path == GemvPath::Auto) path = anyprec_auto_path(w.n, w.k, m, B, xfrag != nullptr);
  if (path == GemvPath::TensorCoreInt8LutStream) return anyprec_gemv_i8(w, B, x, m, y, s, true, xfrag);   // outliers fused
  if (is_tensor_core(path)) {
    launch_tc<B>(w, x, m, y, s, fused, xfrag, path);
  } else {
    if (!dispatch_int<1, 2, 3, 4, 5, 6, 7, 8>(m, [&](auto mm) { launch_gemv<B, decltype(mm)::value>(w, x, y, s, fused); }))
      fail("anyprec GEMV: batch ", m, " outside 1..", kMaxGemvBatch);
  }
  if (!fused && w.rowptr != nullptr) launch_outliers<B>(w, x, m, y, s);   // a separate CSR pass after whichever kernel ran
}

void check_width(const AnyPrecDevice& w, int bits) {
  LOWBIT_CHECK(bits >= 2 && bits <= w.planes && ((w.widths >> bits) & 1u) != 0, "anyprec GEMV: width ", bits,
               " is not served by this weight (planes ", w.planes, ")");
}

// f(integral_constant<int, bits>) for a width that check_width() accepted (2..8).
template <typename F>
void with_width(int bits, F&& f) {
  dispatch_int<2, 3, 4, 5, 6, 7, 8>(bits, f);
}

}  // namespace


// The fragments (quads of the widest layout: 4 per group of 16 words, >= one per 4 words), then x transposed [k, kXtColumns]
// (the fused outliers' gathers, xfrag_xt).
size_t anyprec_xfrag_bytes(int64_t k) { return xfrag_part_bytes(k) + static_cast<size_t>(k) * kXtColumns * sizeof(float); }

void anyprec_presplit_x(const AnyPrecDevice& w, const float* x, int m, void* xfrag, cudaStream_t s) {
  const int64_t quads = (w.words + 3) / 4, entries = quads * 8 * 4 * m;
  launch_pdl(kPdlXfrag, anyprec_xfrag_kernel<false, 1>, static_cast<unsigned>((entries + 255) / 256), 256, 0, s, w, x, m,
             static_cast<uint4*>(xfrag), quads, nullptr);
}

void anyprec_gemv(const AnyPrecDevice& w, int bits, const float* x, int m, float* y, cudaStream_t s, OutlierMode mode,
                  GemvPath path, void* xfrag) {
  check_width(w, bits);
  LOWBIT_CHECK(m >= 1 && m <= kMaxGemvBatch, "anyprec GEMV: batch ", m, " outside 1..", kMaxGemvBatch);
  const bool fused = mode == OutlierMode::Fused;
  with_width(bits, [&](auto b) { gemv_bits<decltype(b)::value>(w, x, m, y, s, fused, path, xfrag); });
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void anyprec_gemv_two_tiles(const AnyPrecDevice& w, int bits, const float* x, int m, float* y, cudaStream_t s, void* xfrag) {
  check_width(w, bits);
  LOWBIT_CHECK(m > kMaxGemvBatch && m <= 2 * kMaxGemvBatch && xfrag != nullptr,
               "anyprec two-tile GEMV: batch 9..16 and an xfrag scratch (asked: batch ", m, ")");
  with_width(bits, [&](auto b) { launch_two_tiles<decltype(b)::value>(w, x, m, y, s, xfrag); });
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void anyprec_outliers_add(const AnyPrecDevice& w, int bits, const float* x, int64_t m, float* y, cudaStream_t s) {
  check_width(w, bits);
  if (w.rowptr == nullptr) return;
  const int mm = static_cast<int>(m);
  with_width(bits, [&](auto b) { launch_outliers<decltype(b)::value>(w, x, mm, y, s); });
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void anyprec_dequant_f16(const AnyPrecDevice& w, int bits, __half* out, cudaStream_t s) {
  check_width(w, bits);
  const unsigned grid = static_cast<unsigned>((w.n * w.words + 255) / 256);
  with_width(bits, [&](auto b) { anyprec_dequant_kernel<decltype(b)::value><<<grid, 256, 0, s>>>(w, out); });
  if (w.rowptr != nullptr)
    anyprec_dequant_outliers_kernel<<<static_cast<unsigned>((w.n + 255) / 256), 256, 0, s>>>(w, out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

bool narrow_rows(int64_t n, int64_t k, int m, int bits) {
  static const int sms = device_sm_count();
  return m <= kNarrowMaxBatch && n < 4LL * 32 * sms && (k <= 4096 || bits >= 6);
}

}  // namespace lowbit::cuda
