// Helpers shared by the GEMV kernels: the scalar kernels' warp-sum epilogue, and for the tensor-core paths one
// mma.sync m16n8k16 (fp16 inputs, fp32 accumulation), the hi + lo fp16 split of fp32 activations that keeps an
// fp32-accurate product when A is exact in fp16, and the fragment-sum + store epilogue.
//
// Fragment layout of m16n8k16 (PTX ISA), lane = 4 g + t:
//   A (16 x 16, row): a0 = (row g, k 2t, 2t+1), a1 = (row g+8, k 2t, 2t+1), a2 = (row g, k 2t+8, 2t+9), a3 = (row g+8, ...)
//   B (16 x 8, col):  b0 = (k 2t, 2t+1; col g), b1 = (k 2t+8, 2t+9; col g)
//   C (16 x 8):       c0, c1 = (row g, col 2t, 2t+1), c2, c3 = (row g+8, col 2t, 2t+1)
// Each register pair holds its lower k (or col) in the low 16 bits.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace lowbit::cuda {

__device__ __forceinline__ uint32_t half2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma.sync m16n8k32 with int8 A and B and int32 accumulators (the int8 GEMV, anyprec_gemv_i8.cu). Its fragments hold
// four consecutive k per register (lowest k in the low byte), lane = 4 g + t:
//   A (16 x 32, row): a0 = (row g, k 4t..4t+3), a1 = (row g+8, k 4t..), a2 = (row g, k 16+4t..), a3 = (row g+8, k 16+4t..)
//   B (32 x 8, col):  b0 = (k 4t..4t+3; col g), b1 = (k 16+4t..16+4t+3; col g)
//   C: as m16n8k16's.
__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma.sync m16n8k16 with int8 A and B, C = 0 + A B in int32 (the 2/4/16 int8 tensor-core GEMV, one 16-column group
// per mma): a0 = (row g, k 4t..4t+3), a1 = (row g+8, k 4t..); b = (k 4t..4t+3; col g); C as m16n8k16's.
__device__ __forceinline__ void mma_s8_16816_zero(int (&c)[4], const uint32_t (&a)[2], uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0));
}

// (hi, lo) fp16 pairs of two activations: hi = fp16(v), lo = fp16(v - hi), so hi + lo carries ~22 bits of v.
__device__ __forceinline__ void split_pair(float v0, float v1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(v0, v1);
  const float2 hf = __half22float2(h);
  hi = half2_bits(h);
  lo = half2_bits(__floats2half2_rn(v0 - hf.x, v1 - hf.y));
}

// C += A (B_hi + B_lo): two mma on the same accumulators.
__device__ __forceinline__ void mma_split(float (&c)[4], const uint32_t (&a)[4], float x0, float x1, float x2, float x3) {
  uint32_t b0h, b0l, b1h, b1l;
  split_pair(x0, x1, b0h, b0l);
  split_pair(x2, x3, b1h, b1l);
  mma_16816(c, a, b0h, b1h);
  mma_16816(c, a, b0l, b1l);
}

// The scalar GEMV epilogue: each (row r, batch m) partial sum reduced across the warp, lane 0 storing rows < n.
template <int kRows, int M>
__device__ __forceinline__ void store_warp_sums(const float (&acc)[kRows][M], int lane, int64_t row0, int64_t n,
                                                float* __restrict__ y) {
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && row0 + r < n) y[m * n + row0 + r] = v;
    }
}

// Lane (g, t) of a tensor-core GEMV CTA that computes the 16 rows from row0 = 16 * blockIdx.x with m16n8 fragments:
// its rows g and g + 8, clamped to n - 1 (a missing row recomputes row n - 1, never stored).
struct TcTile {
  int warp, lane, g, t;
  int64_t row0, r0, r1;
  __device__ __forceinline__ explicit TcTile(int64_t n) : TcTile(n, blockIdx.x) {}
  // Tile `tile` (rows 16 tile ..) instead of the CTA's own: kernels whose CTAs loop over several tiles.
  __device__ __forceinline__ TcTile(int64_t n, int64_t tile)
      : warp(static_cast<int>(threadIdx.x) / 32), lane(static_cast<int>(threadIdx.x) % 32), g(lane / 4), t(lane % 4),
        row0(tile * 16), r0(row0 + g < n ? row0 + g : n - 1), r1(row0 + g + 8 < n ? row0 + g + 8 : n - 1) {}
};

// The activations the outlier corrections gather, value (mm, c) at p[mm * mm_stride + c * col_stride]: x [m, k] itself
// (mm_stride k, col_stride 1), or its transposed copy [k, 8] written by the fragment kernels (xt_of, mm_stride 1,
// col_stride 8), where one entry's batch columns share a 32-byte sector instead of taking one sector each (at batch
// 8 on 70B-class shapes, gathers from x itself took 35-48% of the 2/4/16 tensor-core kernel's time).
struct OutlierX {
  const float* p;
  int64_t mm_stride, col_stride;
};
constexpr int kXtColumns = 8;   // batch columns per row of the transposed copy (kMaxGemvBatch)

// Lane partial sums of the sparse-outlier corrections of the kRows rows row_a .. row_a + kRows - 1 (those below n),
// for batch columns 0 .. m_total - 1 (m_total <= M), added to acc[r][mm]. The rows' CSR entries are contiguous,
// [rowptr[row_a], rowptr[row_a + kRows]): the lanes stride over that one range, so the dependent loads (row
// pointers, then an entry's column and value, then x) form one chain per 32 entries, where a loop per row (and, in
// the tensor-core epilogue, per batch column, each with its own warp reduction) makes one chain per row (with it the
// outliers cost 35-47% of the 2/4/16 tensor-core kernel at batch 5..8). entry(row, e, xcol) returns entry e's
// coefficient and sets xcol, its column of x (the value multiplied is xo's (mm, xcol): OutlierX).
// kPasses > 1: the loads of kPasses passes of 32 entries are issued before any of them is used (the 2/4/16 integer-dot
// GEMV, whose shorter kernel leaves the chains exposed: outliers over its dense time +17-18% on the 70B shapes against
// +26-28% with one pass; H200). The sums keep their order, entries e, e + 32, ...: the same
// bits for every kPasses.
// The lane's CSR bound for rows row_a .. row_a + kRows - 1 (lane r <= rows: rowptr[row_a + r], else 0), the first load of
// add_outlier_partials' chain: a kernel may load it at its tile's start and pass it in (bound >= 0).
template <int kRows>
__device__ __forceinline__ int32_t outlier_row_bound(const int32_t* __restrict__ rowptr, int64_t row_a, int64_t n, int lane) {
  if (row_a >= n) return 0;
  const int rows = static_cast<int>(row_a + kRows <= n ? kRows : n - row_a);
  return lane <= rows ? __ldg(rowptr + row_a + lane) : 0;
}

template <int kRows, int M, int kPasses = 1, typename Entry>
__device__ __forceinline__ void add_outlier_partials(const int32_t* __restrict__ rowptr, int64_t row_a, int64_t n,
                                                     OutlierX xo, int m_total, int lane, Entry entry,
                                                     float (&acc)[kRows][M], int32_t pre_bound = -1) {
  static_assert(kRows < 32, "row bounds come from one lane each");
  if (row_a >= n) return;
  const int rows = static_cast<int>(row_a + kRows <= n ? kRows : n - row_a);
  const int32_t bound = pre_bound >= 0 ? pre_bound : outlier_row_bound<kRows>(rowptr, row_a, n, lane);
  int32_t lim[kRows + 1];   // lim[r]: first entry of row r (lim[rows..]: the end)
#pragma unroll
  for (int r = 0; r <= kRows; ++r) lim[r] = __shfl_sync(0xffffffffu, bound, r < rows ? r : rows);
  if constexpr (kPasses == 1) {   // the one-pass loop in its own form: 2% faster than kPasses' loop at one pass in the
                                  // 2/4/16 batch-8 decode (H200: 1,411.8 against 1,384.8 tok/s)
    for (int32_t e = lim[0] + lane; e < lim[kRows]; e += 32) {
      int r = 0;
#pragma unroll
      for (int i = 1; i < kRows; ++i) r += e >= lim[i];
      int64_t xcol;
      const float coef = entry(row_a + r, static_cast<int64_t>(e), xcol);
#pragma unroll
      for (int mm = 0; mm < M; ++mm) {
        if (mm >= m_total) break;
        const float p = coef * __ldg(xo.p + mm * xo.mm_stride + xcol * xo.col_stride);
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr) acc[rr][mm] += rr == r ? p : 0.0f;
      }
    }
  } else {
    for (int32_t e0 = lim[0] + lane; e0 < lim[kRows]; e0 += 32 * kPasses) {
      float coef[kPasses], xv[kPasses][M];
      int64_t xcol[kPasses];
      int row[kPasses];   // the entry's row among the kRows
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int32_t e = e0 + 32 * i;
        row[i] = 0;
#pragma unroll
        for (int j = 1; j < kRows; ++j) row[i] += e >= lim[j];
        xcol[i] = 0;
        coef[i] = e < lim[kRows] ? entry(row_a + row[i], static_cast<int64_t>(e), xcol[i]) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kPasses; ++i)   // every pass's x before any is used
#pragma unroll
        for (int mm = 0; mm < M; ++mm)
          xv[i][mm] = e0 + 32 * i < lim[kRows] && mm < m_total ? __ldg(xo.p + mm * xo.mm_stride + xcol[i] * xo.col_stride) : 0.0f;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        if (e0 + 32 * i >= lim[kRows]) break;
#pragma unroll
        for (int mm = 0; mm < M; ++mm) {
          if (mm >= m_total) break;
          const float p = coef[i] * xv[i][mm];
#pragma unroll
          for (int rr = 0; rr < kRows; ++rr) acc[rr][mm] += rr == row[i] ? p : 0.0f;
        }
      }
    }
  }
}

// One step of a warp reduce-scatter over 2 * kO values (a compile-time offset, so every index is static and the
// array stays in registers): lanes with bit kO set keep the upper kO values plus their partner's, the others the
// lower kO.
template <int kO>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[32], int lane) {
  const bool upper = (lane & kO) != 0;
#pragma unroll
  for (int i = 0; i < kO; ++i) {
    const float lo = v[i], hi = v[i + kO];
    const float send = upper ? lo : hi;
    v[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, send, kO);
  }
}

// The tensor-core epilogue's outlier corrections of the 4 rows row_a .. row_a + 3, summed over the warp: lane
// 4 mm + r returns the correction of (row row_a + r, batch column mm) (0 for mm >= m_total or rows past n). The lane
// partials (add_outlier_partials, kPasses passes' loads at once, batch columns < kCols <= 8) are summed by a
// reduce-scatter (31 shuffles, deterministic, no atomics).
template <int kPasses = 1, int kCols = 8, typename Entry>
__device__ __forceinline__ float outlier_corrections(const int32_t* __restrict__ rowptr, int64_t row_a, int64_t n,
                                                     OutlierX xo, int m_total, int lane, Entry entry, int32_t pre_bound = -1) {
  static_assert(kCols >= 1 && kCols <= 8, "at most 8 batch columns");
  float acc[4][kCols];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int mm = 0; mm < kCols; ++mm) acc[r][mm] = 0.0f;
  add_outlier_partials<4, kCols, kPasses>(rowptr, row_a, n, xo, m_total, lane, entry, acc, pre_bound);
  float v[32];   // index 4 mm + r
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = i / 4 < kCols ? acc[i % 4][i / 4 < kCols ? i / 4 : 0] : 0.0f;
  // At offset o, lanes with bit o set keep the upper half of their values and receive the partner's lower half.
  reduce_scatter_step<16>(v, lane);
  reduce_scatter_step<8>(v, lane);
  reduce_scatter_step<4>(v, lane);
  reduce_scatter_step<2>(v, lane);
  reduce_scatter_step<1>(v, lane);
  return v[0];   // index `lane`
}

// The tensor-core GEMVs' epilogue, its reduction. The CTA's warps (4 or more) each hold an m16n8 accumulator fragment of the same 16 rows
// (lane (g, t): rows g / g + 8, batch columns 2t / 2t + 1); after one barrier warp w < 4 stores rows 4w .. 4w + 3 for
// every batch column (lane 4 mm + r: row 4w + r, column mm, kMaxGemvBatch = 8 columns at most): returns the sum of
// the warps' fragments read from shared memory, plus, with outliers, its correction from outlier_corrections (entry:
// see there; rowptr, xo: the weight's CSR row pointers and the activations gathered, OutlierX). buf: which half of the
// double-buffered scratch (a CTA looping over tiles alternates, so that the next tile's writes never meet this
// tile's reads without a second barrier). kPasses, kCols: outlier_corrections'.
template <int kWarps, bool kOutliers, int kPasses = 1, int kCols = 8, typename Entry>
__device__ __forceinline__ float reduce_tc_fragments(const float (&acc)[4], int warp, int lane, int64_t row0, int64_t n,
                                                     int m_total, const int32_t* __restrict__ rowptr, OutlierX xo, Entry entry,
                                                     int buf, int32_t pre_bound = -1) {
  static_assert(kWarps >= 4, "warps 0..3 store the 16 rows");
  __shared__ float part[2][kWarps][32][4];   // each warp's fragment
  float extra = 0.0f;
  if constexpr (kOutliers) {   // before the barrier: the warps' outlier loads overlap the others' arrival
    if (warp < 4 && rowptr != nullptr && row0 + 4 * warp < n) extra = outlier_corrections<kPasses, kCols>(rowptr, row0 + 4 * warp, n, xo, m_total, lane, entry, pre_bound);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) part[buf][warp][lane][i] = acc[i];
  __syncthreads();
  const int lr = warp * 4 + lane % 4, mm = lane / 4;   // lane (rr = lane % 4, mm = lane / 4): one value each, all at once
  float v = 0.0f;
  if (warp < 4 && mm < m_total && row0 + lr < n) {
    for (int wi = 0; wi < kWarps; ++wi) v += part[buf][wi][4 * (lr % 8) + mm / 2][2 * (lr / 8) + mm % 2];
    v += extra;
  }
  return v;
}

// The tensor-core GEMVs' epilogue: reduce_tc_fragments' value of lane (row 4 warp + lane % 4, batch column lane / 4)
// stored to y [m, n] (warps 0..3; lanes past m_total or n store nothing).
template <int kWarps, bool kOutliers, int kPasses = 1, int kCols = 8, typename Entry>
__device__ __forceinline__ void store_tc_fragments(const float (&acc)[4], int warp, int lane, int64_t row0, int64_t n,
                                                   int m_total, const int32_t* __restrict__ rowptr, OutlierX xo,
                                                   float* __restrict__ y, Entry entry, int buf = 0, int32_t pre_bound = -1) {
  const float v = reduce_tc_fragments<kWarps, kOutliers, kPasses, kCols>(acc, warp, lane, row0, n, m_total, rowptr, xo, entry, buf, pre_bound);
  const int64_t row = row0 + warp * 4 + lane % 4;
  const int mm = lane / 4;
  if (warp < 4 && mm < m_total && row < n) y[mm * n + row] = v;
}

}  // namespace lowbit::cuda
