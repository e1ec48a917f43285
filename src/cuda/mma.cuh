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

// The tensor-core GEMVs' epilogue. The CTA's warps each hold an m16n8 accumulator fragment of the same 16 rows
// (lane (g, t): rows g / g + 8, batch columns 2t / 2t + 1); after one barrier warp w stores rows 4w .. 4w + 3 for
// every batch column (lane 4 mm + r: row 4w + r, column mm, kMaxGemvBatch = 8 columns at most), each value the sum of
// the warps' fragments read from shared memory; with outliers, row by row, plus the warp-reduced sum of
// partial(row, mm) over the lanes (each lane returns its share of the row's outlier correction). buf: which half of
// the double-buffered scratch (a CTA looping over tiles alternates, so that the next tile's writes never meet this
// tile's reads without a second barrier).
template <int kWarps, bool kOutliers, typename Partial>
__device__ __forceinline__ void store_tc_fragments(const float (&acc)[4], int warp, int lane, int64_t row0, int64_t n,
                                                   int m_total, bool has_outliers, float* __restrict__ y,
                                                   Partial partial, int buf = 0) {
  __shared__ float part[2][kWarps][32][4];   // each warp's fragment
#pragma unroll
  for (int i = 0; i < 4; ++i) part[buf][warp][lane][i] = acc[i];
  __syncthreads();
  if (!(kOutliers && has_outliers)) {   // lane (rr = lane % 4, mm = lane / 4): one value each, all at once
    const int lr = warp * 4 + lane % 4, mm = lane / 4;
    const int64_t row = row0 + lr;
    if (mm < m_total && row < n) {
      float v = 0.0f;
      for (int wi = 0; wi < kWarps; ++wi) v += part[buf][wi][4 * (lr % 8) + mm / 2][2 * (lr / 8) + mm % 2];
      y[mm * n + row] = v;
    }
    return;
  }
  for (int rr = 0; rr < 4; ++rr) {
    const int lr = warp * 4 + rr;   // row lr of the tile: lane 4 (lr % 8) + mm / 2, entry 2 (lr / 8) + mm % 2
    const int64_t row = row0 + lr;
    if (row >= n) break;
    for (int mm = 0; mm < m_total; ++mm) {
      float extra = partial(row, mm);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) extra += __shfl_xor_sync(0xffffffffu, extra, off);
      if (lane == 0) {
        float v = 0.0f;
        for (int wi = 0; wi < kWarps; ++wi) v += part[buf][wi][4 * (lr % 8) + mm / 2][2 * (lr / 8) + mm % 2];
        y[mm * n + row] = v + extra;
      }
    }
  }
}

}  // namespace lowbit::cuda
