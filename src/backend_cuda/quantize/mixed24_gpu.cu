// mixed24a_quantize on the GPU (mixed24_gpu.h). The CPU twin is mixed24a_quantize in src/quantize/mixed24.cpp; every
// step below names the CPU function it mirrors, and uses the same float/double operations in the same order so that
// the codes agree wherever the inputs do (the trailing sgemm's summation order, cuBLAS vs OpenBLAS, is the one
// difference by design).
//
// Steps of one linear W [n, k], all on `stream`:
//   1. eq. 9: column sums of W² (fp64, one thread per column, rows in order) and diag((H + λI)⁻¹) = column sums of
//      squares of U from the identity-order factor (gptq_factor_gpu); the G scores and the permutation
//      (mixed24a_permutation) on the host.
//   2. Wp = W in the stored column order, dead columns (H_cc = 0) zeroed; the factor refactored in that order
//      (perm_override) and its diag of H⁻¹ for the saliency.
//   3. Outliers: the CPU takes the top t of (saliency desc, flat index asc) by nth_element. Here each candidate's
//      96-bit key (fp64 saliency bits : ~index) is recomputed on the fly (16 values per thread: one (row, group)) in up
//      to 12 radix-select passes of 8 bits; each pass is one 256-bin histogram (shared memory, warp-aggregated with
//      __match_any_sync) brought back to the host, which picks the digit. Keys are unique, so the selected set is
//      exactly the CPU's for equal saliencies; storing the keys instead would take 12 bytes per weight (2.8 GB for a
//      70B down_proj) to save a few recomputations of a cheap RTN.
//   4. GPTQ over the mixed grid, one kernel launch + one cuBLAS sgemm per block of B <= 128 columns:
//      CTA = 16 rows (one second-order row block, kMixedRowGroup), one warp per row, 512 threads.
//      Shared memory: U's diagonal block [B, B] fp32 (64 KB at B = 128, opted in above 48 KB), its fp64 diagonal,
//      the 16 rows' B working values, their codes, and the 16 fitted scales of the current group.
//      Per 16-column group: each warp fits its row's range (warp min/max of the non-outlier values, which is exact
//      in any order); __syncthreads; every warp derives the block's fp16 step/offset from the 16 scales (thread 0
//      stores them); each warp searches its row's (scale code, zero) candidates, one candidate per lane with the
//      16-term error summed in the CPU's order, argmin with ties to the CPU's loop order; then the group's 16 columns
//      in order: quantize (all lanes redundantly), err = (w - ŵ) / U_ii in fp64, in-block update of the later
//      columns by the lanes, __syncwarp. The block's columns are written back as ŵ (the error-updated weights of
//      finished columns are dead, the sgemm only reads columns >= i2), so after the last block Wp holds exactly what
//      the result encodes in stored order, outliers included.
//      Trailing update W[:, i2:] -= Err · U[i1:i2, i2:]: row-major [n, k - i2] is column-major [k - i2, n], so
//      C' = C' - U'·Err' with U' = U + i1 k + i2 (ld k) and Err' = err (ld B), default math (no TF32).
//   5. Codes, zeros, scale codes and the second-order step/offset come back; the outliers as CSR built on the device
//      (a count per row, the prefix sum on the host, a ballot-ordered fill); deq = Wp in the original column order.
// Floating-point operations are spelled with _rn intrinsics, which nvcc never contracts into an FMA, so that every
// float/double +, -, * is rounded on its own as the C++ source of the twin reads; an FMA appears only where the twin
// calls std::fma (the two-order scale). That is the portable CPU build (LOWBIT_NATIVE=OFF, what the device bundle
// builds): with -march=native on an FMA host GCC contracts w - (q - z)·s in group_error and the in-block update
// w -= e · u (-ffp-contract=fast is its C++ default), and near-ties can then resolve differently.
#include "backend_cuda/quantize/mixed24_gpu.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dense/dense.h"
#include "backend_cuda/quantize/gptq_gpu.h"
#include "core/error.h"
#include "core/half.h"

namespace lowbit::cuda {

namespace {

constexpr int kGroup = static_cast<int>(kMixedGroup);        // columns per first-order group
constexpr int kRows = static_cast<int>(kMixedRowGroup);      // rows per second-order block = rows per solver CTA
constexpr int kSolveThreads = kRows * 32;                    // one warp per row
constexpr int kKeyPasses = 12;                               // 96-bit keys, 8 bits per radix-select pass
static_assert(kGroup == 16 && kRows == 16, "the solver maps one 16-row block to a CTA and a group to 16 lanes");
static_assert(kMixed24GpuMaxBlock % kGroup == 0, "blocks hold whole groups");

struct Params {
  float scale = 0;   // the fp32 value of the stored fp16 scale
  int zero = 0;
};

// rtn.cpp's params_for_range, asymmetric: the range [xmin, xmax] (containing 0) -> fp16-rounded scale and zero.
__device__ Params range_params(float xmin, float xmax, int maxq) {
  if (xmin == 0.0f && xmax == 0.0f) {
    xmin = -1.0f;
    xmax = 1.0f;
  }
  const float raw = fmaxf(__fdiv_rn(__fsub_rn(xmax, xmin), static_cast<float>(maxq)), 6.0e-8f);
  Params p;
  p.scale = ::lowbit::f16_to_f32(::lowbit::f32_to_f16(raw));
  if (p.scale == 0.0f) p.scale = ::lowbit::f16_to_f32(1);
  if (isinf(p.scale)) p.scale = 65504.0f;
  p.zero = static_cast<int>(rintf(__fdiv_rn(-xmin, p.scale)));
  p.zero = min(max(p.zero, 0), maxq);
  return p;
}

// rtn.h's quantize_code.
__device__ __forceinline__ int quantize_code(float x, float scale, int zero, int maxq) {
  const float q = __fadd_rn(rintf(__fdiv_rn(x, scale)), static_cast<float>(zero));
  return q < 0.0f ? 0 : (q > static_cast<float>(maxq) ? maxq : static_cast<int>(q));
}

// x - dequant_code(q, p), each operation rounded (the product is exact when s is an fp16 value, not for the
// two-order scales, which carry 24 bits).
__device__ __forceinline__ float residual(float x, int q, float scale, int zero) {
  return __fsub_rn(x, __fmul_rn(__fsub_rn(static_cast<float>(q), static_cast<float>(zero)), scale));
}

// mixed24.cpp's group_error: Σ over the non-outlier values of the 16 of x (skip: bit j = x[j] is an outlier) of
// (x - x̂)², in fp64, j in order.
__device__ double group_error(const float* x, unsigned skip, float s, int z, int maxq) {
  double e = 0.0;
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    if ((skip >> j) & 1u) continue;
    const double d = s > 0.0f ? residual(x[j], quantize_code(x[j], s, z, maxq), s, z) : x[j];
    e = __dadd_rn(e, __dmul_rn(d, d));   // d² is exact in fp64
  }
  return e;
}

__device__ __forceinline__ float warp_min(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Step 1-2: sensitivity, H⁻¹ diagonals, the permuted weight.

// out[c] = Σ_r w[r, c]² in fp64, r in order (mixed24_group_sensitivity's column sums).
__global__ void column_sumsq_kernel(const float* w, int64_t n, int64_t k, double* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= k) return;
  double acc = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const double v = w[r * k + c];
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  out[c] = acc;
}

// out[c] = Σ_{r <= c} U[r, c]², r in order (hinv_diagonal), the diagonal term from the fp64 diagonal.
__global__ void hinv_diagonal_kernel(const float* u, const double* u_diag, int64_t k, double* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= k) return;
  double acc = 0.0;
#pragma unroll 8
  for (int64_t r = 0; r < c; ++r) {
    const double v = u[r * k + c];
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  out[c] = __dadd_rn(acc, __dmul_rn(u_diag[c], u_diag[c]));
}

// wp[r, c] = w[r, col[c]] (stored column order), 0 in dead columns.
__global__ void permute_columns_kernel(const float* w, int64_t n, int64_t k, const int32_t* col, const uint8_t* dead, float* wp) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= k) return;
  const int64_t from = col[c];
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) wp[r * k + c] = dead[c] ? 0.0f : w[r * k + from];
}

// out[r, col[c]] = wp[r, c] (back to the original column order).
__global__ void unpermute_columns_kernel(const float* wp, int64_t n, int64_t k, const int32_t* col, float* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= k) return;
  const int64_t to = col[c];
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) out[r * k + to] = wp[r * k + c];
}

// *first = the smallest index of a NaN/inf weight (left at its initial value when all are finite).
__global__ void first_nonfinite_kernel(const float* w, int64_t count, unsigned long long* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!isfinite(w[i])) atomicMin(first, static_cast<unsigned long long>(i));
}

// ---------------------------------------------------------------------------------------------------------------
// Step 3: outlier selection by radix select over 96-bit keys (saliency bits, ~flat index): larger key = taken first,
// i.e. larger saliency, then smaller index (the CPU's comparator).

// The top `bits` bits of a 96-bit key: hi holds key bits 95..32 (all 64 once bits >= 64), lo the top bits - 64 of
// bits 31..0.
struct KeyPrefix {
  int bits = 0;
  unsigned long long hi = 0;
  unsigned lo = 0;
};

__device__ __forceinline__ int compare_prefix(unsigned long long hi, unsigned lo, const KeyPrefix& p) {
  if (p.bits == 0) return 0;
  if (p.bits <= 64) {
    const unsigned long long a = hi >> (64 - p.bits);
    return a < p.hi ? -1 : (a > p.hi ? 1 : 0);
  }
  if (hi != p.hi) return hi < p.hi ? -1 : 1;
  const unsigned b = lo >> (96 - p.bits);
  return b < p.lo ? -1 : (b > p.lo ? 1 : 0);
}

// The 8 key bits below the first `bits` (bits in 0, 8, .., 88).
__device__ __forceinline__ unsigned next_digit(unsigned long long hi, unsigned lo, int bits) {
  return bits < 64 ? static_cast<unsigned>(hi >> (56 - bits)) & 255u : (lo >> (88 - bits)) & 255u;
}

// The saliency keys (fp64 bits) of one (row r, stored group p) of the dead-zeroed, stored-order weight: err² / [H⁻¹]_cc
// of the RTN error at the group's bits, range fitted on all 16 values (quantize_grid's outlier loop). False when the
// group holds no candidates (a 4-bit group, unless outliers come from all groups).
__device__ bool group_keys(const float* wp, int64_t k, int64_t r, int64_t p, const double* hinv, bool all_groups,
                           unsigned long long (&key)[kGroup]) {
  const int bits = mixed24a_code_bits(p);
  if (bits == 4 && !all_groups) return false;
  const int maxq = (1 << bits) - 1;
  float x[kGroup];
  const float4* src = reinterpret_cast<const float4*>(wp + r * k + p * kGroup);   // 64-byte aligned: k % 64 == 0
#pragma unroll
  for (int j = 0; j < kGroup / 4; ++j) {
    const float4 v = src[j];
    x[4 * j] = v.x;
    x[4 * j + 1] = v.y;
    x[4 * j + 2] = v.z;
    x[4 * j + 3] = v.w;
  }
  float xmin = 0.0f, xmax = 0.0f;
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    xmin = fminf(xmin, x[j]);
    xmax = fmaxf(xmax, x[j]);
  }
  const Params q = range_params(xmin, xmax, maxq);
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const double e = residual(x[j], quantize_code(x[j], q.scale, q.zero, maxq), q.scale, q.zero);
    key[j] = static_cast<unsigned long long>(__double_as_longlong(__ddiv_rn(__dmul_rn(e, e), hinv[p * kGroup + j])));
  }
  return true;
}

// hist[d] += the candidates whose key starts with `pre` and continues with digit d. One thread per (row, group).
__global__ void outlier_histogram_kernel(const float* wp, int64_t n, int64_t k, const double* hinv, bool all_groups,
                                         KeyPrefix pre, unsigned* hist) {
  __shared__ unsigned bins[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) bins[i] = 0;
  __syncthreads();
  const int64_t G = k / kGroup;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t r = t / G, p = t % G;
  unsigned long long key[kGroup];
  const bool any = t < n * G && group_keys(wp, k, r, p, hinv, all_groups, key);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    unsigned d = 256;   // not counted
    if (any) {
      const unsigned lo = ~static_cast<unsigned>(r * k + p * kGroup + j);
      if (compare_prefix(key[j], lo, pre) == 0) d = next_digit(key[j], lo, pre.bits);
    }
    // Few distinct digits per warp in the first passes: one shared atomic per distinct digit.
    const unsigned peers = __match_any_sync(0xffffffffu, d);
    if (d < 256 && lane == __ffs(peers) - 1) atomicAdd(&bins[d], static_cast<unsigned>(__popc(peers)));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    if (bins[i] != 0) atomicAdd(&hist[i], bins[i]);
}

// mask[r, c] = 1 for the candidates whose key's top pre.bits bits are >= pre (all candidates when pre.bits = 0).
__global__ void outlier_mark_kernel(const float* wp, int64_t n, int64_t k, const double* hinv, bool all_groups,
                                    KeyPrefix pre, uint8_t* mask) {
  const int64_t G = k / kGroup;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * G) return;
  const int64_t r = t / G, p = t % G;
  unsigned long long key[kGroup];
  const bool any = group_keys(wp, k, r, p, hinv, all_groups, key);
  uint32_t word[kGroup / 4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const unsigned lo = ~static_cast<unsigned>(r * k + p * kGroup + j);
    if (any && compare_prefix(key[j], lo, pre) >= 0) word[j / 4] |= 1u << (8 * (j % 4));
  }
  *reinterpret_cast<uint4*>(mask + r * k + p * kGroup) = make_uint4(word[0], word[1], word[2], word[3]);
}

// ---------------------------------------------------------------------------------------------------------------
// Step 4: the block solver.

struct SolveArgs {
  float* wp;                 // [n, k] stored order: error-updated weights in, ŵ out for columns [i1, i1 + cnt)
  const float* u;            // [k, k] U fp32, processing (= stored) order
  const double* u_diag;      // [k] U's fp64 diagonal
  const uint8_t* outlier;    // [n, k] 1 = outlier
  uint8_t* codes;            // [n, k]
  uint8_t* zero;             // [n, G]
  uint8_t* scode;            // [n, G]
  uint16_t* ss;              // [RG, G] fp16 bits
  uint16_t* sm;              // [RG, G] fp16 bits
  float* err;                // [n, ld_err] the block's scaled errors, for the sgemm
  int64_t n, k, i1;
  int cnt, ld_err;
  bool feedback;
};

size_t solve_smem_bytes(int cnt) {
  return static_cast<size_t>(cnt) * sizeof(double) + static_cast<size_t>(cnt) * cnt * sizeof(float) +
         static_cast<size_t>(kRows) * cnt * sizeof(float) + kRows * sizeof(float) + static_cast<size_t>(kRows) * cnt;
}

// One CTA = rows [16 b, 16 b + 16) x the block's columns; warp w = row 16 b + w. quantize_grid's group loop for one
// block, in the same order.
__global__ void __launch_bounds__(kSolveThreads) solve_block_kernel(SolveArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int cnt = a.cnt;
  double* s_udiag = reinterpret_cast<double*>(smem);                       // [cnt]
  float* s_u = reinterpret_cast<float*>(s_udiag + cnt);                    // [cnt, cnt] U[i1 + a, i1 + b]
  float* s_w = s_u + cnt * cnt;                                            // [16, cnt] working values, then ŵ
  float* s_scale = s_w + kRows * cnt;                                      // [16] fitted scales of the group
  uint8_t* s_code = reinterpret_cast<uint8_t*>(s_scale + kRows);           // [16, cnt]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows, r = r0 + warp;
  const int rc = static_cast<int>(min(static_cast<int64_t>(kRows), a.n - r0));   // rows of this block
  const bool live = warp < rc;                                                      // warp-uniform
  const int64_t k = a.k, G = k / kGroup;
  float* wrow = s_w + warp * cnt;
  uint8_t* crow = s_code + warp * cnt;

  for (int i = threadIdx.x; i < cnt * cnt; i += blockDim.x) {
    const int ra = i / cnt, cb = i - ra * cnt;
    s_u[i] = a.u[(a.i1 + ra) * k + a.i1 + cb];
  }
  for (int i = threadIdx.x; i < cnt; i += blockDim.x) s_udiag[i] = a.u_diag[a.i1 + i];
  if (live)
    for (int c = lane; c < cnt; c += 32) wrow[c] = a.wp[r * k + a.i1 + c];
  __syncthreads();

  for (int g0 = 0; g0 < cnt; g0 += kGroup) {
    const int64_t p = (a.i1 + g0) / kGroup;   // stored group
    const int maxq = (1 << mixed24a_code_bits(p)) - 1, top = (1 << mixed24a_scale_bits(p)) - 1;

    // Outlier flags of the group: bit j = column g0 + j (lanes 0..15 read, the ballot gives every lane all 16).
    const bool my_skip = live && lane < kGroup && a.outlier[r * k + a.i1 + g0 + lane] != 0;
    const unsigned skip = __ballot_sync(0xffffffffu, my_skip) & 0xffffu;

    // fit(): range of the non-outlier values, always containing 0 (lanes without a value contribute 0).
    float v = 0.0f;
    if (live && lane < kGroup && !my_skip) v = wrow[g0 + lane];
    const float xmin = warp_min(v), xmax = warp_max(v);
    __syncthreads();   // every warp has read the previous group's scales
    if (live && lane == 0) s_scale[warp] = range_params(xmin, xmax, maxq).scale;
    __syncthreads();

    // quantize_scales(): the block's fp16 step and offset from its rows' scales.
    float lo = INFINITY, hi = -INFINITY;
    if (lane < rc) lo = hi = s_scale[lane];
    lo = warp_min(lo);
    hi = warp_max(hi);
    const uint16_t sm16 = ::lowbit::f32_to_f16(lo), ss16 = ::lowbit::f32_to_f16(__fdiv_rn(__fsub_rn(hi, lo), static_cast<float>(top)));
    const float m = ::lowbit::f16_to_f32(sm16), st = ::lowbit::f16_to_f32(ss16);
    if (threadIdx.x == 0) {
      a.ss[static_cast<int64_t>(blockIdx.x) * G + p] = ss16;
      a.sm[static_cast<int64_t>(blockIdx.x) * G + p] = sm16;
    }
    if (!live) continue;   // warp-uniform; no __syncthreads below in this iteration

    // Each row: among the codes next to its rounded scale and every zero, the pair with the least error. Candidate
    // i = (code - cmin) · (maxq + 1) + zero is the CPU's loop order; lane l takes l, l + 32; ties go to the lower i.
    const float s = s_scale[warp];
    const int c0 = st > 0.0f ? static_cast<int>(fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(s, m), st)), 0.0f), static_cast<float>(top))) : 0;
    const int cmin = max(0, c0 - 1), cmax = min(top, c0 + 1), nz = maxq + 1, ncand = (cmax - cmin + 1) * nz;
    double best = INFINITY;
    int best_i = INT_MAX;
    for (int i = lane; i < ncand; i += 32) {
      const float sh = __fmaf_rn(static_cast<float>(cmin + i / nz), st, m);
      const double e = group_error(wrow + g0, skip, sh, i % nz, maxq);
      if (e < best) {
        best = e;
        best_i = i;
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const double oe = __shfl_xor_sync(0xffffffffu, best, off);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
      if (oe < best || (oe == best && oi < best_i)) {
        best = oe;
        best_i = oi;
      }
    }
    const int code_s = cmin + best_i / nz, zero = best_i % nz;
    const float scale = __fmaf_rn(static_cast<float>(code_s), st, m);
    if (lane == 0) {
      a.scode[r * G + p] = static_cast<uint8_t>(code_s);
      a.zero[r * G + p] = static_cast<uint8_t>(zero);
    }

    // The group's columns in order.
    for (int j = 0; j < kGroup; ++j) {
      const int t = g0 + j;
      const float x = wrow[t];
      int code;
      float value;
      if ((skip >> j) & 1u) {   // kept in fp16 at its updated value; the dense code encodes 0 there
        value = ::lowbit::f16_to_f32(::lowbit::f32_to_f16(x));
        code = zero;
      } else {
        code = scale > 0.0f ? quantize_code(x, scale, zero, maxq) : zero;
        value = __fmul_rn(__fsub_rn(static_cast<float>(code), static_cast<float>(zero)), scale);
      }
      if (a.feedback) {
        const float e = __double2float_rn(__ddiv_rn(static_cast<double>(__fsub_rn(x, value)), s_udiag[t]));
        if (lane == 0) a.err[r * a.ld_err + t] = e;
        const float* urow = s_u + t * cnt;
        for (int c = t + 1 + lane; c < cnt; c += 32) wrow[c] = __fsub_rn(wrow[c], __fmul_rn(e, urow[c]));
      }
      __syncwarp();   // the updates are visible, and every lane has read wrow[t]
      if (lane == 0) {
        wrow[t] = value;
        crow[t] = static_cast<uint8_t>(code);
      }
    }
  }
  __syncwarp();
  if (live)
    for (int c = lane; c < cnt; c += 32) {
      a.wp[r * k + a.i1 + c] = wrow[c];
      a.codes[r * k + a.i1 + c] = crow[c];
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Step 5: outliers as CSR (csr_from_mask), one warp per row.

__global__ void outlier_row_count_kernel(const uint8_t* mask, int64_t n, int64_t k, int32_t* count) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n) return;   // warp-uniform
  int c = 0;
  for (int64_t j = lane; j < k; j += 32) c += mask[r * k + j] != 0;
  c = __reduce_add_sync(0xffffffffu, c);
  if (lane == 0) count[r] = c;
}

// Columns in increasing order (ballot order), values as fp16 bits of ŵ (already fp16 values there). k % 32 == 0.
__global__ void outlier_fill_kernel(const uint8_t* mask, const float* what, int64_t n, int64_t k, const int32_t* rowptr,
                                    uint16_t* col, uint16_t* val) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n) return;   // warp-uniform
  int32_t at = rowptr[r];
  for (int64_t j0 = 0; j0 < k; j0 += 32) {
    const int64_t j = j0 + lane;
    const bool m = mask[r * k + j] != 0;
    const unsigned b = __ballot_sync(0xffffffffu, m);
    if (m) {
      const int32_t pos = at + __popc(b & ((1u << lane) - 1u));
      col[pos] = static_cast<uint16_t>(j);
      val[pos] = ::lowbit::f32_to_f16(what[r * k + j]);
    }
    at += __popc(b);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t s) {
    cublas_check(cublasCreate(&h_), "cublasCreate");
    cublas_check(cublasSetStream(h_, s), "cublasSetStream");
    cublas_check(cublasSetMathMode(h_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");   // fp32 FMA, no TF32
  }
  ~CublasHandle() { cublasDestroy(h_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

unsigned blocks_for(int64_t threads, int per_block) {
  return static_cast<unsigned>(std::max<int64_t>(1, (threads + per_block - 1) / per_block));
}

// Columns in x (256 per block), rows strided over y (at most 65535 row slices).
dim3 column_grid(int64_t n, int64_t k) {
  return dim3(blocks_for(k, 256), static_cast<unsigned>(std::min<int64_t>(n, 65535)));
}

template <typename T>
std::vector<T> download(const DeviceBuffer<T>& d, cudaStream_t s) {
  std::vector<T> h(d.size());
  if (!h.empty()) LOWBIT_CUDA_CHECK(cudaMemcpyAsync(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost, s));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

// A host vector copied in `s`'s order (a plain cudaMemcpy runs on the legacy stream, which a non-blocking `s` does
// not wait for).
template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& h, cudaStream_t s) {
  DeviceBuffer<T> d(h.size());
  if (!h.empty()) LOWBIT_CUDA_CHECK(cudaMemcpyAsync(d.get(), h.data(), d.bytes(), cudaMemcpyHostToDevice, s));
  return d;
}

// diag((H + λI)⁻¹) [k] of a factor, in its processing order.
DeviceBuffer<double> hinv_diagonal_gpu(const GpuGptqFactor& f, cudaStream_t s) {
  DeviceBuffer<double> d(static_cast<size_t>(f.k));
  hinv_diagonal_kernel<<<blocks_for(f.k, 128), 128, 0, s>>>(f.u, f.u_diag, f.k, d.get());
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  return d;
}

// The outliers of quantize_grid: mask [n, k] over the stored-order, dead-zeroed weight wp. Returns how many.
int64_t select_outliers(const float* wp, int64_t n, int64_t k, const double* hinv, const Mixed24Options& o,
                        uint8_t* mask, cudaStream_t s) {
  const int64_t G = k / kGroup;
  const int64_t candidates = n * kGroup * (o.outliers_from_all_groups ? G : G / 4 * 3);
  const int64_t take = std::min(candidates, static_cast<int64_t>(std::llround(o.outlier_fraction * static_cast<double>(n * k))));
  if (take <= 0) {
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(mask, 0, static_cast<size_t>(n * k), s));
    return 0;
  }
  constexpr int kThreads = 256;
  const unsigned grid = blocks_for(n * G, kThreads);
  KeyPrefix pre;   // empty prefix: every candidate (take == candidates)
  if (take < candidates) {
    DeviceBuffer<unsigned> hist(256);
    int64_t remaining = take;   // still to take among the candidates matching pre
    for (int pass = 0;; ++pass) {
      LOWBIT_CHECK(pass < kKeyPasses, "mixed24a (GPU): outlier selection did not converge (internal error)");
      LOWBIT_CUDA_CHECK(cudaMemsetAsync(hist.get(), 0, hist.bytes(), s));
      outlier_histogram_kernel<<<grid, kThreads, 0, s>>>(wp, n, k, hinv, o.outliers_from_all_groups, pre, hist.get());
      LOWBIT_CUDA_CHECK(cudaGetLastError());
      const std::vector<unsigned> h = download(hist, s);
      int64_t above = 0;
      int d = 255;
      for (; d >= 0 && above + h[static_cast<size_t>(d)] < remaining; --d) above += h[static_cast<size_t>(d)];
      LOWBIT_CHECK(d >= 0, "mixed24a (GPU): outlier histogram lost candidates (internal error)");
      remaining -= above;
      if (pre.bits < 64) pre.hi = (pre.hi << 8) | static_cast<unsigned>(d);
      else pre.lo = (pre.lo << 8) | static_cast<unsigned>(d);
      pre.bits += 8;
      if (h[static_cast<size_t>(d)] == remaining) break;   // the whole bin is taken: the prefix is the threshold
    }
  }
  outlier_mark_kernel<<<grid, kThreads, 0, s>>>(wp, n, k, hinv, o.outliers_from_all_groups, pre, mask);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  return take;
}

}  // namespace

Mixed24AQuantized mixed24a_quantize_gpu(const float* w, int64_t n, int64_t k, const double* h,
                                        const Mixed24Options& o, cudaStream_t stream, float* deq,
                                        Mixed24Stats* stats) {
  validate_mixed24_options(o);
  LOWBIT_CHECK(mixed24_aligned_fits(k, o), "mixed24a: the aligned layout needs k a multiple of 64 (k = ", k,
               ") and --ratio-4bit 0.25 (got ", o.ratio_4bit, ")");
  LOWBIT_CHECK(n > 0, "mixed24a: n = ", n, " rows");
  LOWBIT_CHECK(o.block_size <= kMixed24GpuMaxBlock, "mixed24a (GPU): block size ", o.block_size, " is above ",
               kMixed24GpuMaxBlock, " (U's diagonal block lives in shared memory)");
  LOWBIT_CHECK(n * k < (int64_t{1} << 32), "mixed24a (GPU): n * k = ", n * k, " exceeds the 32-bit outlier tie-break index");
  LOWBIT_CHECK(w != nullptr && h != nullptr, "mixed24a (GPU): needs the device weight and the [k, k] Hessian");
  const int64_t G = k / kGroup, RG = (n + kRows - 1) / kRows, B = o.block_size;
  const size_t nk = static_cast<size_t>(n * k);
  cudaStream_t s = stream;
  {   // check_weights_finite
    DeviceBuffer<unsigned long long> first(1);
    const unsigned long long none = ~0ull;
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(first.get(), &none, sizeof(none), cudaMemcpyHostToDevice, s));
    first_nonfinite_kernel<<<blocks_for(static_cast<int64_t>(nk), 256 * 16), 256, 0, s>>>(w, static_cast<int64_t>(nk), first.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    const unsigned long long bad = download(first, s)[0];
    LOWBIT_CHECK(bad == none, "mixed24a: weight ", bad, " is not finite; refusing to quantize");
  }
  GptqOptions fo;
  fo.percdamp = o.percdamp;
  fo.block_size = o.block_size;

  // 1. Eq. 9 scores on the identity-order factor, the permutation on the host.
  std::vector<double> colsq, hinv0;
  {
    DeviceBuffer<double> d_col(static_cast<size_t>(k));
    column_sumsq_kernel<<<blocks_for(k, 128), 128, 0, s>>>(w, n, k, d_col.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    colsq = download(d_col, s);
    const GpuGptqFactor f0 = gptq_factor_gpu(h, k, fo, s);
    hinv0 = download(hinv_diagonal_gpu(f0, s), s);
  }
  std::vector<double> sens(static_cast<size_t>(G), 0.0);
  for (int64_t c = 0; c < k; ++c)
    sens[static_cast<size_t>(c / kGroup)] += colsq[static_cast<size_t>(c)] / (hinv0[static_cast<size_t>(c)] * hinv0[static_cast<size_t>(c)]);
  Mixed24AQuantized q;
  q.n = n;
  q.k = k;
  q.perm = mixed24a_permutation(sens, o.unit_order_by_sensitivity);

  // 2. The stored order: col[c] = the original column at stored column c; dead columns from H's diagonal.
  std::vector<int64_t> col(static_cast<size_t>(k));
  std::vector<int32_t> col32(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) {
    col[static_cast<size_t>(c)] = int64_t{q.perm[static_cast<size_t>(c / kGroup)]} * kGroup + c % kGroup;
    col32[static_cast<size_t>(c)] = static_cast<int32_t>(col[static_cast<size_t>(c)]);
  }
  std::vector<double> hdiag(static_cast<size_t>(k));
  LOWBIT_CUDA_CHECK(cudaMemcpy2DAsync(hdiag.data(), sizeof(double), h, static_cast<size_t>(k + 1) * sizeof(double),
                                      sizeof(double), static_cast<size_t>(k), cudaMemcpyDeviceToHost, s));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<uint8_t> dead(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) dead[static_cast<size_t>(c)] = hdiag[static_cast<size_t>(col[static_cast<size_t>(c)])] == 0.0;
  const DeviceBuffer<int32_t> d_col = upload(col32, s);
  DeviceBuffer<float> wp(nk);
  {
    const DeviceBuffer<uint8_t> d_dead = upload(dead, s);
    permute_columns_kernel<<<column_grid(n, k), 256, 0, s>>>(w, n, k, d_col.get(), d_dead.get(), wp.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));   // d_dead is freed at the end of this scope
  }
  const GpuGptqFactor f = gptq_factor_gpu(h, k, fo, s, &col);
  const DeviceBuffer<double> hinv = hinv_diagonal_gpu(f, s);

  // 3. Outliers.
  DeviceBuffer<uint8_t> mask(nk);
  select_outliers(wp.get(), n, k, hinv.get(), o, mask.get(), s);

  // 4. GPTQ over the mixed grid.
  DeviceBuffer<uint8_t> codes(nk), zero(static_cast<size_t>(n * G)), scode(static_cast<size_t>(n * G));
  DeviceBuffer<uint16_t> ss(static_cast<size_t>(RG * G)), sm(static_cast<size_t>(RG * G));
  DeviceBuffer<float> err(static_cast<size_t>(n * B));
  {
    CublasHandle cb(s);
    const size_t smem_max = solve_smem_bytes(static_cast<int>(B));
    LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(solve_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_max)));
    SolveArgs a;
    a.wp = wp.get();
    a.u = f.u;
    a.u_diag = f.u_diag;
    a.outlier = mask.get();
    a.codes = codes.get();
    a.zero = zero.get();
    a.scode = scode.get();
    a.ss = ss.get();
    a.sm = sm.get();
    a.err = err.get();
    a.n = n;
    a.k = k;
    a.ld_err = static_cast<int>(B);
    a.feedback = o.error_feedback;
    const float minus_one = -1.0f, one = 1.0f;
    for (int64_t i1 = 0; i1 < k; i1 += B) {
      const int64_t i2 = std::min(k, i1 + B);
      a.i1 = i1;
      a.cnt = static_cast<int>(i2 - i1);
      solve_block_kernel<<<static_cast<unsigned>(RG), kSolveThreads, solve_smem_bytes(a.cnt), s>>>(a);
      LOWBIT_CUDA_CHECK(cudaGetLastError());
      if (o.error_feedback && i2 < k)   // Wp[:, i2:] -= Err [n, cnt] · U[i1:i2, i2:], column-major views (see top)
        cublas_check(cublasSgemm(cb.get(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(k - i2), static_cast<int>(n), a.cnt,
                                 &minus_one, f.u + i1 * k + i2, static_cast<int>(k), err.get(), static_cast<int>(B), &one,
                                 wp.get() + i2, static_cast<int>(k)),
                     "cublasSgemm");
    }
  }

  // 5. Results.
  q.codes = download(codes, s);
  q.zero = download(zero, s);
  q.scode = download(scode, s);
  q.ss = download(ss, s);
  q.sm = download(sm, s);
  {
    DeviceBuffer<int32_t> count(static_cast<size_t>(n));
    constexpr int kWarpsPerBlock = 8;
    const unsigned grid = blocks_for(n, kWarpsPerBlock);
    outlier_row_count_kernel<<<grid, kWarpsPerBlock * 32, 0, s>>>(mask.get(), n, k, count.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    const std::vector<int32_t> per_row = download(count, s);
    std::vector<int32_t> rowptr(static_cast<size_t>(n + 1), 0);
    for (int64_t r = 0; r < n; ++r) rowptr[static_cast<size_t>(r + 1)] = rowptr[static_cast<size_t>(r)] + per_row[static_cast<size_t>(r)];
    const int64_t nnz = rowptr.back();
    if (nnz > 0) {   // csr_from_mask runs only when some weight is an outlier
      const DeviceBuffer<int32_t> d_rowptr = upload(rowptr, s);
      DeviceBuffer<uint16_t> d_ocol(static_cast<size_t>(nnz)), d_oval(static_cast<size_t>(nnz));
      outlier_fill_kernel<<<grid, kWarpsPerBlock * 32, 0, s>>>(mask.get(), wp.get(), n, k, d_rowptr.get(), d_ocol.get(), d_oval.get());
      LOWBIT_CUDA_CHECK(cudaGetLastError());
      q.outlier_col = download(d_ocol, s);
      q.outlier_val = download(d_oval, s);
      q.outlier_rowptr = std::move(rowptr);
    }
  }
  DeviceBuffer<float> own_deq;
  if (deq == nullptr && stats != nullptr) {
    own_deq = DeviceBuffer<float>(nk);
    deq = own_deq.get();
  }
  if (deq != nullptr) {
    unpermute_columns_kernel<<<column_grid(n, k), 256, 0, s>>>(wp.get(), n, k, d_col.get(), deq);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
  }
  if (stats != nullptr) {
    stats->outliers = static_cast<int64_t>(q.outlier_col.size());
    stats->hessian_error = hessian_weighted_error_gpu(w, deq, n, k, h, s);
  }
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return q;
}

}  // namespace lowbit::cuda
