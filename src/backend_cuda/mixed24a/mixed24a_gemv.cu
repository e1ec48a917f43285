// The 2/4/16 GEMV over the memory-aligned mixed24a layout (Li et al., ICCAD 2024, sec. 5 and Algorithm 1).
//
// One warp computes kRows = 4 rows of one 16-row block; its lanes stride over the 64-weight units, so per unit a lane
// issues one 128-bit load (three 2-bit groups + half of the 4-bit group), one 32-bit load (the other half), the
// 16 + 8 metadata bits, the unit's four perm entries (one 64-bit load) and the block's second-order step/offset
// pairs, all independent, so the second-order scale dequantization (one fmaf per group) overlaps the loads of the
// weights it scales instead of preceding them. x is gathered through perm: a group's 16 activations are contiguous
// in the original order (four 16-byte loads per batch row), L1-resident across the block's 16 rows.
//
// Decoding without a conversion instruction: a code q under the mask, OR-ed into the bits of 2^23, is the float
// 2^23 + q; subtracting (2^23 + z) in one FADD gives q - z exactly. The group's dot product sum x (q - z) is fp32,
// then scaled by the group's ŝ; accumulation is fp32 throughout.
//
// Outliers (stored columns, the dense code under each equal to its zero point, so the dense part there is 0):
// fused, each warp adds val * x[orig(c)] over its rows' CSR entries; or a CSR SpMV kernel runs after the GEMV.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend_cuda/anyprec/int8_tables.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/common/mma.cuh"
#include "backend_cuda/dispatch/packed.h"
#include "backend_cuda/common/row_absmax.cuh"
#include "backend_cuda/common/stream.cuh"

namespace lowbit::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 4;   // kWarps * kRows = 16: one block = one second-order row group; x loads shared by 4 rows
// (one row per warp for few-row matrices, as the any-precision GEMV does, measured 1.6-1.8x slower here on the H100)

__device__ __forceinline__ float code_minus_zero(uint32_t field, float zm) {
  return __int_as_float(0x4B000000u | field) - zm;
}

// Where stored group s of a unit (0..2: 2-bit, 3: 4-bit) keeps its scale index and zero point: in the unit's meta2 word
// (s < 3: sc at bits 0..3 / 4..6 / 7..9, z at 10 + 2 s, two bits) or meta4 byte (s = 3: sc at 0..3, z at 4..7), read
// from a word holding that field `shift` bits up (the kernels that load several units' meta in one word).
struct MetaFields {
  uint32_t sc_sh, sc_mask, z_sh, z_mask;
  __host__ __device__ constexpr explicit MetaFields(int s, uint32_t shift = 0)
      : sc_sh(shift + (s == 1 ? 4 : s == 2 ? 7 : 0)), sc_mask(s == 0 || s == 3 ? 15u : 7u),
        z_sh(shift + (s < 3 ? 10 + 2 * s : 4)), z_mask(s < 3 ? 3u : 15u) {}
  __device__ __forceinline__ uint32_t sc(uint32_t word) const { return (word >> sc_sh) & sc_mask; }
  __device__ __forceinline__ uint32_t z(uint32_t word) const { return (word >> z_sh) & z_mask; }
};

// The fused outlier entries (add_outlier_partials, store_tc_fragments): entry e adds val * x[orig(c)] (the dense code under
// an outlier is its zero point: the dense part there is exactly 0).
struct MixedOutlierEntry {
  const uint16_t* col;
  const uint16_t* perm;
  const __half* val;
  __device__ __forceinline__ explicit MixedOutlierEntry(const Mixed24ADevice& w) : col(w.col), perm(w.perm), val(w.val) {}
  __device__ __forceinline__ float operator()(int64_t, int64_t e, int64_t& xcol) const {
    const uint32_t c = __ldg(col + e);
    xcol = 16 * static_cast<int64_t>(__ldg(perm + c / 16)) + c % 16;
    return __half2float(val[e]);
  }
};

// The permuted gathers of x go through L1 (__ldg): x staged in shared memory first (the paper's form) measured 1-44%
// slower (H100; docs/PERF.md, "Designs measured and not kept").
template <int M, bool kFusedOutliers>
__global__ void __launch_bounds__(kWarps * 32) mixed24a_gemv_kernel(Mixed24ADevice w, const float* __restrict__ x,
                                                                    float* __restrict__ y) {
  pdl_wait();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16 + warp * kRows;
  if (row0 >= w.n) return;
  const int64_t n = w.n, k = w.k, U = k / 64, rg = row0 / 16;
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min(row0 + r, n - 1);

  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

  for (int64_t u = lane; u < U; u += 32) {
    // Every load of the unit first: weights, metadata, perm, second-order scales.
    uint4 qa[kRows];
    uint32_t qb[kRows], m2[kRows], m4[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      qa[r] = __ldg(w.qa + rows[r] * U + u);
      qb[r] = __ldg(w.qb + rows[r] * U + u);
      m2[r] = __ldg(w.meta2 + rows[r] * U + u);
      m4[r] = __ldg(w.meta4 + rows[r] * U + u);
    }
    const uint2 pp = __ldg(reinterpret_cast<const uint2*>(w.perm) + u);
    const float ss[4] = {__half2float(w.ss2[rg * 3 * U + 3 * u]), __half2float(w.ss2[rg * 3 * U + 3 * u + 1]),
                         __half2float(w.ss2[rg * 3 * U + 3 * u + 2]), __half2float(w.ss4[rg * U + u])};
    const float sm[4] = {__half2float(w.sm2[rg * 3 * U + 3 * u]), __half2float(w.sm2[rg * 3 * U + 3 * u + 1]),
                         __half2float(w.sm2[rg * 3 * U + 3 * u + 2]), __half2float(w.sm4[rg * U + u])};
    const int64_t base[4] = {16 * static_cast<int64_t>(pp.x & 0xFFFFu), 16 * static_cast<int64_t>(pp.x >> 16),
                             16 * static_cast<int64_t>(pp.y & 0xFFFFu), 16 * static_cast<int64_t>(pp.y >> 16)};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      float scale[kRows], zm[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const MetaFields f(s);
        const uint32_t mw = s == 3 ? m4[r] : m2[r];
        scale[r] = fmaf(static_cast<float>(f.sc(mw)), ss[s], sm[s]);
        zm[r] = 8388608.0f + static_cast<float>(f.z(mw));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float xv[M][8];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float4* xp = reinterpret_cast<const float4*>(x + m * k + base[s] + 8 * h);
          const float4 a = __ldg(xp);
          const float4 b = __ldg(xp + 1);
          xv[m][0] = a.x; xv[m][1] = a.y; xv[m][2] = a.z; xv[m][3] = a.w;
          xv[m][4] = b.x; xv[m][5] = b.y; xv[m][6] = b.z; xv[m][7] = b.w;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float d[8];
          if (s < 3) {
            const uint32_t word = s == 0 ? qa[r].x : s == 1 ? qa[r].y : qa[r].z;
#pragma unroll
            for (int i = 0; i < 8; ++i) d[i] = code_minus_zero((word >> (2 * (8 * h + i))) & 3u, zm[r]);
          } else {
            const uint32_t word = h == 0 ? qa[r].w : qb[r];
#pragma unroll
            for (int i = 0; i < 8; ++i) d[i] = code_minus_zero((word >> (4 * i)) & 15u, zm[r]);
          }
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float g = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) g = fmaf(xv[m][i], d[i], g);
            acc[r][m] = fmaf(g, scale[r], acc[r][m]);
          }
        }
      }
    }
  }

  pdl_launch_dependents();   // late: dependents launched earlier would sit in pdl_wait() holding SM slots
  if constexpr (kFusedOutliers) {
    if (w.rowptr != nullptr) add_outlier_partials<kRows, M>(w.rowptr, row0, n, OutlierX{x, k, 1}, M, lane, MixedOutlierEntry{w}, acc);
  }
  store_warp_sums<kRows, M>(acc, lane, row0, n, y);
}

// CSR SpMV after the dense GEMV: one warp per row, y += val * x[orig(col)].
__global__ void mixed24a_outliers_kernel(Mixed24ADevice w, const float* __restrict__ x, int m_total, float* __restrict__ y) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= w.n) return;
  const MixedOutlierEntry entry(w);
  for (int m = 0; m < m_total; ++m) {
    float v = 0.0f;
    for (int e = w.rowptr[row] + lane; e < w.rowptr[row + 1]; e += 32) {
      int64_t orig;
      const float coef = entry(row, e, orig);
      v = fmaf(coef, x[m * w.k + orig], v);
    }
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) y[m * w.n + row] += v;
  }
}

// The separate outlier pass (CSR, any batch) after a dense kernel.
void launch_outliers(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s) {
  launch_pdl(kPdlMixed, mixed24a_outliers_kernel, static_cast<unsigned>((w.n + 7) / 8), 256, 0, s, w, x, m, y);
}

// The 64 weights of unit u of `row` as fp16: v[s] holds stored group s (0..2: 2-bit, 3: 4-bit) in column order (the
// codes decoded as in the GEMV, by the 2^23 trick rather than integer-to-float conversions). One 16-byte load of the
// unit's 2-bit words and 4-bit low half, one of its 4-bit high half.
__device__ __forceinline__ void dequant_unit(const Mixed24ADevice& w, int64_t row, int64_t u, __half2 (&v)[4][8]) {
  const int64_t U = w.k / 64, unit = row * U + u, rg = row / 16;
  const uint4 q = __ldg(w.qa + unit);
  const uint32_t qb = __ldg(w.qb + unit), m2 = __ldg(w.meta2 + unit), m4 = __ldg(w.meta4 + unit);
  const uint32_t words[3] = {q.x, q.y, q.z};
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    const MetaFields f(s);
    const float scale = fmaf(static_cast<float>(f.sc(m2)), __half2float(w.ss2[rg * 3 * U + 3 * u + s]), __half2float(w.sm2[rg * 3 * U + 3 * u + s]));
    const float zm = 8388608.0f + static_cast<float>(f.z(m2));
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[s][i] = __floats2half2_rn(code_minus_zero((words[s] >> (4 * i)) & 3u, zm) * scale,
                                  code_minus_zero((words[s] >> (4 * i + 2)) & 3u, zm) * scale);
  }
  constexpr MetaFields f4(3);
  const float scale = fmaf(static_cast<float>(f4.sc(m4)), __half2float(w.ss4[rg * U + u]), __half2float(w.sm4[rg * U + u]));
  const float zm = 8388608.0f + static_cast<float>(f4.z(m4));
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t word = i < 4 ? q.w : qb;
    const int sh = 8 * (i % 4);
    v[3][i] = __floats2half2_rn(code_minus_zero((word >> sh) & 15u, zm) * scale, code_minus_zero((word >> (sh + 4)) & 15u, zm) * scale);
  }
}

// fp16 weights in the original column order, a block per row (grid-stride over rows): each thread decodes whole units
// of the row in stored order (coalesced loads, the same code path in every lane), writing each group's 16 values at its
// original place in a shared-memory copy of the row; the block then sets the row's outliers there and copies the row
// out with coalesced 16-byte stores. The other forms measured slower: each thread storing its group straight to global
// memory (the stores scattered by perm), decoding the original groups in order (the reads scattered), or a thread per
// group rather than per unit (the 2-bit and 4-bit groups of a warp diverging) left dequantize + cuBLAS at batch 64 on
// 28672x8192 at 4.8x / 3.6x / 3.1x cuBLAS fp16 alone (H200).
__global__ void mixed24a_dequant_kernel(Mixed24ADevice w, __half* __restrict__ out) {
  extern __shared__ uint4 srow[];   // [k / 8]: one row in fp16
  const int64_t U = w.k / 64;
  for (int64_t row = blockIdx.x; row < w.n; row += gridDim.x) {
    for (int64_t u = threadIdx.x; u < U; u += blockDim.x) {
      alignas(16) __half2 v[4][8];
      dequant_unit(w, row, u, v);
      const uint2 p = __ldg(reinterpret_cast<const uint2*>(w.perm) + u);   // the unit's four groups' original places
      const uint32_t places[4] = {p.x & 0xFFFFu, p.x >> 16, p.y & 0xFFFFu, p.y >> 16};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint4* d = srow + 2 * places[s];
        d[0] = reinterpret_cast<const uint4*>(v[s])[0];
        d[1] = reinterpret_cast<const uint4*>(v[s])[1];
      }
    }
    __syncthreads();
    if (w.rowptr != nullptr) {   // outliers: stored column c is original column 16 perm[c / 16] + c % 16
      __half* sh = reinterpret_cast<__half*>(srow);
      for (int e = w.rowptr[row] + static_cast<int>(threadIdx.x); e < w.rowptr[row + 1]; e += static_cast<int>(blockDim.x)) {
        const uint32_t c = w.col[e];
        sh[16 * static_cast<int64_t>(w.perm[c / 16]) + c % 16] = w.val[e];
      }
      __syncthreads();
    }
    uint4* o = reinterpret_cast<uint4*>(out + row * w.k);   // k is a multiple of 64: 16-byte aligned
    for (int64_t i = threadIdx.x; i < w.k / 8; i += blockDim.x) o[i] = srow[i];
    __syncthreads();   // before the next row overwrites the copy
  }
}


// ---------------------------------------------------------------------------------------------------------------
// Tensor-core path (batch 2..8, and 1 on request): mma.sync m16n8k16, fp16 inputs, fp32 accumulation.
//
// A block is one 16-row block (the second-order row group) and 4 warps splitting its units (u = warp, warp + 4, ...).
// Per stored group of 16 columns a warp issues mma with A = (q - z) for the 16 rows — small integers, exact in fp16 —
// and B = the group's activations for the batch columns, then adds ŝ(row) * C to its accumulators: the group's
// scale is applied to the fp32 product, never rounded into fp16. x is split as x_hi + x_lo (two fp16 values, the
// second holding the next 11 bits), each through its own mma, so the result keeps about fp32 accuracy.
//
// The k order inside a group is ours to choose (A and B only have to agree), and it is picked so that one shift and
// one LOP3 turn a code word into a fragment register: lane (g = lane / 4, t = lane % 4), for a 2-bit word w (code i
// at bits 2i), (w >> 4t) & 0x00030003 holds codes 2t and 2t + 8, (w >> 4t + 2) & ... codes 2t + 1 and 2t + 9; OR-ed
// with 0x64006400 they are the fp16 values 1024 + q, and one HSUB2 of 1024 + z leaves q - z. The 4-bit group
// (codes 0..7 in qa.w, 8..15 in qb, 4 bits each) gives codes t, t + 4 and 8 + t, 12 + t the same way.
constexpr int kTcWarps = 4;

__device__ __forceinline__ uint32_t codes_minus_zero(uint32_t field_pair, __half2 zm) {
  const uint32_t v = field_pair | 0x64006400u;   // (1024 + q_lo, 1024 + q_hi) as fp16
  return half2_bits(__hsub2(*reinterpret_cast<const __half2*>(&v), zm));
}

// The activations of every (unit, group, lane) as the lane feeds them to mma_split, gathered through the group
// permutation and split into fp16 hi + lo: {b0 hi, b1 hi, b0 lo, b1 lo}, zero for batch columns >= m. One thread per
// entry; the GEMV then reads one 16-byte word per group (the pre-split path). It also writes x transposed into xt
// [k, kXtColumns] (batch columns < m) for the fused outliers' gathers.
// kTwoTiles (batch 9..16, mixed24a_gemv_two_tiles): each entry holds two batch columns rounded to fp16, {b0, b1} of
// column g and of column g + 8 (zero for columns >= m), in place of hi / lo; xt is not written.
template <bool kTwoTiles = false>
__global__ void mixed24a_xfrag_kernel(Mixed24ADevice w, const float* __restrict__ x, int m_total, uint4* __restrict__ out,
                                      float* __restrict__ xt) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t U = w.k / 64, id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= U * 4 * 32) return;
  const int lane = static_cast<int>(id % 32), s = static_cast<int>((id / 32) % 4);
  const int64_t u = id / 128;
  const int g = lane / 4, t = lane % 4;
  float xk[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xk2[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // xk2: column g + 8 (kTwoTiles)
  if (g < m_total) {
    const int64_t base = 16 * static_cast<int64_t>(w.perm[4 * u + s]);
    // the k order of the 2-bit groups (see mixed24a_gemv_tc_kernel), and of the 4-bit group
    const int off[4] = {s < 3 ? 2 * t : t, s < 3 ? 2 * t + 8 : t + 4, s < 3 ? 2 * t + 1 : 8 + t, s < 3 ? 2 * t + 9 : 12 + t};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      xk[q] = x[static_cast<int64_t>(g) * w.k + base + off[q]];
      if constexpr (kTwoTiles) {
        if (g + 8 < m_total) xk2[q] = x[static_cast<int64_t>(g + 8) * w.k + base + off[q]];
      } else {
        if (xt != nullptr) xt[(base + off[q]) * kXtColumns + g] = xk[q];   // the outlier gathers' copy (OutlierX)
      }
    }
  }
  uint4 v;
  if constexpr (kTwoTiles) {
    v = make_uint4(half2_bits(__floats2half2_rn(xk[0], xk[1])), half2_bits(__floats2half2_rn(xk[2], xk[3])),
                   half2_bits(__floats2half2_rn(xk2[0], xk2[1])), half2_bits(__floats2half2_rn(xk2[2], xk2[3])));
  } else {
    split_pair(xk[0], xk[1], v.x, v.z);
    split_pair(xk[2], xk[3], v.y, v.w);
  }
  out[id] = v;
}

// Lane (g, t)'s A fragment of group s of a unit (rows g and g + 8: their code words qa / qb and metadata m2 / m4) and
// the two rows' group scales ŝ = sc * ss + sm: A = q - z exact in fp16, in the k order documented above.
struct MixedUnit {
  uint4 qa0, qa1;
  uint32_t qb0, qb1, m20, m21, m40, m41;
};
__device__ __forceinline__ void mixed_group_a(const MixedUnit& q, int s, int t, float ss, float sm, uint32_t (&a)[4],
                                              float& scale0, float& scale1) {
  // MetaFields' layout, spelled out: its 4-bit z mask costs the streamed kernel's loop 8 more instructions here, where
  // m40 / m41 are bytes and need none.
  const uint32_t sc0 = s == 0 ? (q.m20 & 15u) : s == 1 ? ((q.m20 >> 4) & 7u) : s == 2 ? ((q.m20 >> 7) & 7u) : (q.m40 & 15u);
  const uint32_t sc1 = s == 0 ? (q.m21 & 15u) : s == 1 ? ((q.m21 >> 4) & 7u) : s == 2 ? ((q.m21 >> 7) & 7u) : (q.m41 & 15u);
  const uint32_t z0 = s == 3 ? (q.m40 >> 4) : ((q.m20 >> (10 + 2 * s)) & 3u);
  const uint32_t z1 = s == 3 ? (q.m41 >> 4) : ((q.m21 >> (10 + 2 * s)) & 3u);
  scale0 = fmaf(static_cast<float>(sc0), ss, sm);
  scale1 = fmaf(static_cast<float>(sc1), ss, sm);
  const __half2 zm0 = __float2half2_rn(1024.0f + static_cast<float>(z0));
  const __half2 zm1 = __float2half2_rn(1024.0f + static_cast<float>(z1));
  if (s < 3) {
    const uint32_t w0 = s == 0 ? q.qa0.x : s == 1 ? q.qa0.y : q.qa0.z, w1 = s == 0 ? q.qa1.x : s == 1 ? q.qa1.y : q.qa1.z;
    a[0] = codes_minus_zero((w0 >> (4 * t)) & 0x00030003u, zm0);       // row g,     k 2t, 2t+1: codes 2t, 2t+8
    a[1] = codes_minus_zero((w1 >> (4 * t)) & 0x00030003u, zm1);       // row g + 8
    a[2] = codes_minus_zero((w0 >> (4 * t + 2)) & 0x00030003u, zm0);   // row g,     k 2t+8, 2t+9: codes 2t+1, 2t+9
    a[3] = codes_minus_zero((w1 >> (4 * t + 2)) & 0x00030003u, zm1);
  } else {
    a[0] = codes_minus_zero((q.qa0.w >> (4 * t)) & 0x000F000Fu, zm0);  // codes t, t+4
    a[1] = codes_minus_zero((q.qa1.w >> (4 * t)) & 0x000F000Fu, zm1);
    a[2] = codes_minus_zero((q.qb0 >> (4 * t)) & 0x000F000Fu, zm0);    // codes 8+t, 12+t
    a[3] = codes_minus_zero((q.qb1 >> (4 * t)) & 0x000F000Fu, zm1);
  }
}

template <bool kFusedOutliers, bool kPreSplit>
__global__ void __launch_bounds__(kTcWarps * 32) mixed24a_gemv_tc_kernel(Mixed24ADevice w, const float* __restrict__ x,
                                                                         int m_total, float* __restrict__ y,
                                                                         const uint4* __restrict__ xfrag,
                                                                         const float* __restrict__ xt) {
  pdl_wait();
  const int64_t n = w.n, k = w.k, U = k / 64, rg = blockIdx.x;
  const TcTile tile(n);
  const int warp = tile.warp, lane = tile.lane, g = tile.g, t = tile.t;
  const int64_t row0 = tile.row0, r0 = tile.r0, r1 = tile.r1;
  const bool col_ok = g < m_total;   // this lane feeds batch column g of B
  const float* xg = x + static_cast<int64_t>(col_ok ? g : 0) * k;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  for (int64_t u = warp; u < U; u += kTcWarps) {
    const MixedUnit q = {__ldg(w.qa + r0 * U + u),    __ldg(w.qa + r1 * U + u),    __ldg(w.qb + r0 * U + u),
                         __ldg(w.qb + r1 * U + u),    __ldg(w.meta2 + r0 * U + u), __ldg(w.meta2 + r1 * U + u),
                         __ldg(w.meta4 + r0 * U + u), __ldg(w.meta4 + r1 * U + u)};
    const uint2 pp = __ldg(reinterpret_cast<const uint2*>(w.perm) + u);
    const int64_t base[4] = {16 * static_cast<int64_t>(pp.x & 0xFFFFu), 16 * static_cast<int64_t>(pp.x >> 16),
                             16 * static_cast<int64_t>(pp.y & 0xFFFFu), 16 * static_cast<int64_t>(pp.y >> 16)};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const float ss = __half2float(s < 3 ? w.ss2[rg * 3 * U + 3 * u + s] : w.ss4[rg * U + u]);
      const float sm = __half2float(s < 3 ? w.sm2[rg * 3 * U + 3 * u + s] : w.sm4[rg * U + u]);
      uint32_t a[4];
      float scale0, scale1;
      mixed_group_a(q, s, t, ss, sm, a, scale0, scale1);
      // The activations of the 4 k positions this lane feeds, in the same order.
      float xk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (s < 3) {
        if (!kPreSplit && col_ok) {
          const float2 lo = __ldg(reinterpret_cast<const float2*>(xg + base[s] + 2 * t));       // x[2t], x[2t+1]
          const float2 hi = __ldg(reinterpret_cast<const float2*>(xg + base[s] + 2 * t + 8));   // x[2t+8], x[2t+9]
          xk[0] = lo.x;  // k 2t   -> code 2t
          xk[1] = hi.x;  // k 2t+1 -> code 2t+8
          xk[2] = lo.y;  // k 2t+8 -> code 2t+1
          xk[3] = hi.y;  // k 2t+9 -> code 2t+9
        }
      } else {
        if (!kPreSplit && col_ok) {
          xk[0] = __ldg(xg + base[s] + t);
          xk[1] = __ldg(xg + base[s] + t + 4);
          xk[2] = __ldg(xg + base[s] + 8 + t);
          xk[3] = __ldg(xg + base[s] + 12 + t);
        }
      }
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (kPreSplit) {
        const uint4 xb = __ldg(xfrag + (u * 4 + s) * 32 + lane);
        mma_16816(c, a, xb.x, xb.y);   // hi halves
        mma_16816(c, a, xb.z, xb.w);   // lo halves
      } else {
        mma_split(c, a, xk[0], xk[1], xk[2], xk[3]);
      }
      acc[0] = fmaf(scale0, c[0], acc[0]);
      acc[1] = fmaf(scale0, c[1], acc[1]);
      acc[2] = fmaf(scale1, c[2], acc[2]);
      acc[3] = fmaf(scale1, c[3], acc[3]);
    }
  }

  pdl_launch_dependents();
  store_tc_fragments<kTcWarps, kFusedOutliers>(acc, warp, lane, row0, n, m_total, w.rowptr,
                                               kPreSplit ? OutlierX{xt, 1, kXtColumns} : OutlierX{x, k, 1}, y, MixedOutlierEntry{w});
}

// ---------------------------------------------------------------------------------------------------------------
// Streamed tensor-core path (GemvPath::TensorCoreStream; x pre-split, k a multiple of 256 and >= 1024). The kernel
// above issues, per unit and lane, eight dependent weight/metadata loads and eight scale loads with nothing in
// flight ahead of them, in CTAs that live for one 16-row tile: on the H100 it ran at 0.07-0.23 of the copy
// bandwidth at every batch. Here, as in the any-precision streamed kernel (anyprec_gemv.cu), CTAs are persistent
// and each warp streams its items, (tile, chunk of kStreamUnits units), through a private ring of shared-memory
// stages by cp.async, the copies of an item issued kStages - 1 items ahead across tile boundaries. A stage holds
// the chunk's code words of the tile's 16 rows ([unit][row] for qa: 8 rows per 128 bytes, conflict-free 16-byte
// reads; [row][unit] for qb / meta2 / meta4), the tile's second-order scales of the chunk's groups, and the x
// fragments of the lanes of batch columns < kMX. The decode and mma are the kernel above's (mixed_group_a).
constexpr int kStreamWarps = 4;
constexpr int kStreamUnits = 4;   // units (64 columns) per item

template <int kMX>
struct MixedStage {
  static constexpr int kStages = kMX <= 2 ? 4 : 2;
  static constexpr int kQa = 0;                                         // [unit][16 rows] uint4
  static constexpr int kQb = kQa + kStreamUnits * 16 * 16;              // [16 rows][unit] u32
  static constexpr int kM2 = kQb + 16 * kStreamUnits * 4;               // [16 rows][unit] u16
  static constexpr int kM4 = kM2 + 16 * kStreamUnits * 2;               // [16 rows][unit] u8
  static constexpr int kSs2 = kM4 + 16 * kStreamUnits;                  // 3 units' worth of halves each: ss2, sm2
  static constexpr int kSm2 = kSs2 + 3 * kStreamUnits * 2;
  static constexpr int kSs4 = kSm2 + 3 * kStreamUnits * 2;              // ss4, sm4
  static constexpr int kSm4 = kSs4 + kStreamUnits * 2;
  static constexpr int kX = kSm4 + kStreamUnits * 2;                    // [unit][group][lane < 4 kMX] uint4
  static constexpr int kXEntries = kStreamUnits * 4 * 4 * kMX;
  static constexpr int kBytes = kX + 16 * kXEntries;
  static constexpr int kWarpBytes = kStages * kBytes;
  static_assert(kX % 16 == 0, "x fragments 16-byte aligned");
};

// kTwoTiles (kMX = 8; batch 9..16): the x entries hold columns g and g + 8 in fp16 (mixed24a_xfrag_kernel<true>), the
// second mma of each group accumulates the second 8-column tile; outliers run as the separate CSR pass.
template <bool kFusedOutliers, int kMX, bool kTwoTiles = false>
__global__ void __launch_bounds__(kStreamWarps * 32, kMX <= 2 ? 4 : 2) mixed24a_gemv_stream_kernel(
    Mixed24ADevice w, const float* __restrict__ x, int m_total, float* __restrict__ y, const uint4* __restrict__ xfrag,
    const float* __restrict__ xt) {
  static_assert(!kTwoTiles || (kMX == 8 && !kFusedOutliers), "two tiles: every lane's entries, outliers apart");
  using S = MixedStage<kMX>;
  constexpr int kStages = S::kStages;
  extern __shared__ __align__(16) unsigned char mixed_stream_smem[];
  const int64_t n = w.n, U = w.k / 64, C = U / kStreamUnits, tiles = (n + 15) / 16;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  // Work items: (tile, chunk of kStreamUnits units).
  StreamRing<kStages, kStreamWarps> ring(static_cast<uint32_t>(__cvta_generic_to_shared(mixed_stream_smem)) + warp * S::kWarpBytes,
                                         S::kBytes, tiles, C, warp);
  auto issue_weights = [&] {
    const uint32_t st = ring.issue_stage();
    const int64_t it_tile = ring.it_tile, u0 = ring.it_item * kStreamUnits;
    {   // qa: 64 (unit, row) words of 16 bytes, two per lane
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int idx = lane + 32 * c, uu = idx / 16, r = idx % 16;
        const int64_t row = min(it_tile * 16 + r, n - 1);
        cp_async(st + S::kQa + 16 * idx, w.qa + row * U + u0 + uu, 16);
      }
    }
    const int r = lane % 16;
    const int64_t row = min(it_tile * 16 + r, n - 1);
    if (lane < 16) {
      cp_async(st + S::kQb + 16 * r, w.qb + row * U + u0, 16);
      cp_async(st + S::kM4 + 4 * r, w.meta4 + row * U + u0, 4);
    } else {
      cp_async(st + S::kM2 + 8 * r, w.meta2 + row * U + u0, 8);
      const int64_t rg = it_tile;
      if (r < 3) cp_async(st + S::kSs2 + 8 * r, w.ss2 + rg * 3 * U + 3 * u0 + 4 * r, 8);
      else if (r < 6) cp_async(st + S::kSm2 + 8 * (r - 3), w.sm2 + rg * 3 * U + 3 * u0 + 4 * (r - 3), 8);
      else if (r == 6) cp_async(st + S::kSs4, w.ss4 + rg * U + u0, 8);
      else if (r == 7) cp_async(st + S::kSm4, w.sm4 + rg * U + u0, 8);
    }
  };
  auto issue_x = [&] {
    const uint32_t st = ring.issue_stage() + S::kX;
    const int64_t it_c = ring.it_item;
#pragma unroll
    for (int c = 0; c < S::kXEntries / 32; ++c) {
      const int idx = lane + 32 * c, us = idx / (4 * kMX), l = idx % (4 * kMX);   // us = unit * 4 + group
      cp_async(st + 16 * idx, xfrag + (it_c * kStreamUnits * 4 + us) * 32 + l, 16);
    }
  };
  ring.prologue(issue_weights, issue_x);   // xfrag and y belong to the kernels before
  const int xl = g < m_total ? lane : t;   // lanes of batch columns >= m read column 0's fragments (not stored)
  int buf = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // acc2: columns 8..15 (kTwoTiles)
    for (int64_t ci = warp; ci < C; ci += kStreamWarps) {
      const uint32_t st = ring.next(issue_weights, issue_x);
#pragma unroll
      for (int uu = 0; uu < kStreamUnits; ++uu) {
        MixedUnit q;
        uint32_t v[4];
        lds_u32x4(st + S::kQa + 16 * (uu * 16 + g), v);
        q.qa0 = make_uint4(v[0], v[1], v[2], v[3]);
        lds_u32x4(st + S::kQa + 16 * (uu * 16 + g + 8), v);
        q.qa1 = make_uint4(v[0], v[1], v[2], v[3]);
        q.qb0 = lds_u32(st + S::kQb + 4 * (g * kStreamUnits + uu));
        q.qb1 = lds_u32(st + S::kQb + 4 * ((g + 8) * kStreamUnits + uu));
        q.m20 = lds_u16(st + S::kM2 + 2 * (g * kStreamUnits + uu));
        q.m21 = lds_u16(st + S::kM2 + 2 * ((g + 8) * kStreamUnits + uu));
        q.m40 = lds_u8(st + S::kM4 + g * kStreamUnits + uu);
        q.m41 = lds_u8(st + S::kM4 + (g + 8) * kStreamUnits + uu);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const float ss = lds_half(s < 3 ? st + S::kSs2 + 2 * (3 * uu + s) : st + S::kSs4 + 2 * uu);
          const float sm = lds_half(s < 3 ? st + S::kSm2 + 2 * (3 * uu + s) : st + S::kSm4 + 2 * uu);
          uint32_t a[4];
          float scale0, scale1;
          mixed_group_a(q, s, t, ss, sm, a, scale0, scale1);
          uint32_t b[4];
          lds_u32x4(st + S::kX + 16 * ((uu * 4 + s) * 4 * kMX + xl), b);
          float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_16816(c, a, b[0], b[1]);   // hi halves (kTwoTiles: column g)
          if constexpr (kTwoTiles) {
            float c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_16816(c2, a, b[2], b[3]);   // column g + 8
            acc2[0] = fmaf(scale0, c2[0], acc2[0]);
            acc2[1] = fmaf(scale0, c2[1], acc2[1]);
            acc2[2] = fmaf(scale1, c2[2], acc2[2]);
            acc2[3] = fmaf(scale1, c2[3], acc2[3]);
          } else {
            mma_16816(c, a, b[2], b[3]);   // lo halves
          }
          acc[0] = fmaf(scale0, c[0], acc[0]);
          acc[1] = fmaf(scale0, c[1], acc[1]);
          acc[2] = fmaf(scale1, c[2], acc[2]);
          acc[3] = fmaf(scale1, c[3], acc[3]);
        }
      }
    }
    if (tile + gridDim.x >= tiles) pdl_launch_dependents();   // the CTA's last tile
    if constexpr (kTwoTiles) {
      // Buffers 0 then 1 every tile: a buffer's next write comes after the barrier of the other's store, which every
      // warp reaches only after reading it.
      store_tc_fragments<kStreamWarps, false>(acc, warp, lane, tile * 16, n, m_total < 8 ? m_total : 8, nullptr, OutlierX{},
                                              y, MixedOutlierEntry{w}, 0);
      store_tc_fragments<kStreamWarps, false>(acc2, warp, lane, tile * 16, n, m_total - 8, nullptr, OutlierX{}, y + 8 * n,
                                              MixedOutlierEntry{w}, 1);
    } else {
      store_tc_fragments<kStreamWarps, kFusedOutliers>(acc, warp, lane, tile * 16, n, m_total, w.rowptr,
                                                       OutlierX{xt, 1, kXtColumns}, y, MixedOutlierEntry{w}, buf);
      buf ^= 1;
    }
  }
  cp_async_wait<0>();
}

template <int kMX>
void launch_stream(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s, bool fused, const uint4* xf,
                   const float* xt) {
  const size_t smem = static_cast<size_t>(kStreamWarps) * MixedStage<kMX>::kWarpBytes;
  auto kern = fused ? mixed24a_gemv_stream_kernel<true, kMX> : mixed24a_gemv_stream_kernel<false, kMX>;
  launch_pdl(kPdlMixed, kern, persistent_grid(kern, kStreamWarps * 32, smem, (w.n + 15) / 16), kStreamWarps * 32, smem, s,
             w, x, m, y, xf, xt);
}

template <int M>
void launch(const Mixed24ADevice& w, const float* x, float* y, cudaStream_t s, bool fused) {
  const unsigned grid = static_cast<unsigned>((w.n + 15) / 16);
  if (fused) launch_pdl(kPdlMixed, mixed24a_gemv_kernel<M, true>, grid, kWarps * 32, 0, s, w, x, y);
  else launch_pdl(kPdlMixed, mixed24a_gemv_kernel<M, false>, grid, kWarps * 32, 0, s, w, x, y);
}


// ---------------------------------------------------------------------------------------------------------------
// The integer-dot 2/4/16 GEMV (GemvPath::Dp2aStream; batch 1..2, k a multiple of 256 and >= 1024).
//
// Why: at batch 1 the kernels above spend their time on instructions, not memory (H200, 28672x8192: 70.3 us, the
// same as on the H100, where cuBLAS gains the H200's bandwidth): the scalar kernel decodes every code to an fp32
// value (shift, mask, OR, FADD) and multiplies it by x in its own FFMA; the tensor-core kernels at batch 1 waste 7/8
// of each mma and spend ~40 instructions per lane and group on its A fragment and scales. Here the codes stay
// integers: x becomes one 16-bit integer per activation, v = 254 hi + lo from the int8 pieces of int8_tables.h (x ~
// s v / 254 under one scale s = max|x| / 127 per batch column, off by at most s / 508), and a group's dot product
// sum q v is exact in int32 by eight DP2A (two 16-bit x values times two 8-bit codes each): a 2-bit code word spread
// to bytes is four masks and three shifts, a 4-bit group's two words six. The zero point leaves by one multiply-add,
// sum (q - z) v = sum q v - z V with V = sum v of the group (written with the pieces), and the group's scale (the
// second-order sc * ss + sm, as the kernels above) multiplies its exact sum once: 29 SASS instructions per 16 weights
// and lane, plus ~117 per work item of ring bookkeeping (ncu, H200, 28672x8192: issue slots 56% busy).
//
// Lane (uu = lane / 4, s = lane % 4) takes group s of unit uu of a work item of kDpUnits units and all 16 rows of the
// tile, one accumulator per row: the lane's x values, V and scales are loaded once per item, and all 32 lanes run the
// same instructions (2-bit and 4-bit groups differ only in per-lane shift amounts, masks and smem offsets).
// Memory side as the streamed kernels (stream.cuh): persistent CTAs of 4 warps (8 where the tiles are few measured
// slower: H200, Llama-2-7B decode 311.0 against 318.2 tok/s), each warp streaming its items (tile,
// chunk of kDpUnits units) through a private cp.async ring. A stage holds the chunk's 16 rows, each 192 bytes (qa of
// the 8 units, qb, meta2, meta4, padding: one row stride for every lane's reads), the tile's second-order scales of
// the chunk, and the chunk's x values and V of every batch column. At the tile's end the lanes' row sums are
// reduce-scattered over the warp and handed to the tensor-core epilogue (store_tc_fragments: the 4 warps' sums, the
// fused outliers, the store). The dense code under an outlier is its zero point, so its dense term is exactly 0.
// Two ring stages: three and four measured slower (H200, Llama-2-7B 2/4/16 decode batch 1: 321.4 tok/s with two,
// 304.7 with three, 297.9 with four).
constexpr int kDpStages = 2;
constexpr int kDpWarps = 4;
constexpr int kDpUnits = 8;                // units (64 columns) per work item: 32 groups, one per lane
constexpr int kDpXHeaderBytes = 256;       // the x scratch: float scale[kMaxGemvBatch], padded; then values, then V
constexpr int kDpXThreads = 256;
constexpr int kDpRowBytes = 192;           // a stage row: qa [8] uint4, qb [8] u32, meta2 [8] u16, meta4 [8] u8, pad
constexpr int kDpQb = 128, kDpM2 = 160, kDpM4 = 176;

__host__ __device__ constexpr int64_t dp_chunks(int64_t k) { return (k / 64 + kDpUnits - 1) / kDpUnits; }
__host__ __device__ constexpr int64_t dp_groups(int64_t k) { return dp_chunks(k) * kDpUnits * 4; }   // padded

template <int M, int kStages>
struct DpStage {
  static constexpr int kSc = 16 * kDpRowBytes;           // ss2 [24] half, sm2 [24], ss4 [8], sm4 [8]
  static constexpr int kX = kSc + 128;                   // [col][32 groups][8] u32: the groups' 16-bit values
  static constexpr int kV = kX + 1024 * M;               // [col][32] int32: V of each group
  static constexpr int kBytes = kV + 128 * M;
  static constexpr int kWarpBytes = kStages * kBytes;
};

// The matrices one launch serves (q / k / v, or gate / up: the same x, each its own permutation and output): their tiles
// in order, tile t of the launch belonging to part p for tile_start[p] <= t < tile_start[p + 1]. Passed as a
// __grid_constant__ parameter, indexed by part without a copy.
constexpr int kDpMaxParts = 3;
struct DpParts {
  Mixed24ADevice w[kDpMaxParts];
  float* y[kDpMaxParts];
  int64_t tile_start[kDpMaxParts + 1];
  int parts;
  __device__ __forceinline__ int part_of(int64_t tile) const {
    int p = 0;
#pragma unroll
    for (int i = 1; i < kDpMaxParts; ++i) p += i < parts && tile >= tile_start[i];
    return p;
  }
};

// Tile `tile` of a grouped launch, as a persistent kernel's loop takes it: its part, the part's weight, its first row
// there and, with fused outliers, the first dependent load of the epilogue (the CSR bounds of warps 0..3's rows, issued
// now and used at the tile's end; -1 otherwise).
template <bool kFusedOutliers>
struct PartTile {
  int part;
  const Mixed24ADevice& w;
  int64_t row0;
  int32_t obound;
  __device__ __forceinline__ PartTile(const DpParts& P, int64_t tile, int warp, int lane)
      : part(P.part_of(tile)), w(P.w[part]), row0((tile - P.tile_start[part]) * 16),
        obound(kFusedOutliers && warp < 4 && w.rowptr != nullptr ? outlier_row_bound<4>(w.rowptr, row0 + 4 * warp, w.n, lane) : -1) {}
};

__device__ __forceinline__ uint32_t pack_u16(int a, int b) {
  return (static_cast<uint32_t>(a) & 0xFFFFu) | (static_cast<uint32_t>(b) << 16);
}

// The k positions (0..15 within the group) whose codes the DP2A of word p (0..7) pairs with the word's two 16-bit
// values: the code bytes of spread word p / 2, bytes 0-1 (even p, dp2a.lo) or 2-3 (odd p, dp2a.hi). 2-bit groups
// (code i at bits 2i of the word): spread word j = (w >> 2j) & 0x03030303, byte b = code 4b + j. 4-bit groups (codes
// 0..7 in qa.w, 8..15 in qb, code i at bits 4(i % 8)): spread words (qa.w, qa.w >> 4, qb, qb >> 4) & 0x0F0F0F0F,
// word j byte b = code 8 (j / 2) + 2b + j % 2.
__host__ __device__ constexpr int dp_code_of(bool four_bit, int p, int half) {   // half: 0 = the word's low value
  const int j = p / 2, b = 2 * (p % 2) + half;
  return four_bit ? 8 * (j / 2) + 2 * b + j % 2 : 4 * b + j;
}

// The activation kernels' common start (the integer-dot and int8 tensor-core GEMVs'): the 16 activations of stored group
// G of batch column col (original columns 16 perm[G] .. 16 perm[G] + 15 of the part's permutation; zero where !live),
// then the column's scale, s = max|x| / 127 from xmax (the producer's exact row max) or by reducing the row itself
// (block_row_absmax: every thread of the block calls this), written to the scratch's header by one thread.
__device__ __forceinline__ float mixed_group_x(const Mixed24ADevice& w, const float* __restrict__ x, int col, int m, int part, int64_t G,
                                               bool live, bool vec, uint8_t* __restrict__ xq, const float* __restrict__ xmax,
                                               float (&xv)[16]) {
  const float* xr = x + static_cast<int64_t>(col) * w.k;
  const int64_t base = live ? 16 * static_cast<int64_t>(__ldg(w.perm + G)) : 0;
#pragma unroll
  for (int i = 0; i < 16; i += 4) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (live) v = vec ? __ldg(reinterpret_cast<const float4*>(xr + base + i))
                      : make_float4(__ldg(xr + base + i), __ldg(xr + base + i + 1), __ldg(xr + base + i + 2), __ldg(xr + base + i + 3));
    xv[i] = v.x; xv[i + 1] = v.y; xv[i + 2] = v.z; xv[i + 3] = v.w;
  }
  const float s = xmax != nullptr ? (col < m ? xmax[col] / kI8Max : 0.0f) : block_row_absmax<kDpXThreads>(xr, w.k, vec, col < m) / kI8Max;
  if (blockIdx.x == 0 && part == 0 && threadIdx.x == 0) reinterpret_cast<float*>(xq)[col] = col < m ? s : 0.0f;
  return s;
}

// One thread per (part, batch column, stored group G): the group's 16 activations (mixed_group_x) as 16-bit values in
// DP2A order, and their sum V; columns >= m and padding groups are zero. Scratch: the scales, then values
// [part][col][Gp][8] u32, then V [part][col][Gp] int32.
__global__ void __launch_bounds__(kDpXThreads) mixed24a_dp_x_kernel(const __grid_constant__ DpParts P, const float* __restrict__ x,
                                                                   int m, int M, bool vec, uint8_t* __restrict__ xq,
                                                                   const float* __restrict__ xmax) {
  pdl_launch_dependents();
  pdl_wait();
  const int col = static_cast<int>(blockIdx.y), part = static_cast<int>(blockIdx.z);
  const Mixed24ADevice& w = P.w[part];
  const int64_t k = w.k, U = k / 64, Gp = dp_groups(k), pc = static_cast<int64_t>(part) * M + col;
  const int64_t G = static_cast<int64_t>(blockIdx.x) * kDpXThreads + threadIdx.x;
  float xv[16];
  const float s = mixed_group_x(w, x, col, m, part, G, col < m && G < 4 * U, vec, xq, xmax, xv);
  if (G >= Gp) return;
  int v[16], sum = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    int8_t hi, lo;
    i8_x_pieces(xv[i], s, hi, lo);
    v[i] = static_cast<int>(kI8LoSteps) * hi + lo;
    sum += v[i];
  }
  const bool four = G % 4 == 3;
  uint32_t wd[8];
#pragma unroll
  for (int p = 0; p < 8; ++p)
    wd[p] = four ? pack_u16(v[dp_code_of(true, p, 0)], v[dp_code_of(true, p, 1)]) : pack_u16(v[dp_code_of(false, p, 0)], v[dp_code_of(false, p, 1)]);
  uint4* out = reinterpret_cast<uint4*>(xq + kDpXHeaderBytes) + (pc * Gp + G) * 2;
  out[0] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
  out[1] = make_uint4(wd[4], wd[5], wd[6], wd[7]);
  reinterpret_cast<int32_t*>(xq + kDpXHeaderBytes + static_cast<size_t>(P.parts) * M * Gp * 32)[pc * Gp + G] = sum;
}

// One step of a warp reduce-scatter of kN values (partner offset kO): lanes with bit kO set keep the upper half plus
// their partner's, the others the lower half.
template <int kN, int kO>
__device__ __forceinline__ void dp_scatter_step(float (&v)[32], int lane) {
  const bool upper = (lane & kO) != 0;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    const float lo = v[i], hi = v[i + kN / 2];
    v[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, kO);
  }
}

template <int M, int kStages, int kWarps, bool kFusedOutliers>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps) mixed24a_gemv_dp_kernel(const __grid_constant__ DpParts P,
                                                                                           const float* __restrict__ x, int m_total,
                                                                                           const uint8_t* __restrict__ xq) {
  static_assert(M == 1 || M == 2, "batch 1..2");
  using S = DpStage<M, kStages>;
  extern __shared__ __align__(16) unsigned char dp_smem[];
  const int64_t k = P.w[0].k, U = k / 64, C = dp_chunks(k), Gp = dp_groups(k), tiles = P.tile_start[P.parts];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, uu = lane / 4, s = lane % 4;
  const uint8_t* xvals = xq + kDpXHeaderBytes;
  const uint8_t* xsums = xvals + static_cast<size_t>(P.parts) * M * Gp * 32;
  StreamRing<kStages, kWarps> ring(static_cast<uint32_t>(__cvta_generic_to_shared(dp_smem)) + warp * S::kWarpBytes, S::kBytes,
                                     tiles, C, warp);
  // Element offsets in 32 bits (mixed24a_dp_fits: n * k / 64 < 2^31): one IMAD.WIDE per source address.
  const int32_t U32 = static_cast<int32_t>(U), Gp32 = static_cast<int32_t>(Gp);
  auto issue_weights = [&] {
    const uint32_t st = ring.issue_stage();
    const int part = P.part_of(ring.it_tile);
    const Mixed24ADevice& w = P.w[part];
    const int32_t n32 = static_cast<int32_t>(w.n), lt = static_cast<int32_t>(ring.it_tile - P.tile_start[part]);
    const int32_t row0 = lt * 16, u0 = static_cast<int32_t>(ring.it_item) * kDpUnits;
    {   // qa: 16 rows x 8 units of 16 bytes, rows lane / 8 + 4 i, unit lane % 8
      const int32_t cu = lane % kDpUnits, r0 = lane / kDpUnits;
      const bool ok = u0 + cu < U32;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int32_t row = min(row0 + r0 + 4 * i, n32 - 1);
        cp_async(st + (r0 + 4 * i) * kDpRowBytes + 16 * cu, w.qa + static_cast<uint32_t>(row * U32 + (ok ? u0 + cu : 0)), 16, ok);
      }
    }
    {   // qb, meta2, meta4: row lane / 2, units 4 h .. 4 h + 3 (U % 4 == 0: all in or all out)
      const int32_t r = lane / 2, h = lane % 2;
      const bool ok = u0 + 4 * h < U32;
      const uint32_t e = static_cast<uint32_t>(min(row0 + r, n32 - 1) * U32 + (ok ? u0 + 4 * h : 0));
      const uint32_t d = st + r * kDpRowBytes;
      cp_async(d + kDpQb + 16 * h, w.qb + e, 16, ok);
      cp_async(d + kDpM2 + 8 * h, w.meta2 + e, 8, ok);
      cp_async(d + kDpM4 + 4 * h, w.meta4 + e, 4, ok);
    }
    if (lane < 16) {   // the tile's second-order scales of the chunk: ss2, sm2 (6 copies of 4 halves), ss4, sm4 (2)
      const int32_t rg = lt;
      const bool of2 = lane < 12, is_sm = of2 ? lane >= 6 : lane >= 14;
      const int32_t c = of2 ? lane % 6 : (lane - 12) % 2;
      const bool ok = of2 ? 3 * u0 + 4 * c < 3 * U32 : u0 + 4 * c < U32;
      const uint32_t e = static_cast<uint32_t>(of2 ? rg * 3 * U32 + (ok ? 3 * u0 + 4 * c : 0) : rg * U32 + (ok ? u0 + 4 * c : 0));
      const __half* src = (of2 ? (is_sm ? w.sm2 : w.ss2) : (is_sm ? w.sm4 : w.ss4)) + e;
      cp_async(st + S::kSc + (of2 ? 48 * is_sm : 96 + 16 * is_sm) + 8 * c, src, 8, ok);
    }
  };
  auto issue_x = [&] {   // the chunk's 32 groups of every batch column: values (1 KB) and V (128 B)
    const uint32_t st = ring.issue_stage();
    const int32_t g0 = static_cast<int32_t>(ring.it_item) * 32, pm = P.part_of(ring.it_tile) * M;
#pragma unroll
    for (int col = 0; col < M; ++col) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        cp_async(st + S::kX + 1024 * col + 16 * (lane + 32 * i),
                 reinterpret_cast<const uint4*>(xvals) + static_cast<uint32_t>(((pm + col) * Gp32 + g0) * 2 + lane + 32 * i), 16);
      if (lane < 8)
        cp_async(st + S::kV + 128 * col + 16 * lane, reinterpret_cast<const uint4*>(xsums) + static_cast<uint32_t>(((pm + col) * Gp32 + g0) / 4 + lane), 16);
    }
  };
  ring.prologue(issue_weights, issue_x);   // xq and y belong to the kernels before
  float sx[M];
#pragma unroll
  for (int col = 0; col < M; ++col) sx[col] = __ldg(reinterpret_cast<const float*>(xq) + col) * (1.0f / kI8LoSteps);
  // The lane's constants: its words' offsets in a stage row, its meta field positions, its spread shifts and mask.
  const bool two = s < 3;
  const uint32_t off_w0 = 16 * uu + 4 * s, off_w1 = two ? off_w0 : kDpQb + 4 * uu;
  const uint32_t off_m = two ? kDpM2 + ((2 * uu) & ~3) : kDpM4 + (uu & ~3);
  const MetaFields mf(s, two ? 16 * (uu & 1) : 8 * (uu & 3));
  const uint32_t sh1 = two ? 2 : 4, sh2 = two ? 4 : 0, sh3 = two ? 6 : 4, cmask = two ? 0x03030303u : 0x0F0F0F0Fu;
  const uint32_t off_ss = S::kSc + (two ? 2 * (3 * uu + s) : 96 + 2 * uu), off_sm = off_ss + (two ? 48 : 16);
  int buf = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const auto [part, w, row0, obound] = PartTile<kFusedOutliers>(P, tile, warp, lane);
    float acc[M][16];
#pragma unroll
    for (int col = 0; col < M; ++col)
#pragma unroll
      for (int r = 0; r < 16; ++r) acc[col][r] = 0.0f;
    for (int64_t ci = warp; ci < C; ci += kWarps) {
      const uint32_t st = ring.next(issue_weights, issue_x);
      uint32_t xw[M][2][4];   // word p of column col: xw[col][p / 4][p % 4]
      int nv[M];
#pragma unroll
      for (int col = 0; col < M; ++col) {
        lds_u32x4(st + S::kX + 1024 * col + 32 * lane, xw[col][0]);
        lds_u32x4(st + S::kX + 1024 * col + 32 * lane + 16, xw[col][1]);
        nv[col] = -static_cast<int>(lds_u32(st + S::kV + 128 * col + 4 * lane));
      }
      const float ss = lds_half(st + off_ss), sm = lds_half(st + off_sm);
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const uint32_t rb = st + r * kDpRowBytes;
        const uint32_t w0 = lds_u32(rb + off_w0), w1 = lds_u32(rb + off_w1), mt = lds_u32(rb + off_m);
        const uint32_t q[4] = {w0 & cmask, (w0 >> sh1) & cmask, (w1 >> sh2) & cmask, (w1 >> sh3) & cmask};
        const float scale = fmaf(static_cast<float>(mf.sc(mt)), ss, sm);
        const int z = static_cast<int>(mf.z(mt));
#pragma unroll
        for (int col = 0; col < M; ++col) {
          int c = 0;
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            c = __dp2a_lo(static_cast<int>(xw[col][p / 2][2 * (p % 2)]), static_cast<int>(q[p]), c);
            c = __dp2a_hi(static_cast<int>(xw[col][p / 2][2 * (p % 2) + 1]), static_cast<int>(q[p]), c);
          }
          acc[col][r] = fmaf(scale, static_cast<float>(z * nv[col] + c), acc[col][r]);
        }
      }
    }
    if (tile + gridDim.x >= tiles) pdl_launch_dependents();   // the CTA's last tile
    // The warp's row sums: reduce-scatter to one (row, column) per lane, then the m16n8 fragment layout of
    // store_tc_fragments (lane (g, t): rows g / g + 8, columns 2t / 2t + 1).
    float v[32];
#pragma unroll
    for (int i = 0; i < 16 * M; ++i) v[i] = acc[i / 16][i % 16] * sx[i / 16];
    float frag[4];
    const int g = lane / 4, t = lane % 4;
    if constexpr (M == 2) {   // index 16 col + row at lane index
      dp_scatter_step<32, 16>(v, lane);
      dp_scatter_step<16, 8>(v, lane);
      dp_scatter_step<8, 4>(v, lane);
      dp_scatter_step<4, 2>(v, lane);
      dp_scatter_step<2, 1>(v, lane);
      frag[0] = __shfl_sync(0xffffffffu, v[0], g);
      frag[1] = __shfl_sync(0xffffffffu, v[0], 16 + g);
      frag[2] = __shfl_sync(0xffffffffu, v[0], g + 8);
      frag[3] = __shfl_sync(0xffffffffu, v[0], 24 + g);
    } else {   // row (lane >> 1) at lanes 2 row, 2 row + 1
      dp_scatter_step<16, 16>(v, lane);
      dp_scatter_step<8, 8>(v, lane);
      dp_scatter_step<4, 4>(v, lane);
      dp_scatter_step<2, 2>(v, lane);
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
      frag[0] = __shfl_sync(0xffffffffu, v[0], 2 * g);
      frag[1] = 0.0f;
      frag[2] = __shfl_sync(0xffffffffu, v[0], 2 * (g + 8));
      frag[3] = 0.0f;
    }
    if (t != 0) frag[0] = frag[1] = frag[2] = frag[3] = 0.0f;
    // The fused outliers with four passes' loads in flight (add_outlier_partials' kPasses, mma.cuh), batch columns < M.
    store_tc_fragments<kWarps, kFusedOutliers, 4, M>(frag, warp, lane, row0, w.n, m_total, w.rowptr, OutlierX{x, k, 1}, P.y[part],
                                                    MixedOutlierEntry{w}, buf, obound);
    buf ^= 1;
  }
  cp_async_wait<0>();   // no copy outlives the CTA
}

// An activation kernel (mixed24a_dp_x_kernel, mixed24a_mma_x_kernel) over `groups` stored groups, M batch columns and
// the parts.
template <typename Kernel>
void launch_group_x(Kernel kern, int64_t groups, int M, const DpParts& P, const float* x, int m, cudaStream_t s, uint8_t* xq,
                    const float* xmax) {
  const dim3 xgrid(static_cast<unsigned>((groups + kDpXThreads - 1) / kDpXThreads), static_cast<unsigned>(M), static_cast<unsigned>(P.parts));
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  launch_pdl(kPdlXfrag, kern, xgrid, kDpXThreads, 0, s, P, x, m, M, vec, xq, xmax);
}

template <int M, int kStages, int kWarps>
void launch_dp_kernel(const DpParts& P, const float* x, int m, cudaStream_t s, bool fused, const uint8_t* xq) {
  const size_t smem = static_cast<size_t>(kWarps) * DpStage<M, kStages>::kWarpBytes;
  auto kern = fused ? mixed24a_gemv_dp_kernel<M, kStages, kWarps, true> : mixed24a_gemv_dp_kernel<M, kStages, kWarps, false>;
  launch_pdl(kPdlMixed, kern, persistent_grid(kern, kWarps * 32, smem, P.tile_start[P.parts]), kWarps * 32, smem, s, P, x, m, xq);
}

template <int M>
void launch_dp(const DpParts& P, const float* x, int m, cudaStream_t s, bool fused, uint8_t* xq, const float* xmax) {
  launch_group_x(mixed24a_dp_x_kernel, dp_groups(P.w[0].k), M, P, x, m, s, xq, xmax);
  launch_dp_kernel<M, kDpStages, kDpWarps>(P, x, m, s, fused, xq);
}

DpParts dp_parts(const Mixed24ADevice* ws, int parts, float* const* ys) {
  DpParts P{};
  P.parts = parts;
  for (int p = 0; p < parts; ++p) {
    P.w[p] = ws[p];
    P.y[p] = ys[p];
    P.tile_start[p + 1] = P.tile_start[p] + (ws[p].n + 15) / 16;
  }
  for (int p = parts; p < kDpMaxParts; ++p) P.tile_start[p + 1] = P.tile_start[p];
  return P;
}

// The integer-dot GEMV over parts sharing x (each checked by the caller: mixed24a_dp_fits, the same k).
void run_dp(const Mixed24ADevice* ws, int parts, const float* x, int m, float* const* ys, cudaStream_t s, bool fused, void* xq,
            const float* xmax) {
  const DpParts P = dp_parts(ws, parts, ys);
  auto* q = static_cast<uint8_t*>(xq);
  if (m == 1) launch_dp<1>(P, x, m, s, fused, q, xmax);
  else launch_dp<2>(P, x, m, s, fused, q, xmax);
  for (int p = 0; p < parts; ++p)
    if (!fused && ws[p].rowptr != nullptr) launch_outliers(ws[p], x, m, ys[p], s);
}


// ---------------------------------------------------------------------------------------------------------------
// The int8 tensor-core 2/4/16 GEMV (GemvPath::Int8MmaStream; batch 1..8, kernel_choice.h's at 3..kMixedMmaMaxBatch; k a
// multiple of 256 and >= 1024; over 1..3 matrices sharing x, as the integer-dot GEMV).
//
// Why: at batch 4..8 the streamed fp16 tensor-core kernel above ran at 0.15-0.19 of the copy bandwidth on the 70B
// shapes, slower than cuBLAS fp16 (H200, docs/PERF.md): per lane and group it spends ~45 instructions (A = q - z in
// fp16, the group scales, two mma, four FFMA) at 141-173 registers (two or three CTAs per SM); and the integer-dot
// kernel's cost grows by 11 instructions per 16 weights and batch column. Here the codes are the A operand of
// mma.sync m16n8k16 s8 as stored (one shift and one AND per register, the k order of the integer-dot kernel: 2-bit
// byte b of lane t = code 4b + t; 4-bit code 8 (t / 2) + 2b + t % 2), and the activations the B operand as the int8
// pieces of int8_tables.h (x ~ s (hi + lo / 254), s = max|x| / 127 per batch column): B column 2c + p is piece p of batch
// column 4j + c (slot j: batch 5..8 take a second mma with the same A), so C holds each (row, batch column)'s exact
// int32 sums sum q hi and sum q lo of the group. The zero point leaves as in the integer-dot kernel, v = 254 C_hi + C_lo
// - z V with V = sum (254 hi + lo) of the group, and the group's scale (sc * ss + sm) multiplies v once in fp32. The
// mma fragment puts each (row, group) in four lanes, so the scales and zero points of a work item's 16 rows x 16 groups
// are decoded first, each by one lane, into a per-warp shared table (float scale, int z) the mma loop reads back.
//
// Memory side as the streamed kernels: persistent CTAs of 4 warps, each warp streaming its work items (tile, chunk of 4
// units) through a private 2-stage cp.async ring. A stage holds the chunk's code words of the tile's 16 rows
// (MixedStage's layout), its second-order scales, the B words of the chunk (per unit [lane][group][slot]) and V of every
// batch column; the tile's end hands the warps' fragments to store_tc_fragments (their sums, the fused outliers, the store).
//
// Measured (H200, docs/PERF.md): at batch 3..4 0.64-0.74x the streamed fp16 kernel's time on the 70B shapes
// (1.31-1.44x cuBLAS fp16 dense), slower on 4096x4096; at batch 5..8 no faster than it. ncu (28672x8192, batch 4 / 8):
// the L1 / shared-memory pipe 79-81% busy, issue slots 50%, 595 instructions per work item (of which ~250 the ring's
// bookkeeping and the scale pass).
constexpr int kMmaWarps = 4;
constexpr int kMmaStages = 2;
constexpr int kMmaUnits = 4;               // units (64 columns) per work item: 16 groups
// The per-warp scratch of the decoded (scale, z) pairs: [group][row % 8][row / 8] float scale, int z, so that lane (g, t)
// reads rows g and g + 8 of a group in one 16-byte load (the 8 lanes' loads one 128-byte wavefront); a group takes 144
// bytes (128 and 16 of padding, so that the scale pass's stores of 16 groups spread over the banks).
constexpr int kMmaScrGroup = 144;
constexpr int kMmaXHeaderBytes = 256;      // the x scratch: float scale[kMaxGemvBatch], padded; then B words, then V

__host__ __device__ constexpr int mma_batch_form(int m) { return m <= 4 ? 4 : 8; }

template <int M>
struct MmaStage {
  static constexpr int kSlots = M / 4;
  static constexpr int kQa = 0;                    // [unit][16 rows] uint4
  static constexpr int kQb = kQa + 16 * 16 * kMmaUnits;   // [16 rows][unit] u32
  static constexpr int kM2 = kQb + 16 * 4 * kMmaUnits;    // [16 rows][unit] u16
  static constexpr int kM4 = kM2 + 16 * 2 * kMmaUnits;    // [16 rows][unit] u8
  static constexpr int kSs2 = kM4 + 16 * kMmaUnits;       // [3 units' groups] half
  static constexpr int kSm2 = kSs2 + 6 * kMmaUnits;
  static constexpr int kSs4 = kSm2 + 6 * kMmaUnits;       // [unit] half
  static constexpr int kSm4 = kSs4 + 2 * kMmaUnits;
  static constexpr int kX = kSm4 + 2 * kMmaUnits;         // [unit][lane][group][slot] u32
  static constexpr int kV = kX + 512 * kMmaUnits * kSlots;   // [batch column][16 groups] int32
  static constexpr int kBytes = kV + 64 * M;
  static constexpr int kScrBytes = 16 * kMmaScrGroup;
  static constexpr int kWarpBytes = kMmaStages * kBytes + kScrBytes;
  static_assert(kX % 16 == 0 && kV % 16 == 0 && kBytes % 16 == 0, "16-byte copies");
};

// The u32 index of the B word of (part, unit u, lane, group gs of the unit, slot j).
__host__ __device__ constexpr int64_t mma_x_word(int64_t part, int64_t U, int64_t u, int lane, int gs, int j, int slots) {
  return (((part * U + u) * 32 + lane) * 4 + gs) * slots + j;
}

// One thread per (part, batch column col < M, group G): the group's 16 activations (mixed_group_x) as int8 pieces in the
// B words of lanes 4 (2 (col % 4) + p) + t, slot col / 4, and their sum V; columns >= m are zero.
__global__ void __launch_bounds__(kDpXThreads) mixed24a_mma_x_kernel(const __grid_constant__ DpParts P, const float* __restrict__ x,
                                                                    int m, int M, bool vec, uint8_t* __restrict__ xq,
                                                                    const float* __restrict__ xmax) {
  pdl_launch_dependents();
  pdl_wait();
  const int col = static_cast<int>(blockIdx.y), part = static_cast<int>(blockIdx.z);
  const Mixed24ADevice& w = P.w[part];
  const int64_t k = w.k, U = k / 64, Gn = 4 * U;
  const int64_t G = static_cast<int64_t>(blockIdx.x) * kDpXThreads + threadIdx.x;
  float xv[16];
  const float s = mixed_group_x(w, x, col, m, part, G, col < m && G < Gn, vec, xq, xmax, xv);
  if (G >= Gn) return;
  uint32_t hi[16], lo[16];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    int8_t h, l;
    i8_x_pieces(xv[i], s, h, l);
    hi[i] = static_cast<uint8_t>(h);
    lo[i] = static_cast<uint8_t>(l);
    sum += static_cast<int>(kI8LoSteps) * h + l;
  }
  const int slots = M / 4, j = col / 4, c = col % 4, gs = static_cast<int>(G % 4);
  const int64_t u = G / 4;
  uint32_t* words = reinterpret_cast<uint32_t*>(xq + kMmaXHeaderBytes);
  auto put = [&](auto four) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      uint32_t wh = 0, wl = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int code = decltype(four)::value ? 8 * (t / 2) + 2 * b + t % 2 : 4 * b + t;
        wh |= hi[code] << (8 * b);
        wl |= lo[code] << (8 * b);
      }
      words[mma_x_word(part, U, u, 4 * (2 * c) + t, gs, j, slots)] = wh;
      words[mma_x_word(part, U, u, 4 * (2 * c + 1) + t, gs, j, slots)] = wl;
    }
  };
  if (gs == 3) put(std::true_type{});
  else put(std::false_type{});
  int32_t* V = reinterpret_cast<int32_t*>(xq + kMmaXHeaderBytes + static_cast<size_t>(P.parts) * U * 512 * slots);
  V[(static_cast<int64_t>(part) * M + col) * Gn + G] = sum;
}

template <int M, int kWarps, bool kFusedOutliers>
__global__ void __launch_bounds__(kWarps * 32, 4) mixed24a_gemv_mma_kernel(const __grid_constant__ DpParts P,
                                                                             const float* __restrict__ x, int m_total,
                                                                             const uint8_t* __restrict__ xq) {
  static_assert(M == 4 || M == 8, "batch forms 4 and 8");
  using S = MmaStage<M>;
  constexpr int kSlots = S::kSlots;
  extern __shared__ __align__(16) unsigned char mma_smem[];
  const int64_t k = P.w[0].k, U = k / 64, C = U / kMmaUnits, tiles = P.tile_start[P.parts];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const uint32_t wbase = static_cast<uint32_t>(__cvta_generic_to_shared(mma_smem)) + warp * S::kWarpBytes;
  StreamRing<kMmaStages, kWarps> ring(wbase, S::kBytes, tiles, C, warp);
  const uint32_t scr = wbase + kMmaStages * S::kBytes;
  const uint4* xwords = reinterpret_cast<const uint4*>(xq + kMmaXHeaderBytes);
  const uint4* xsums = reinterpret_cast<const uint4*>(xq + kMmaXHeaderBytes + static_cast<size_t>(P.parts) * U * 512 * kSlots);
  // Element offsets in 32 bits (mixed24a_mma_fits: n * k / 64 < 2^31).
  const int32_t U32 = static_cast<int32_t>(U), Gn32 = 4 * U32;
  auto issue_weights = [&] {
    const uint32_t st = ring.issue_stage();
    const int part = P.part_of(ring.it_tile);
    const Mixed24ADevice& w = P.w[part];
    const int32_t n32 = static_cast<int32_t>(w.n), lt = static_cast<int32_t>(ring.it_tile - P.tile_start[part]);
    const int32_t u0 = ring.it_item * kMmaUnits;
#pragma unroll
    for (int c = 0; c < 2; ++c) {   // qa: 64 (unit, row) words of 16 bytes
      const int idx = lane + 32 * c, uu = idx / 16, r = idx % 16;
      const int32_t row = min(lt * 16 + r, n32 - 1);
      cp_async(st + S::kQa + 16 * idx, w.qa + static_cast<uint32_t>(row * U32 + u0 + uu), 16);
    }
    const int r = lane % 16;
    const uint32_t e = static_cast<uint32_t>(min(lt * 16 + r, n32 - 1) * U32 + u0);
    if (lane < 16) {
      cp_async(st + S::kQb + 16 * r, w.qb + e, 16);
      cp_async(st + S::kM4 + 4 * r, w.meta4 + e, 4);
    } else {
      cp_async(st + S::kM2 + 8 * r, w.meta2 + e, 8);
      const uint32_t e2 = static_cast<uint32_t>(lt * 3 * U32 + 3 * u0), e4 = static_cast<uint32_t>(lt * U32 + u0);
      if (r < 3) cp_async(st + S::kSs2 + 8 * r, w.ss2 + e2 + 4 * r, 8);
      else if (r < 6) cp_async(st + S::kSm2 + 8 * (r - 3), w.sm2 + e2 + 4 * (r - 3), 8);
      else if (r == 6) cp_async(st + S::kSs4, w.ss4 + e4, 8);
      else if (r == 7) cp_async(st + S::kSm4, w.sm4 + e4, 8);
    }
  };
  auto issue_x = [&] {   // the chunk's B words (2 KB per slot) and V of every batch column (64 bytes each)
    const uint32_t st = ring.issue_stage();
    const int part = P.part_of(ring.it_tile);
    const int32_t u0 = ring.it_item * kMmaUnits;
    const uint4* src = xwords + static_cast<uint32_t>((part * U32 + u0) * 32 * kSlots);
#pragma unroll
    for (int c = 0; c < 4 * kSlots; ++c) cp_async(st + S::kX + 16 * (lane + 32 * c), src + (lane + 32 * c), 16);
    if (lane < 4 * M)
      cp_async(st + S::kV + 16 * lane, xsums + static_cast<uint32_t>(((part * M + lane / 4) * Gn32 + 4 * u0) / 4 + lane % 4), 16);
  };
  ring.prologue(issue_weights, issue_x);   // xq and y belong to the kernels before
  float sx[kSlots];   // the scales of the lane's batch columns t + 4 j
#pragma unroll
  for (int j = 0; j < kSlots; ++j) sx[j] = __ldg(reinterpret_cast<const float*>(xq) + t + 4 * j) * (1.0f / kI8LoSteps);
  // The scale pass's lane: group gq of the item (unit gq / 4, group gq % 4), rows 8 h .. 8 h + 7; its meta word, field
  // positions and second-order scale offsets (as the integer-dot kernel's).
  const int gq = lane % 16, h = lane / 16, uq = gq / 4, sq = gq % 4;
  const bool two = sq < 3;
  const uint32_t mbase = two ? S::kM2 + 4 * (uq / 2) : S::kM4, mstride = two ? 8 : 4;
  const MetaFields mf(sq, two ? 16 * (uq % 2) : 8 * uq);
  const uint32_t off_ss = two ? S::kSs2 + 2 * (3 * uq + sq) : S::kSs4 + 2 * uq, off_sm = two ? S::kSm2 + 2 * (3 * uq + sq) : S::kSm4 + 2 * uq;
  const uint32_t sh2 = 2 * t, sh4 = 4 * (t % 2);
  int buf = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const auto [part, w, row0, obound] = PartTile<kFusedOutliers>(P, tile, warp, lane);
    float acc[kSlots][2];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) acc[j][0] = acc[j][1] = 0.0f;
    for (int64_t ci = warp; ci < C; ci += kWarps) {
      const uint32_t st = ring.next(issue_weights, issue_x);   // its first __syncwarp: every lane is done with the scratch too
      {
        const float ss = lds_half(st + off_ss), sm = lds_half(st + off_sm);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int r = 8 * h + i;
          const uint32_t mt = lds_u32(st + mbase + r * mstride);
          const float scale = fmaf(static_cast<float>(mf.sc(mt)), ss, sm);
          const uint32_t z = mf.z(mt);
          asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(scr + gq * kMmaScrGroup + 16 * i + 8 * h), "r"(__float_as_uint(scale)), "r"(z)
                       : "memory");
        }
      }
      __syncwarp();
#pragma unroll
      for (int uu = 0; uu < kMmaUnits; ++uu) {
        uint32_t qa0[4], qa1[4], xb[4 * kSlots], vv[kSlots][4];
        lds_u32x4(st + S::kQa + 16 * (uu * 16 + g), qa0);
        lds_u32x4(st + S::kQa + 16 * (uu * 16 + g + 8), qa1);
        const uint32_t qb0 = lds_u32(st + S::kQb + 4 * (g * kMmaUnits + uu)), qb1 = lds_u32(st + S::kQb + 4 * ((g + 8) * kMmaUnits + uu));
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
          lds_u32x4(st + S::kX + 16 * ((uu * 32 + lane) * kSlots + j), reinterpret_cast<uint32_t(&)[4]>(xb[4 * j]));
          lds_u32x4(st + S::kV + 64 * (t + 4 * j) + 16 * uu, vv[j]);
        }
        const uint32_t w40 = t < 2 ? qa0[3] : qb0, w41 = t < 2 ? qa1[3] : qb1;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t a[2];
          if (s < 3) {
            a[0] = (qa0[s] >> sh2) & 0x03030303u;
            a[1] = (qa1[s] >> sh2) & 0x03030303u;
          } else {
            a[0] = (w40 >> sh4) & 0x0F0F0F0Fu;
            a[1] = (w41 >> sh4) & 0x0F0F0F0Fu;
          }
          uint32_t sz[4];   // (scale, z) of rows g, g + 8
          lds_u32x4(scr + (4 * uu + s) * kMmaScrGroup + 16 * g, sz);
#pragma unroll
          for (int j = 0; j < kSlots; ++j) {
            int cc[4];
            mma_s8_16816_zero(cc, a, xb[s * kSlots + j]);   // the lane's B words are [group][slot]
            const int nv = static_cast<int>(vv[j][s]);
            const int v0 = cc[0] * static_cast<int>(kI8LoSteps) + cc[1] - static_cast<int>(sz[1]) * nv;
            const int v1 = cc[2] * static_cast<int>(kI8LoSteps) + cc[3] - static_cast<int>(sz[3]) * nv;
            acc[j][0] = fmaf(__uint_as_float(sz[0]), static_cast<float>(v0), acc[j][0]);
            acc[j][1] = fmaf(__uint_as_float(sz[2]), static_cast<float>(v1), acc[j][1]);
          }
        }
      }
    }
    if (tile + gridDim.x >= tiles) pdl_launch_dependents();   // the CTA's last tile
    // Lane (g, t) holds rows g / g + 8 of batch columns t + 4 j; store_tc_fragments takes columns 2t / 2t + 1 of slot t / 2.
    float frag[4];
    {
      const int t0 = 4 * g + (2 * t) % 4, t1 = 4 * g + (2 * t + 1) % 4, jj = t / 2;
      float v[kSlots][4];
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const float a0 = acc[j][0] * sx[j], a1 = acc[j][1] * sx[j];
        v[j][0] = __shfl_sync(0xffffffffu, a0, t0);
        v[j][1] = __shfl_sync(0xffffffffu, a0, t1);
        v[j][2] = __shfl_sync(0xffffffffu, a1, t0);
        v[j][3] = __shfl_sync(0xffffffffu, a1, t1);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) frag[i] = kSlots == 2 ? (jj ? v[kSlots - 1][i] : v[0][i]) : (jj ? 0.0f : v[0][i]);
    }
    store_tc_fragments<kWarps, kFusedOutliers, 4, M>(frag, warp, lane, row0, w.n, m_total, w.rowptr, OutlierX{x, k, 1}, P.y[part],
                                                    MixedOutlierEntry{w}, buf, obound);
    buf ^= 1;
  }
  cp_async_wait<0>();   // no copy outlives the CTA
}

template <int M>
void launch_mma(const DpParts& P, const float* x, int m, cudaStream_t s, bool fused, uint8_t* xq, const float* xmax) {
  launch_group_x(mixed24a_mma_x_kernel, P.w[0].k / 16, M, P, x, m, s, xq, xmax);
  const size_t smem = static_cast<size_t>(kMmaWarps) * MmaStage<M>::kWarpBytes;
  auto kern = fused ? mixed24a_gemv_mma_kernel<M, kMmaWarps, true> : mixed24a_gemv_mma_kernel<M, kMmaWarps, false>;
  launch_pdl(kPdlMixed, kern, persistent_grid(kern, kMmaWarps * 32, smem, P.tile_start[P.parts]), kMmaWarps * 32, smem, s, P, x, m, xq);
}

// The int8 tensor-core GEMV over parts sharing x (each checked by the caller: mixed24a_mma_fits, the same k).
void run_mma(const Mixed24ADevice* ws, int parts, const float* x, int m, float* const* ys, cudaStream_t s, bool fused, void* xq,
             const float* xmax) {
  const DpParts P = dp_parts(ws, parts, ys);
  auto* q = static_cast<uint8_t*>(xq);
  if (m <= 4) launch_mma<4>(P, x, m, s, fused, q, xmax);
  else launch_mma<8>(P, x, m, s, fused, q, xmax);
  for (int p = 0; p < parts; ++p)
    if (!fused && ws[p].rowptr != nullptr) launch_outliers(ws[p], x, m, ys[p], s);
}

}  // namespace

namespace {
size_t frag_part_bytes(int64_t k) { return static_cast<size_t>(k / 64) * 4 * 32 * sizeof(uint4); }
float* frag_xt(void* xfrag, int64_t k) { return reinterpret_cast<float*>(static_cast<char*>(xfrag) + frag_part_bytes(k)); }
}  // namespace

// The fragments, then x transposed [k, kXtColumns] (the fused outliers' gathers).
size_t mixed24a_xfrag_bytes(int64_t k) { return frag_part_bytes(k) + static_cast<size_t>(k) * kXtColumns * sizeof(float); }

size_t mixed24a_dp_x_bytes(int64_t k, int m, int parts) {
  return kDpXHeaderBytes + static_cast<size_t>(parts) * static_cast<size_t>(m) * static_cast<size_t>(dp_groups(k)) * 36;
}

size_t mixed24a_mma_x_bytes(int64_t k, int m, int parts) {
  const int M = mma_batch_form(m);
  return kMmaXHeaderBytes + static_cast<size_t>(parts) * static_cast<size_t>(k / 16) * (128 * (M / 4) + 4 * M);
}

void mixed24a_gemv_group(const Mixed24ADevice* ws, int parts, const float* x, int m, float* const* ys, cudaStream_t s,
                         OutlierMode mode, void* xfrag, const float* xmax) {
  LOWBIT_CHECK(parts >= 1 && parts <= kDpMaxParts && xfrag != nullptr, "mixed24a grouped GEMV: 1..", kDpMaxParts,
               " matrices and an xfrag scratch (asked: ", parts, xfrag == nullptr ? ", no xfrag" : "", ")");
  // The integer-dot GEMV at batch 1..2, the int8 tensor-core GEMV at 3..8 (kernel_choice.h's for a single matrix).
  const bool dp = m <= 2;
  for (int p = 0; p < parts; ++p)
    LOWBIT_CHECK(ws[p].k == ws[0].k && (dp ? mixed24a_dp_fits(ws[p].n, ws[p].k, m) : mixed24a_mma_fits(ws[p].n, ws[p].k, m)),
                 "mixed24a grouped GEMV: every matrix needs the same k, a multiple of 256 and >= 1024, batch 1..", kMaxGemvBatch,
                 " (asked: part ", p, " ", ws[p].n, "x", ws[p].k, ", batch ", m, ")");
  if (dp) run_dp(ws, parts, x, m, ys, s, mode == OutlierMode::Fused, xfrag, xmax);
  else run_mma(ws, parts, x, m, ys, s, mode == OutlierMode::Fused, xfrag, xmax);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void mixed24a_gemv(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s, OutlierMode mode,
                   GemvPath path, void* xfrag, const float* xmax) {
  const bool fused = mode == OutlierMode::Fused;
  LOWBIT_CHECK(m >= 1 && m <= kMaxGemvBatch, "mixed24a GEMV: batch ", m, " outside 1..", kMaxGemvBatch);
  LOWBIT_CHECK(!is_register_table(path) && path != GemvPath::TensorCoreInt8LutStream && path != GemvPath::TensorCoreSharedLutStream,
               "mixed24a GEMV: register tables are an any-precision path (as are the int8 and shared tables)");
  if (path == GemvPath::TensorCoreStream)
    LOWBIT_CHECK(xfrag != nullptr && mixed24a_stream_fits(w.n, w.k, m), "mixed24a GEMV: the streamed tensor-core kernel needs ",
                 "pre-split activations and k a multiple of 256, >= 1024 (asked: ", w.n, "x", w.k, xfrag == nullptr ? ", no xfrag" : "", ")");
  if (path == GemvPath::Dp2aStream)
    LOWBIT_CHECK(xfrag != nullptr && mixed24a_dp_fits(w.n, w.k, m), "mixed24a GEMV: the integer-dot kernel needs an xfrag scratch, ",
                 "batch 1..2 and k a multiple of 256, >= 1024 (asked: ", w.n, "x", w.k, ", batch ", m, xfrag == nullptr ? ", no xfrag" : "", ")");
  if (path == GemvPath::Int8MmaStream)
    LOWBIT_CHECK(xfrag != nullptr && mixed24a_mma_fits(w.n, w.k, m), "mixed24a GEMV: the int8 tensor-core kernel needs an xfrag ",
                 "scratch and k a multiple of 256, >= 1024 (asked: ", w.n, "x", w.k, xfrag == nullptr ? ", no xfrag" : "", ")");
  if (path == GemvPath::Auto) path = mixed24a_auto_path(w.n, w.k, m, xfrag != nullptr);
  if (path == GemvPath::Dp2aStream || path == GemvPath::Int8MmaStream) {
    (path == GemvPath::Dp2aStream ? run_dp : run_mma)(&w, 1, x, m, &y, s, fused, xfrag, xmax);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  uint4* xf = static_cast<uint4*>(xfrag);
  // x transposed for the fused outliers' gathers, written by the fragment kernel only when they run
  float* xt = xfrag != nullptr && fused && w.rowptr != nullptr ? frag_xt(xfrag, w.k) : nullptr;
  if (path == GemvPath::TensorCoreStream) {
    const int64_t entries = (w.k / 64) * 4 * 32;
    launch_pdl(kPdlMixed, mixed24a_xfrag_kernel<false>, static_cast<unsigned>((entries + 255) / 256), 256, 0, s, w, x, m, xf, xt);
    if (m == 1) launch_stream<1>(w, x, m, y, s, fused, xf, xt);
    else if (m == 2) launch_stream<2>(w, x, m, y, s, fused, xf, xt);
    else if (m <= 4) launch_stream<4>(w, x, m, y, s, fused, xf, xt);
    else launch_stream<8>(w, x, m, y, s, fused, xf, xt);
    if (!fused && w.rowptr != nullptr)
      launch_outliers(w, x, m, y, s);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  if (path == GemvPath::TensorCore) {
    const unsigned grid = static_cast<unsigned>((w.n + 15) / 16);
    if (xf != nullptr) {
      const int64_t entries = (w.k / 64) * 4 * 32;
      launch_pdl(kPdlMixed, mixed24a_xfrag_kernel<false>, static_cast<unsigned>((entries + 255) / 256), 256, 0, s, w, x, m, xf, xt);
      auto kern = fused ? mixed24a_gemv_tc_kernel<true, true> : mixed24a_gemv_tc_kernel<false, true>;
      launch_pdl(kPdlMixed, kern, grid, kTcWarps * 32, 0, s, w, x, m, y, xf, static_cast<const float*>(xt));
    } else {
      auto kern = fused ? mixed24a_gemv_tc_kernel<true, false> : mixed24a_gemv_tc_kernel<false, false>;
      launch_pdl(kPdlMixed, kern, grid, kTcWarps * 32, 0, s, w, x, m, y, static_cast<const uint4*>(nullptr),
                 static_cast<const float*>(nullptr));
    }
    if (!fused && w.rowptr != nullptr)
      launch_outliers(w, x, m, y, s);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  if (!dispatch_int<1, 2, 3, 4, 5, 6, 7, 8>(m, [&](auto mm) { launch<decltype(mm)::value>(w, x, y, s, fused); }))
    fail("mixed24a GEMV: batch ", m, " outside 1..", kMaxGemvBatch);
  if (!fused && w.rowptr != nullptr)
    launch_outliers(w, x, m, y, s);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void mixed24a_gemv_two_tiles(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s, void* xfrag) {
  LOWBIT_CHECK(m > kMaxGemvBatch && m <= 2 * kMaxGemvBatch && xfrag != nullptr && mixed24a_stream_fits(w.n, w.k, kMaxGemvBatch),
               "mixed24a two-tile GEMV: batch 9..16, an xfrag scratch and k a multiple of 256, >= 1024 (asked: ", w.n, "x",
               w.k, ", batch ", m, ")");
  uint4* xf = static_cast<uint4*>(xfrag);
  const int64_t entries = (w.k / 64) * 4 * 32;
  launch_pdl(kPdlMixed, mixed24a_xfrag_kernel<true>, static_cast<unsigned>((entries + 255) / 256), 256, 0, s, w, x, m, xf,
             static_cast<float*>(nullptr));
  const size_t smem = static_cast<size_t>(kStreamWarps) * MixedStage<8>::kWarpBytes;
  auto kern = mixed24a_gemv_stream_kernel<false, 8, true>;
  launch_pdl(kPdlMixed, kern, persistent_grid(kern, kStreamWarps * 32, smem, (w.n + 15) / 16), kStreamWarps * 32, smem, s,
             w, x, m, y, static_cast<const uint4*>(xf), static_cast<const float*>(nullptr));
  if (w.rowptr != nullptr)
    launch_outliers(w, x, m, y, s);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void mixed24a_dequant_f16(const Mixed24ADevice& w, __half* out, cudaStream_t s) {
  const size_t smem = sizeof(__half) * static_cast<size_t>(w.k);
  LOWBIT_CHECK(smem <= 200 * 1024, "mixed24a dequantize: rows of ", w.k, " columns exceed the ", 100 * 1024, " it supports");
  // 128 threads: a thread per unit of a 8192-wide row (rows of 4096 leave half of them to the copy-out alone).
  const int per_sm = stream_blocks_per_sm(mixed24a_dequant_kernel, 128, smem);   // raises the shared-memory limit too
  const int64_t blocks = std::min<int64_t>(w.n, static_cast<int64_t>(per_sm) * device_sm_count());
  mixed24a_dequant_kernel<<<static_cast<unsigned>(blocks), 128, smem, s>>>(w, out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
