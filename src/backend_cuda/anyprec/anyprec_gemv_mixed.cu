// The mixed-width any-precision GEMV: y[r] = x[r] · W_{b_r}ᵀ with each activation row r at its own width b_r, the
// planes 0..B-1 of the widest width B = max_bits read once for every row (a decode step of requests served at 3, 4 and
// 8 bits costs one pass over the 8-bit planes instead of three GEMVs).
//
// Why one pass serves every width: the b-bit code of a weight is the top b bits of its parent code (planes 0..b-1,
// plane 0 the most significant), so code_b = code_B >> (B - b), and the value is lut[b][row][code_b]. A weight's B-bit
// code is decoded once (transpose_codes<B>, as the single-width kernels do); each width present then takes one lookup.
//
// The widths come from device memory (row_bits [m]), read by the kernels after pdl_wait(): a captured decode graph
// changes them between replays with nothing re-captured, and they may be written by a kernel before this one. So the
// tables, which depend on which widths are present, are built after the wait, and only the first plane words (weights)
// are loaded before it. A width this weight does not serve, or above B, gives NaN for its row's outputs: a caller
// error made loud instead of a silently wrong row.
// Only the planes of the widest width present, D <= B, are read (after the first group): planes D..B-1 are taken as
// zero, which leaves the top D bits of every B-bit code, and so every present width's code, as they are. A graph
// captured once at the widest served width then reads, at each replay, what that step's widest row needs.
//
// Tensor cores (the default): one CTA of 4 warps computes 16 rows over all of k, as the single-width shared-table
// kernel (anyprec_gemv.cu): lane (g, t) takes word 4q + t of quad q from planes 0..B-1 of rows g and g + 8, slab j of
// the word feeds k slots 2t, 2t+1, 2t+8, 2t+9 from word bits 4j..4j+3, and the activations of batch column g are split
// into fp16 hi + lo halves (in the loop, or read pre-split from the xfrag scratch, the fast form: the single-width
// kernel at 8 bits, 28672x8192, batch 8 took 153.9 us pre-split against 268.9 splitting in its loop, H200,
// docs/results/gemv-kernels-h200.txt). For each width d present, A_d holds
// the fp16 centroids of width d and the lane's B fragment is its column's activations when the column is at width d,
// zero otherwise: C += A_d B_d over the widths present sums, for each column, exactly its own width's products (the
// other widths add zeros). A column's result is therefore the single-width kernel's, order of accumulation aside.
// A_d comes from registers for widths 2..4 (the register-table kernel's PRMT lookups, anyprec_codes.cuh: a row's 2^d
// centroids as byte planes, four codes per PRMT) and from shared memory for 5..8 (one LDS per weight; the [2^d][8][4]
// word layout of the shared-table kernel, rows g and g + 8 in one word, 32 banks per warp-wide lookup). Shared memory
// is sized for every width 5..B being present (the launch cannot know which are): 60 KB at B = 8, three CTAs per SM.
// Four accumulator chains (slab parity x hi / lo) keep the tensor pipe's latency off the path of 2 x 8 x widths mma
// per word.
//
// CUDA cores (GemvPath::Scalar): the single-width CUDA-core kernel's structure (one warp per row, lane t owning word t
// of each 32-word tile, codes of four quarters at a time) with one interleaved-copy table per distinct width present
// and row; per weight one lookup per distinct width, then each batch row selects its width's value (a compile-time
// chain over the distinct widths: the kernel branches once, on how many there are, to a loop built for that count).
// At batch 8 it is bound by its activation loads as the single-width CUDA-core kernel is (same file: 8-bit 28672x8192
// 504.2 us against the tensor cores' 153.9), so it is a choice for tests and measurements, not the default.
//
// Sparse outliers are fused in both: per CSR entry the B-bit code is read once from the planes, and each batch row
// adds (val - lut[b_r][row][code_b]) * x[r][c] at its own width.
#include <cmath>
#include <map>
#include <mutex>

#include "backend_cuda/anyprec/anyprec.h"
#include "backend_cuda/anyprec/anyprec_codes.cuh"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/common/mma.cuh"
#include "backend_cuda/common/stream.cuh"

namespace lowbit::cuda {
namespace {

constexpr int kMinWidth = 2;   // kAnyPrecMinBits

// The width row mm of the batch runs at: row_bits[mm] when this weight serves it and it is at most B, else 0 (that
// row's outputs are then NaN).
template <int B>
__device__ __forceinline__ int row_width(const AnyPrecDevice& w, const int32_t* __restrict__ row_bits, int mm) {
  const int d = row_bits[mm];
  return d >= kMinWidth && d <= B && ((w.widths >> d) & 1u) != 0 ? d : 0;
}

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }

// Raises a kernel's dynamic shared-memory limit to smem (which, with its static shared memory, passes 48 KB), once
// per kernel and size: a captured launch after the first makes no such call.
void allow_dynamic_smem(const void* kern, size_t smem) {
  static std::mutex mu;
  static std::map<const void*, size_t> allowed;
  std::lock_guard<std::mutex> lock(mu);
  size_t& lim = allowed[kern];
  if (smem > lim) {
    LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    lim = smem;
  }
}

// f(integral_constant<int, d>) for d = First..Last, each a compile-time width.
template <int First, int Last, typename F>
__device__ __forceinline__ void for_widths(F&& f) {
  if constexpr (First <= Last) {
    f(std::integral_constant<int, First>{});
    for_widths<First + 1, Last>(f);
  }
}

// The fused outliers of rows row_a .. row_a + kRows - 1 (those below n), batch columns 0..M-1 at widths wid[mm] (0: the
// column is skipped): lane partial sums added to acc[r][mm]. The loop of add_outlier_partials (mma.cuh), whose entry
// coefficient is one for every column; here each column takes its width's, the entry's B-bit code read once.
template <int B, int kRows, int M>
__device__ __forceinline__ void add_mixed_outlier_partials(const AnyPrecDevice& w, int64_t row_a, const float* __restrict__ x,
                                                           const int (&wid)[M], int lane, float (&acc)[kRows][M]) {
  static_assert(kRows < 32, "row bounds come from one lane each");
  const int64_t n = w.n, k = w.k;
  if (row_a >= n) return;
  const int rows = static_cast<int>(row_a + kRows <= n ? kRows : n - row_a);
  const int32_t bound = lane <= rows ? __ldg(w.rowptr + row_a + lane) : 0;
  int32_t lim[kRows + 1];   // lim[r]: first entry of row r (lim[rows..]: the end)
#pragma unroll
  for (int r = 0; r <= kRows; ++r) lim[r] = __shfl_sync(0xffffffffu, bound, r < rows ? r : rows);
  for (int32_t e = lim[0] + lane; e < lim[kRows]; e += 32) {
    int r = 0;
#pragma unroll
    for (int i = 1; i < kRows; ++i) r += e >= lim[i];
    const int64_t row = row_a + r, c = __ldg(w.col + e);
    const float val = __half2float(w.val[e]);
    const int code = code_at<B>(w, row, c);
#pragma unroll
    for (int mm = 0; mm < M; ++mm) {
      const int d = wid[mm];
      if (d == 0) continue;
      const float coef = val - __half2float(w.lut[d][(row << d) + (code >> (B - d))]);
      const float p = coef * __ldg(x + mm * k + c);
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) acc[rr][mm] += rr == r ? p : 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// CUDA cores.

constexpr int kWarps = 4;

// A width's table as the single-width CUDA-core kernel lays it out (its Table<B>): copies interleaved copies of the
// row's 2^d fp32 centroids, entry e of copy c at float e * copies + c, lane l reading copy l % copies; 4 KB per row
// at most.
__host__ __device__ constexpr int table_copies_log2(int d) { return d <= 5 ? 5 : 10 - d; }
__host__ __device__ constexpr int table_floats(int d) { return (1 << d) << table_copies_log2(d); }
// Floats per row for any `slots` distinct widths among 2..B: the `slots` largest tables (sizes grow with the width).
__host__ __device__ constexpr int scalar_row_floats(int B, int slots) {
  int total = 0;
  for (int d = B; d >= kMinWidth && slots > 0; --d, --slots) total += table_floats(d);
  return total;
}
__host__ __device__ constexpr int scalar_slots(int B, int M) { return M < B - 1 ? M : B - 1; }
// Rows per warp: the single-width kernel's (4 up to 4 bits, 2 above: x loads shared by the rows; 2 at most above batch
// 4, where 4 rows' sums and selects outgrow the registers) while the tables of 4 warps fit 48 KB, else fewer; one row
// per warp above (shared memory opted in).
__host__ __device__ constexpr int scalar_rows(int B, int M) {
  const int bytes = kWarps * 4 * scalar_row_floats(B, scalar_slots(B, M));
  for (int r = B <= 4 && M <= 4 ? 4 : 2; r > 1; r /= 2)
    if (r * bytes <= 48 * 1024) return r;
  return 1;
}

// Four consecutive activations from column c (a multiple of 4), zero past k.
__device__ __forceinline__ void load_x4(const float* __restrict__ xr, int64_t c, int64_t k, bool vec, float (&v)[4]) {
  if (vec && c + 4 <= k) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(xr + c));
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = c + i < k ? __ldg(xr + c + i) : 0.0f;
  }
}

// The lookup of one distinct width (slot) for this lane: its copy of row 0's entry 0 (byte address), the bytes
// between entries, and the shift from a B-bit code to the slot's.
struct SlotLookup {
  uint32_t base, stride;
  int shift;
};

// The main loop for kND distinct widths (slots 0..kND-1 of look; slot[mm] < kND for every batch row).
// top: the widest width present (planes top..B-1 read as zero).
template <int B, int M, int kRows, int kND, int kSlots>
__device__ __forceinline__ void mixed_scalar_loop(const AnyPrecDevice& w, const float* __restrict__ x, const int64_t (&rows)[kRows],
                                                  const SlotLookup (&look)[kSlots], const int (&slot)[M], int top, int lane,
                                                  float (&acc)[kRows][M]) {
  static_assert(kND >= 1 && kND <= kSlots, "slots 0..kND-1 of the kSlots");
  constexpr uint32_t kRowBytes = 4u * scalar_row_floats(B, kSlots);
  const int64_t n = w.n, k = w.k, W = w.words;
  const bool vec = (k % 4) == 0;
  const int64_t plane_stride = n * W;
  for (int64_t t0 = 0; t0 < W; t0 += 32) {
    const int nw = static_cast<int>(min_i64(32, W - t0));
    if (lane >= nw) continue;
    uint32_t p[kRows][B];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int j = 0; j < B; ++j) p[r][j] = j < top ? __ldg(w.plane_data + j * plane_stride + rows[r] * W + t0 + lane) : 0u;
    uint32_t idx[kRows][8];   // byte u of idx[r][i]: the B-bit code of column i of quarter u
#pragma unroll
    for (int r = 0; r < kRows; ++r) transpose_codes<B>(p[r], idx[r]);
    const int64_t col0 = t0 * 32;
#pragma unroll
    for (int hu = 0; hu < 8; ++hu) {   // quarter u = hu / 2, its columns 4 (hu % 2) .. + 3 (half the activations live)
      const int u = hu / 2, i_lo = 4 * (hu % 2);
      const int64_t c = col0 + static_cast<int64_t>(u) * 8 * nw + 8 * lane + i_lo;
      float xv[M][4];
#pragma unroll
      for (int m = 0; m < M; ++m) load_x4(x + m * k, c, k, vec, xv[m]);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t code = __byte_perm(idx[r][i_lo + i], 0u, 0x4440u + static_cast<uint32_t>(u));
          float v[kND];
#pragma unroll
          for (int j = 0; j < kND; ++j)
            v[j] = lds_f32(look[j].base + static_cast<uint32_t>(r) * kRowBytes + (code >> look[j].shift) * look[j].stride);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float wv = v[0];
#pragma unroll
            for (int j = 1; j < kND; ++j) wv = slot[m] == j ? v[j] : wv;
            acc[r][m] = fmaf(xv[m][i], wv, acc[r][m]);
          }
        }
    }
  }
}

template <int B, int M, int kRows>
__global__ void __launch_bounds__(kWarps * 32) anyprec_gemv_mixed_scalar_kernel(AnyPrecDevice w, const int32_t* __restrict__ row_bits,
                                                                                const float* __restrict__ x, float* __restrict__ y) {
  constexpr int kSlots = scalar_slots(B, M);
  constexpr int kRowFloats = scalar_row_floats(B, kSlots);
  extern __shared__ float smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= w.n) {   // the warp leaves as a whole; nothing below synchronises the block
    pdl_wait();
    return;
  }
  const int64_t n = w.n;
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min_i64(row0 + r, n - 1);   // a missing last row recomputes row n-1, unstored
  pdl_wait();   // row_bits, x and y belong to the work before

  // The distinct widths (slots, in order of first appearance) and each batch row's slot; rows at no valid width take
  // slot 0 and are stored as NaN.
  int wid[M], slot[M], dw[kSlots];
  int nd = 0, top = 0;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) dw[j] = 0;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    wid[m] = row_width<B>(w, row_bits, m);
    top = wid[m] > top ? wid[m] : top;
    int s = -1;
#pragma unroll
    for (int j = 0; j < kSlots; ++j) s = j < nd && dw[j] == wid[m] ? j : s;
    if (wid[m] != 0 && s < 0) {
#pragma unroll
      for (int j = 0; j < kSlots; ++j) dw[j] = j == nd ? wid[m] : dw[j];
      s = nd++;
    }
    slot[m] = s < 0 ? 0 : s;
  }

  // Each slot's table for each of the warp's rows: row r's tables at tab + r * kRowFloats, slot j's at a running offset.
  float* tab = smem + static_cast<int64_t>(warp) * kRows * kRowFloats;
  const uint32_t tab_addr = static_cast<uint32_t>(__cvta_generic_to_shared(tab));
  SlotLookup look[kSlots];
  int off = 0;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    look[j] = {tab_addr, 0u, 0};   // unused slots read entry 0 of slot 0's place (never selected)
    if (j < nd) {
      const int d = dw[j], lc = table_copies_log2(d), floats = table_floats(d);
      const __half* lut = w.lut[d];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const __half* l = lut + (rows[r] << d);
        for (int i = lane; i < floats; i += 32) tab[r * kRowFloats + off + i] = __half2float(l[i >> lc]);
      }
      look[j] = {tab_addr + 4u * static_cast<uint32_t>(off + (lane & ((1 << lc) - 1))), 4u << lc, B - d};
      off += floats;
    }
  }
  __syncwarp();

  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  // A loop built for exactly 1, 2 or 3 distinct widths (no lookups or selects for slots that are absent), and one for
  // any count up to kSlots.
  constexpr int k2 = kSlots < 2 ? kSlots : 2, k3 = kSlots < 3 ? kSlots : 3;
  if (nd <= 1) mixed_scalar_loop<B, M, kRows, 1>(w, x, rows, look, slot, top, lane, acc);
  else if (nd == 2) mixed_scalar_loop<B, M, kRows, k2>(w, x, rows, look, slot, top, lane, acc);
  else if (nd == 3) mixed_scalar_loop<B, M, kRows, k3>(w, x, rows, look, slot, top, lane, acc);
  else mixed_scalar_loop<B, M, kRows, kSlots>(w, x, rows, look, slot, top, lane, acc);

  pdl_launch_dependents();   // late: dependents launched earlier would sit in pdl_wait() holding SM slots
  if (w.rowptr != nullptr) add_mixed_outlier_partials<B, kRows, M>(w, row0, x, wid, lane, acc);
#pragma unroll
  for (int m = 0; m < M; ++m)
    if (wid[m] == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][m] = nan_f32();
  store_warp_sums<kRows, M>(acc, lane, row0, n, y);
}

template <int B, int M>
void launch_mixed_scalar(const AnyPrecDevice& w, const int32_t* row_bits, const float* x, float* y, cudaStream_t s) {
  constexpr int R = scalar_rows(B, M);
  const int64_t rows_per_block = kWarps * R;
  const unsigned grid = static_cast<unsigned>((w.n + rows_per_block - 1) / rows_per_block);
  const size_t smem = sizeof(float) * kWarps * R * scalar_row_floats(B, scalar_slots(B, M));
  auto kern = anyprec_gemv_mixed_scalar_kernel<B, M, R>;
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kern), smem);
  launch_pdl(kPdlScalar, kern, grid, kWarps * 32, smem, s, w, row_bits, x, y);
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor cores.

constexpr int kTcWarps = 4;

// The shared tables of the widths 5..B, each [2^d][8][4] words (entry e of rows g and g + 8 for lane 4 g + t at word
// 32 e + 4 g + t), width d's at word wide_offset(d).
__host__ __device__ constexpr int wide_offset(int d) {
  int o = 0;
  for (int e = 5; e < d; ++e) o += 32 << e;
  return o;
}
__host__ __device__ constexpr int wide_words(int B) { return B >= 5 ? wide_offset(B + 1) : 0; }

// The register tables of the widths 2..4 for the lane's rows g ([0]) and g + 8 ([1]).
struct NarrowTables {
  RegTable<2> t2[2];
  RegTable<3> t3[2];
  RegTable<4> t4[2];
  template <int d>
  __device__ __forceinline__ RegTable<d>* of() {
    if constexpr (d == 2) return t2;
    else if constexpr (d == 3) return t3;
    else return t4;
  }
};

// The two half2 A registers of one row for the four d-bit codes in the nibbles of sel's low 16 bits (nibble q: k
// slot q; bit 3 set only at d = 4).
template <int d>
__device__ __forceinline__ void narrow_lookup(const RegTable<d>& r, uint32_t sel, uint32_t& a_low_k, uint32_t& a_high_k) {
  if constexpr (d == 4) {   // entries 0-7 and 8-15 looked up by the low 3 bits, merged by bit 3 (register_selectors<4>)
    register_lookup<4>(r, sel & 0x7777u, ((sel >> 1) & 0x4444u) | 0x3210u, a_low_k, a_high_k);
  } else {
    register_lookup<d>(r, sel, 0u, a_low_k, a_high_k);
  }
}

// acc[h] += A · (column's x half h when the lane's column is at this width, else 0).
__device__ __forceinline__ void mma_masked(float (&acc)[2][4], const uint32_t (&a)[4], const uint32_t (&xb)[4], bool mine) {
  mma_16816(acc[0], a, mine ? xb[0] : 0u, mine ? xb[1] : 0u);   // hi halves
  mma_16816(acc[1], a, mine ? xb[2] : 0u, mine ? xb[3] : 0u);   // lo halves
}

struct NoOutlierEntry {};   // reduce_tc_fragments' entry where its own outlier pass is off

template <int B, bool kPreSplit>
__global__ void __launch_bounds__(kTcWarps * 32) anyprec_gemv_mixed_tc_kernel(AnyPrecDevice w, const int32_t* __restrict__ row_bits,
                                                                              const float* __restrict__ x, int m_total,
                                                                              float* __restrict__ y, const uint4* __restrict__ xfrag) {
  extern __shared__ uint32_t tabs[];   // widths 5..B: [2^d][8][4] each, at wide_offset(d)
  const int64_t n = w.n, k = w.k, W = w.words;
  const TcTile tile(n);
  const int warp = tile.warp, lane = tile.lane, g = tile.g, t = tile.t;
  const int64_t row0 = tile.row0, r0 = tile.r0, r1 = tile.r1;
  const int64_t plane_stride = n * W, groups = (W + 3) / 4;   // groups of 4 words, one per lane t
  int top = B;   // planes read: those of the widest width present, once known
  // The lane's word of group gi from planes 0..top-1 of rows g / g + 8 (zero past the row, the last group or top).
  auto load_planes = [&](int64_t gi, uint32_t (&p0)[B], uint32_t (&p1)[B]) {
    const int64_t word = 4 * gi + t;
    const bool ok = gi < groups && word < W;
#pragma unroll
    for (int j = 0; j < B; ++j) {
      p0[j] = ok && j < top ? __ldg(w.plane_data + j * plane_stride + r0 * W + word) : 0u;
      p1[j] = ok && j < top ? __ldg(w.plane_data + j * plane_stride + r1 * W + word) : 0u;
    }
  };
  uint32_t pg0[B], pg1[B];
  load_planes(warp, pg0, pg1);   // weights only: before the wait
  pdl_wait();                    // row_bits, x, xfrag and y belong to the work before

  uint32_t present = 0;   // bit d: some batch row runs at width d
  int wg = 0;             // the width of the lane's batch column g (0: none, or g >= m)
  for (int mm = 0; mm < m_total; ++mm) {
    const int d = row_width<B>(w, row_bits, mm);
    present |= d != 0 ? 1u << d : 0u;
    wg = mm == g ? d : wg;
  }
  top = present != 0 ? 31 - __clz(static_cast<int>(present)) : 0;
  for_widths<5, B>([&](auto dc) {
    constexpr int d = decltype(dc)::value;
    if (((present >> d) & 1u) == 0) return;
    constexpr int E = 1 << d;
    const __half* lut = w.lut[d];
    uint32_t* tab = tabs + wide_offset(d);
    for (int q = static_cast<int>(threadIdx.x); q < E * 32; q += kTcWarps * 32) {
      const int l = q % 32, e = q / 32;
      const int64_t row_lo = min_i64(row0 + l / 4, n - 1), row_hi = min_i64(row0 + l / 4 + 8, n - 1);
      tab[q] = static_cast<uint32_t>(__half_as_ushort(lut[row_lo * E + e])) |
               static_cast<uint32_t>(__half_as_ushort(lut[row_hi * E + e])) << 16;
    }
  });
  NarrowTables nt;
  for_widths<kMinWidth, (B < 4 ? B : 4)>([&](auto dc) {
    constexpr int d = decltype(dc)::value;
    if (((present >> d) & 1u) == 0) return;
    load_register_table<d>(w.lut[d] + r0 * (1 << d), nt.of<d>()[0]);
    load_register_table<d>(w.lut[d] + r1 * (1 << d), nt.of<d>()[1]);
  });
  __syncthreads();
  const uint32_t tab_lane = static_cast<uint32_t>(__cvta_generic_to_shared(tabs)) + 4u * lane;

  const bool col_ok = g < m_total;
  const float* xg = x + static_cast<int64_t>(col_ok ? g : 0) * k;
  const bool vec = (k % 4) == 0;
  float acc[2][2][4] = {};   // [slab parity][x hi, lo]: four independent mma chains
  for (int64_t gi = warp; gi < groups; gi += kTcWarps) {
    uint32_t nx0[B], nx1[B];
    load_planes(gi + kTcWarps, nx0, nx1);   // the next group's words while this one is computed
    uint32_t i0[8], i1[8];                  // byte u of iX[i]: the B-bit code of word bit 8u + i, rows g / g + 8
    transpose_codes<B>(pg0, i0);
    transpose_codes<B>(pg1, i1);
    // The activations of column g for the word's 8 slabs, split once for every width.
    uint32_t xb[8][4];
    if constexpr (kPreSplit) {
#pragma unroll
      for (int sj = 0; sj < 8; ++sj) {
        const uint4 v = col_ok ? __ldg(xfrag + (gi * 8 + sj) * 32 + lane) : make_uint4(0u, 0u, 0u, 0u);
        xb[sj][0] = v.x; xb[sj][1] = v.y; xb[sj][2] = v.z; xb[sj][3] = v.w;
      }
    } else {
      const int64_t word = 4 * gi + t, T = word / 32;
      const int nw = static_cast<int>(min_i64(32, W - 32 * T)), wt = static_cast<int>(word % 32);
      const bool load = col_ok && word < W;
#pragma unroll
      for (int sj = 0; sj < 8; ++sj) {
        float xv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (load) {
          const int u = sj / 2, ib = (sj % 2) * 4;   // the slab's quarter and its first code bit within the byte
          const int64_t c = 1024 * T + static_cast<int64_t>(u) * 8 * nw + 8 * wt + ib;
          if (vec && c + 4 <= k) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(xg + c));
            xv[0] = v.x; xv[1] = v.y; xv[2] = v.z; xv[3] = v.w;
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) xv[q] = c + q < k ? __ldg(xg + c + q) : 0.0f;
          }
        }
        split_pair(xv[0], xv[1], xb[sj][0], xb[sj][2]);
        split_pair(xv[2], xv[3], xb[sj][1], xb[sj][3]);
      }
    }
    for_widths<kMinWidth, B>([&](auto dc) {
      constexpr int d = decltype(dc)::value;
      if (((present >> d) & 1u) == 0) return;
      constexpr int kShift = B - d;
      constexpr uint32_t kMask = 0x01010101u * ((1u << d) - 1u);
      const bool mine = wg == d;
      if constexpr (d <= 4) {
        // Selectors: nibble q of a slab's = the d-bit code of k slot q. n[h][0] byte u = codes of word bits 8u + 4h
        // and + 1 (low / high nibble), n[h][1] of bits 8u + 4h + 2 and + 3; slab (u, h) takes byte u of both.
        uint32_t n0[2][2], n1[2][2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int pr = 0; pr < 2; ++pr) {
            const int i = 4 * h + 2 * pr;
            n0[h][pr] = ((i0[i] >> kShift) & kMask) | (((i0[i + 1] >> kShift) & kMask) << 4);
            n1[h][pr] = ((i1[i] >> kShift) & kMask) | (((i1[i + 1] >> kShift) & kMask) << 4);
          }
        const RegTable<d>* rt = nt.of<d>();
#pragma unroll
        for (int sj = 0; sj < 8; ++sj) {
          const int u = sj / 2, h = sj % 2;
          const uint32_t pick = static_cast<uint32_t>(u) | static_cast<uint32_t>(u + 4) << 4;
          uint32_t a[4];
          narrow_lookup<d>(rt[0], __byte_perm(n0[h][0], n0[h][1], pick), a[0], a[2]);   // row g
          narrow_lookup<d>(rt[1], __byte_perm(n1[h][0], n1[h][1], pick), a[1], a[3]);   // row g + 8
          mma_masked(acc[sj % 2], a, xb[sj], mine);
        }
      } else {
        uint32_t j0[8], j1[8];   // the d-bit codes
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          j0[i] = kShift == 0 ? i0[i] : (i0[i] >> kShift) & kMask;
          j1[i] = kShift == 0 ? i1[i] : (i1[i] >> kShift) & kMask;
        }
        const uint32_t t0 = tab_lane + 4u * wide_offset(d);   // entry e at t0 + 128 e
#pragma unroll
        for (int sj = 0; sj < 8; ++sj) {
          uint32_t a[4];
          shared_table_fragment(t0, j0, j1, sj, a);
          mma_masked(acc[sj % 2], a, xb[sj], mine);
        }
      }
    });
#pragma unroll
    for (int j = 0; j < B; ++j) {
      pg0[j] = nx0[j];
      pg1[j] = nx1[j];
    }
  }

  pdl_launch_dependents();   // late: dependents launched earlier would sit in pdl_wait() holding SM slots
  float sum[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) sum[i] = (acc[0][0][i] + acc[1][0][i]) + (acc[0][1][i] + acc[1][1][i]);
  // Warp w stores rows 4w .. 4w + 3, lane 4 mm + r (reduce_tc_fragments); the outliers' corrections arrive the same way.
  float extra = 0.0f;
  if (w.rowptr != nullptr) {
    int wid[kMaxGemvBatch];
#pragma unroll
    for (int mm = 0; mm < kMaxGemvBatch; ++mm) wid[mm] = mm < m_total ? row_width<B>(w, row_bits, mm) : 0;
    float part[4][kMaxGemvBatch];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int mm = 0; mm < kMaxGemvBatch; ++mm) part[r][mm] = 0.0f;
    add_mixed_outlier_partials<B, 4, kMaxGemvBatch>(w, row0 + 4 * warp, x, wid, lane, part);
    float v[32];   // index 4 mm + r
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = part[i % 4][i / 4];
    reduce_scatter_step<16>(v, lane);
    reduce_scatter_step<8>(v, lane);
    reduce_scatter_step<4>(v, lane);
    reduce_scatter_step<2>(v, lane);
    reduce_scatter_step<1>(v, lane);
    extra = v[0];
  }
  const float v = reduce_tc_fragments<kTcWarps, false>(sum, warp, lane, row0, n, m_total, nullptr, OutlierX{}, NoOutlierEntry{}, 0);
  const int64_t row = row0 + warp * 4 + lane % 4;
  const int mm = lane / 4;
  if (mm < m_total && row < n) y[mm * n + row] = row_width<B>(w, row_bits, mm) != 0 ? v + extra : nan_f32();
}

template <int B>
void launch_mixed_tc(const AnyPrecDevice& w, const int32_t* row_bits, const float* x, int m, float* y, cudaStream_t s, void* xfrag) {
  uint4* xf = static_cast<uint4*>(xfrag);
  if (xf != nullptr) anyprec_presplit_x(w, x, m, xf, s);
  const size_t smem = sizeof(uint32_t) * wide_words(B);
  auto kern = xf != nullptr ? anyprec_gemv_mixed_tc_kernel<B, true> : anyprec_gemv_mixed_tc_kernel<B, false>;
  if (smem + 4096 > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kern), smem);   // 4 KB: the epilogue's static scratch
  launch_pdl(kPdlTcTable, kern, static_cast<unsigned>((w.n + 15) / 16), kTcWarps * 32, smem, s, w, row_bits, x, m, y,
             static_cast<const uint4*>(xf));
}

}  // namespace

void anyprec_gemv_mixed(const AnyPrecDevice& w, int max_bits, const int32_t* row_bits, const float* x, int m, float* y,
                        cudaStream_t s, GemvPath path, void* xfrag) {
  const int planes = w.planes < 8 ? w.planes : 8;
  LOWBIT_CHECK(max_bits >= kMinWidth && max_bits <= planes, "anyprec mixed-width GEMV: max_bits ", max_bits, " outside 2..",
               planes, " (the weight's planes)");
  LOWBIT_CHECK((w.widths & ((2u << max_bits) - 1u)) != 0, "anyprec mixed-width GEMV: no width up to max_bits ", max_bits,
               " is served by this weight");
  LOWBIT_CHECK(m >= 1 && m <= kMaxGemvBatch, "anyprec mixed-width GEMV: batch ", m, " outside 1..", kMaxGemvBatch);
  LOWBIT_CHECK(row_bits != nullptr, "anyprec mixed-width GEMV: no row widths");
  LOWBIT_CHECK(path == GemvPath::Auto || path == GemvPath::Scalar || path == GemvPath::TensorCore,
               "anyprec mixed-width GEMV: runs on CUDA cores (Scalar) or tensor cores (TensorCore) only");
  // The tensor cores unless asked: at batch 8 the CUDA-core form is bound by its activation loads (see the top).
  if (path == GemvPath::Auto) path = GemvPath::TensorCore;
  dispatch_int<2, 3, 4, 5, 6, 7, 8>(max_bits, [&](auto b) {
    constexpr int B = decltype(b)::value;
    if (path == GemvPath::TensorCore) {
      launch_mixed_tc<B>(w, row_bits, x, m, y, s, xfrag);
    } else {
      dispatch_int<1, 2, 3, 4, 5, 6, 7, 8>(m, [&](auto mm) { launch_mixed_scalar<B, decltype(mm)::value>(w, row_bits, x, y, s); });
    }
  });
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
