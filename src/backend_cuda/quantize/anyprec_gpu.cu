// Any-precision quantization on the GPU: the device twin of anyprec_quantize (quantize/anyprec.cpp).
//
// Design
//   Validation: the options on the host (anyprec_width_mask); the finiteness of weights and sensitivities by one
//   pass that finds the first offending index of each (atomicMin), reported with the CPU's messages.
//   Outliers (dense-and-sparse): the CPU keeps the n_out largest sensitivities, ties broken by the smaller flat
//   index. Sensitivities are finite and >= 0, so their bit patterns (-0 folded to +0) order as the values do; the
//   threshold pattern T is the largest with #{s >= T} >= n_out (32 counting passes of a binary search), and the
//   ties at T are taken up to the flat index I found by a second binary search over #{s == T, index < I}. Each pass
//   is a grid-stride count: ~64 reads of the sensitivities, ~20 ms for a 28672 x 28672 matrix at H100 bandwidth,
//   and no n k sized scratch. The CSR then comes from per-row counts (host prefix sum over n) and one warp per row
//   writing its columns in order with a ballot.
//   Sorting: the CPU sorts each row's kept columns by (value, column). Here the keys are the values' order-
//   preserving bit patterns (-0 folded to +0, which the CPU's < treats as equal), outliers get 0xffffffff (above
//   every finite value) so they fall to the row's end, and cub's stable segmented sort over the column indices
//   keeps equal values in column order: the CPU's order exactly.
//   Rows: one warp per row runs the shared core (quantize/anyprec_row.h) with WarpLoops. Every lane executes the
//   whole row redundantly (identical values and addresses, so reads broadcast and writes agree); the two searches
//   that hold nearly all the work, the exact seed's divide-and-conquer argmin over split points and the 2-means cut
//   scan of the upscaling, are split over the lanes by stride and their first minima combined by shuffles, which
//   chooses what the sequential scan chooses (anyprec_row.h explains why; the CPU tests run the same partition
//   emulated). Independent writes (the centred values, the codes) are split over the lanes too. The prefix sums stay
//   sequential: their rounding is part of the result.
//   Scratch: per row, the sorted keys and columns, the centred values and weights, three prefix arrays, and for
//   exact seeds (<= 16 clusters) two DP layers and the (K - 1) x (k + 1) argmin table: ~100 bytes per weight at
//   3 seed bits. Rows go in chunks sized to a share of the free device memory; each chunk's codes and LUTs are
//   copied out before the next starts.
//   Tried and not taken: one thread per row (too few threads for the GPU at n = 4096: 4096 rows are 128 warps, and
//   each thread's strided accesses miss coalescing); rows emptied of their outliers sorted by a per-row block sort
//   (cub's segmented sort already picks per-segment block or warp sorts by size).
#include "backend_cuda/quantize/anyprec_gpu.h"

#include <cub/device/device_segmented_sort.cuh>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "backend_cuda/common/common.h"
#include "core/error.h"
#include "quantize/anyprec_row.h"

namespace lowbit::cuda {
namespace {

namespace row = anyprec_row;

constexpr int kWarpsPerBlock = 4;             // rows per block of the row kernel
constexpr int kCountThreads = 256;
constexpr double kScratchShareOfFree = 0.5;   // of the free device memory, for one chunk of rows
constexpr int64_t kScratchCapBytes = int64_t{16} << 30;
constexpr int kSmallEntries = row::kMaxClusters + 1;   // start / next / centroids / LUT tables per row

// The warp's loops policy (anyprec_row.h): lane-strided scans combined by shuffles. Host versions exist only so
// that the shared templates compile for both sides; they never run.
struct WarpLoops {
  template <typename F>
  __host__ __device__ static row::Candidate first_min(int64_t lo, int64_t hi, F&& f) {
#ifdef __CUDA_ARCH__
    row::Candidate best = row::scan_lane(lo, hi, threadIdx.x & 31, 32, f);
    for (int offset = 16; offset > 0; offset >>= 1) {
      const row::Candidate other{__shfl_xor_sync(0xffffffffu, best.cost, offset),
                                 __shfl_xor_sync(0xffffffffu, best.index, offset)};
      best = row::better(best, other);
    }
    return best;
#else
    return row::scan_lane(lo, hi, 0, 1, f);
#endif
  }
  template <typename F>
  __host__ __device__ static void for_each(int64_t lo, int64_t hi, F&& f) {
#ifdef __CUDA_ARCH__
    for (int64_t i = lo + (threadIdx.x & 31); i < hi; i += 32) f(i);
#else
    for (int64_t i = lo; i < hi; ++i) f(i);
#endif
  }
  __host__ __device__ static void sync() {
#ifdef __CUDA_ARCH__
    __syncwarp();
#endif
  }
};

// Sensitivity bits that order as the (finite, non-negative) values do: -0 folded to +0.
__device__ __forceinline__ uint32_t sens_key(float s) {
  const uint32_t u = __float_as_uint(s);
  return u == 0x80000000u ? 0u : u;
}

// Which entries are outliers: key > T, or key == T at a flat index below I. T = 0xffffffff and I = 0: none (a finite
// sensitivity's key is below it).
struct OutlierRule {
  uint32_t threshold = 0xffffffffu;
  int64_t tie_end = 0;
  __device__ __forceinline__ bool operator()(float s, int64_t flat) const {
    const uint32_t key = sens_key(s);
    return key > threshold || (key == threshold && flat < tie_end);
  }
};

__device__ __forceinline__ void warp_add_to(unsigned long long* total, unsigned long long v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if ((threadIdx.x & 31) == 0 && v != 0) atomicAdd(total, v);
}

__global__ void first_bad_kernel(const float* __restrict__ w, const float* __restrict__ s, int64_t count,
                                 unsigned long long* first_bad_w, unsigned long long* first_bad_s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!isfinite(w[i])) atomicMin(first_bad_w, static_cast<unsigned long long>(i));
    if (!(isfinite(s[i]) && s[i] >= 0.0f)) atomicMin(first_bad_s, static_cast<unsigned long long>(i));
  }
}

// #{key >= threshold} (tie_end < 0) or #{key == threshold, index < tie_end}.
__global__ void count_kernel(const float* __restrict__ s, int64_t count, uint32_t threshold, int64_t tie_end,
                             unsigned long long* total) {
  unsigned long long mine = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t key = sens_key(s[i]);
    mine += tie_end < 0 ? key >= threshold : (key == threshold && i < tie_end);
  }
  warp_add_to(total, mine);
}

// One warp per row: how many of its entries are outliers.
__global__ void row_outlier_count_kernel(const float* __restrict__ s, int64_t n, int64_t k, OutlierRule rule,
                                         int32_t* __restrict__ counts) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= n) return;
  int32_t c_mine = 0;
  for (int64_t c = threadIdx.x & 31; c < k; c += 32) c_mine += rule(s[r * k + c], r * k + c);
  for (int offset = 16; offset > 0; offset >>= 1) c_mine += __shfl_xor_sync(0xffffffffu, c_mine, offset);
  if ((threadIdx.x & 31) == 0) counts[r] = c_mine;
}

// One warp per row: its outliers' columns (ascending) and fp16 values at rowptr[r].
__global__ void row_outlier_write_kernel(const float* __restrict__ w, const float* __restrict__ s, int64_t n,
                                         int64_t k, OutlierRule rule, const int32_t* __restrict__ rowptr,
                                         int32_t* __restrict__ col, uint16_t* __restrict__ val) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (r >= n) return;
  const int lane = threadIdx.x & 31;
  int64_t at = rowptr[r];
  for (int64_t c0 = 0; c0 < k; c0 += 32) {
    const int64_t c = c0 + lane;
    const bool out = c < k && rule(s[r * k + c], r * k + c);
    const uint32_t ballot = __ballot_sync(0xffffffffu, out);
    if (out) {
      const int64_t slot = at + __popc(ballot & ((1u << lane) - 1u));
      col[slot] = static_cast<int32_t>(c);
      val[slot] = row::f32_to_f16(w[r * k + c]);
    }
    at += __popc(ballot);
  }
}

// Sort keys of rows [r0, r0 + rows): the values' order-preserving bits, outliers last; the columns as payload.
__global__ void sort_keys_kernel(const float* __restrict__ w, const float* __restrict__ s, int64_t r0, int64_t rows,
                                 int64_t k, bool has_outliers, OutlierRule rule, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ cols) {
  const int64_t total = rows * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t flat = r0 * k + i;
    uint32_t u = __float_as_uint(w[flat]);
    if (u == 0x80000000u) u = 0;
    uint32_t key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    if (has_outliers && rule(s[flat], flat)) key = 0xffffffffu;
    keys[i] = key;
    cols[i] = static_cast<int32_t>(i % k);
  }
}

__global__ void segment_offsets_kernel(int64_t rows, int64_t k, int64_t* __restrict__ offsets) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i <= rows) offsets[i] = i * k;
}

// Per-chunk device storage behind anyprec_row::RowScratch (strides per row in the comments).
struct ChunkScratch {
  DeviceBuffer<float> xs;                             // k
  DeviceBuffer<double> ws;                            // k
  DeviceBuffer<double> pw, pwx, pwxx;                 // k + 1
  DeviceBuffer<double> dp_prev, dp_cur;               // k + 1 (exact seeds)
  DeviceBuffer<int32_t> dp_arg;                       // (K - 1)(k + 1) (exact seeds)
  DeviceBuffer<int64_t> start, next;                  // kSmallEntries
  DeviceBuffer<double> centroids, c16;                // kSmallEntries
  DeviceBuffer<uint16_t> lut, next_lut;               // kSmallEntries
};

struct RowKernelArgs {
  const float* w;
  const float* s;
  const int32_t* sorted_cols;     // [rows, k]
  const int32_t* outlier_count;   // [n] or null
  int64_t r0, rows, k;
  int dp_layers;                  // K - 1 for exact seeds, else 0
  row::RowParams params;
  float* xs;
  double *ws, *pw, *pwx, *pwxx, *dp_prev, *dp_cur;
  int32_t* dp_arg;
  int64_t *start, *next;
  double *centroids, *c16;
  uint16_t *lut, *next_lut;
  uint8_t* codes;                 // [rows, k], zeroed
  uint16_t* luts[row::kMaxBits + 1];   // width b: [rows, 2^b] or null
};

__global__ void __launch_bounds__(32 * kWarpsPerBlock) row_kernel(RowKernelArgs a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (i >= a.rows) return;   // whole warps leave together: the shuffles below see full warps
  const int64_t r = a.r0 + i;
  const int64_t k = a.k, k1 = k + 1;
  const int64_t m = k - (a.outlier_count ? a.outlier_count[r] : 0);
  row::RowScratch s{a.xs + i * k,
                    a.ws + i * k,
                    {a.pw + i * k1, a.pwx + i * k1, a.pwxx + i * k1},
                    {a.dp_layers > 0 ? a.dp_prev + i * k1 : nullptr, a.dp_layers > 0 ? a.dp_cur + i * k1 : nullptr,
                     a.dp_layers > 0 ? a.dp_arg + i * a.dp_layers * k1 : nullptr},
                    a.start + i * kSmallEntries,
                    a.next + i * kSmallEntries,
                    a.centroids + i * kSmallEntries,
                    a.c16 + i * kSmallEntries,
                    a.lut + i * kSmallEntries,
                    a.next_lut + i * kSmallEntries};
  // The core indexes LUTs by the row it is given: pass the chunk-local row and the chunk's tables.
  row::quantize_row<WarpLoops>(a.w + r * k, a.s + r * k, a.sorted_cols + i * k, m, a.params, s, i, a.codes + i * k,
                               a.luts);
}

int blocks_for(int64_t count, int threads) {
  return static_cast<int>(std::min<int64_t>((count + threads - 1) / threads, int64_t{4} * 132 * 16));
}

// Runs count_kernel and returns its total (synchronising the stream).
uint64_t count_pass(const float* s, int64_t count, uint32_t threshold, int64_t tie_end, unsigned long long* d_total,
                    cudaStream_t stream) {
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(d_total, 0, sizeof(unsigned long long), stream));
  count_kernel<<<blocks_for(count, kCountThreads), kCountThreads, 0, stream>>>(s, count, threshold, tie_end, d_total);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  unsigned long long h = 0;
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(&h, d_total, sizeof h, cudaMemcpyDeviceToHost, stream));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

template <typename T>
T download_one(const T* d, cudaStream_t stream) {
  T h{};
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(T), cudaMemcpyDeviceToHost, stream));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

}  // namespace

AnyPrecQuantized anyprec_quantize_gpu(const float* w, const float* sens, int64_t n, int64_t k,
                                      const AnyPrecOptions& o, cudaStream_t stream) {
  const uint32_t mask = anyprec_width_mask(o);
  LOWBIT_CHECK(n >= 0 && k >= 0, "anyprec (GPU): bad shape ", n, " x ", k);
  LOWBIT_CHECK(k < (int64_t{1} << 31), "anyprec: rows of ", k, " values (at most 2^31 - 1)");
  if (n == 0 || k == 0) return anyprec_quantize(w, sens, n, k, o);   // touches neither pointer
  const int64_t count = n * k;

  // The CPU's checks, in its order: the first non-finite weight, then the first bad sensitivity.
  {
    DeviceBuffer<unsigned long long> first_bad(2);
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(first_bad.get(), 0xff, first_bad.bytes(), stream));
    first_bad_kernel<<<blocks_for(count, kCountThreads), kCountThreads, 0, stream>>>(w, sens, count, first_bad.get(),
                                                                                     first_bad.get() + 1);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    const unsigned long long bad_w = download_one(first_bad.get(), stream);
    const unsigned long long bad_s = download_one(first_bad.get() + 1, stream);
    if (bad_w != ULLONG_MAX) {
      const float v = download_one(w + bad_w, stream);
      LOWBIT_CHECK(false, "anyprec: weight ", bad_w, " is not finite (", v, "); refusing to quantize");
    }
    if (bad_s != ULLONG_MAX) {
      const float v = download_one(sens + bad_s, stream);
      LOWBIT_CHECK(false, "anyprec: sensitivity ", bad_s, " is ", v, " (needs a finite non-negative value)");
    }
  }

  AnyPrecQuantized q;
  q.n = n;
  q.k = k;
  q.planes = o.parent_bits;
  q.widths = mask;
  q.codes.assign(static_cast<size_t>(count), 0);
  for (int b = o.seed_bits; b <= o.parent_bits; ++b)
    if ((mask >> b) & 1u) q.luts[b].assign(static_cast<size_t>(n << b), 0);

  // Outliers: threshold and tie cut, then the CSR.
  const int64_t n_out = static_cast<int64_t>(std::llround(o.outlier_fraction * static_cast<double>(count)));
  OutlierRule rule;
  DeviceBuffer<int32_t> outlier_count;
  if (n_out > 0) {
    DeviceBuffer<unsigned long long> total(1);
    uint32_t lo = 0, hi = 0xffffffffu;   // the largest T with #{key >= T} >= n_out
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2 + 1;
      if (count_pass(sens, count, mid, -1, total.get(), stream) >= static_cast<uint64_t>(n_out)) lo = mid;
      else hi = mid - 1;
    }
    rule.threshold = lo;
    const uint64_t above = lo == 0xffffffffu ? 0 : count_pass(sens, count, lo + 1, -1, total.get(), stream);
    const uint64_t need = static_cast<uint64_t>(n_out) - above;   // >= 1 ties at T, the first by index
    int64_t ilo = 1, ihi = count;
    while (ilo < ihi) {
      const int64_t mid = ilo + (ihi - ilo) / 2;
      if (count_pass(sens, count, lo, mid, total.get(), stream) >= need) ihi = mid;
      else ilo = mid + 1;
    }
    rule.tie_end = ilo;

    outlier_count = DeviceBuffer<int32_t>(static_cast<size_t>(n));
    const int row_blocks = static_cast<int>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
    row_outlier_count_kernel<<<row_blocks, 32 * kWarpsPerBlock, 0, stream>>>(sens, n, k, rule, outlier_count.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    std::vector<int32_t> counts(static_cast<size_t>(n));
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(counts.data(), outlier_count.get(), outlier_count.bytes(),
                                      cudaMemcpyDeviceToHost, stream));
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    q.outlier_rowptr.assign(static_cast<size_t>(n + 1), 0);
    int64_t nnz = 0;
    for (int64_t r = 0; r < n; ++r) {
      nnz += counts[static_cast<size_t>(r)];
      LOWBIT_CHECK(nnz <= INT32_MAX, "anyprec: more than 2^31 - 1 outliers");
      q.outlier_rowptr[static_cast<size_t>(r + 1)] = static_cast<int32_t>(nnz);
    }
    LOWBIT_CHECK(nnz == n_out, "anyprec (GPU): selected ", nnz, " outliers, expected ", n_out);
    const DeviceBuffer<int32_t> rowptr(q.outlier_rowptr);
    DeviceBuffer<int32_t> col(static_cast<size_t>(nnz));
    DeviceBuffer<uint16_t> val(static_cast<size_t>(nnz));
    row_outlier_write_kernel<<<row_blocks, 32 * kWarpsPerBlock, 0, stream>>>(w, sens, n, k, rule, rowptr.get(),
                                                                             col.get(), val.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    q.outlier_col = col.download();
    q.outlier_val = val.download();
  }

  // Rows per chunk from the scratch they need.
  const int seed_clusters = 1 << o.seed_bits;
  const bool exact = seed_clusters <= row::kExactMaxClusters;
  const int dp_layers = exact ? seed_clusters - 1 : 0;
  const int64_t k1 = k + 1;
  int64_t lut_bytes_per_row = 0;
  for (const auto& [b, lut] : q.luts) lut_bytes_per_row += int64_t{2} << b;
  const int64_t bytes_per_row = k * (4 + 4 + 4 + 4 + 4 + 8 + 1) + k1 * (3 * 8 + (exact ? 2 * 8 + 4 * dp_layers : 0)) +
                                kSmallEntries * (2 * 8 + 2 * 8 + 2 * 2) + lut_bytes_per_row + 8;
  size_t free_bytes = 0, total_bytes = 0;
  LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t budget = std::min<int64_t>(static_cast<int64_t>(kScratchShareOfFree * static_cast<double>(free_bytes)),
                                           kScratchCapBytes);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, budget / bytes_per_row));

  const auto rows_k = static_cast<size_t>(chunk * k), rows_k1 = static_cast<size_t>(chunk * k1);
  DeviceBuffer<uint32_t> keys_in(rows_k), keys_out(rows_k);
  DeviceBuffer<int32_t> cols_in(rows_k), cols_out(rows_k);
  DeviceBuffer<int64_t> offsets(static_cast<size_t>(chunk + 1));
  ChunkScratch sc{DeviceBuffer<float>(rows_k),
                  DeviceBuffer<double>(rows_k),
                  DeviceBuffer<double>(rows_k1),
                  DeviceBuffer<double>(rows_k1),
                  DeviceBuffer<double>(rows_k1),
                  DeviceBuffer<double>(exact ? rows_k1 : 0),
                  DeviceBuffer<double>(exact ? rows_k1 : 0),
                  DeviceBuffer<int32_t>(exact ? rows_k1 * static_cast<size_t>(dp_layers) : 0),
                  DeviceBuffer<int64_t>(static_cast<size_t>(chunk * kSmallEntries)),
                  DeviceBuffer<int64_t>(static_cast<size_t>(chunk * kSmallEntries)),
                  DeviceBuffer<double>(static_cast<size_t>(chunk * kSmallEntries)),
                  DeviceBuffer<double>(static_cast<size_t>(chunk * kSmallEntries)),
                  DeviceBuffer<uint16_t>(static_cast<size_t>(chunk * kSmallEntries)),
                  DeviceBuffer<uint16_t>(static_cast<size_t>(chunk * kSmallEntries))};
  DeviceBuffer<uint8_t> codes(rows_k);
  DeviceBuffer<uint16_t> luts[row::kMaxBits + 1];
  for (const auto& [b, lut] : q.luts) luts[b] = DeviceBuffer<uint16_t>(static_cast<size_t>(chunk << b));

  size_t sort_bytes = 0;
  LOWBIT_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(nullptr, sort_bytes, keys_in.get(), keys_out.get(),
                                                              cols_in.get(), cols_out.get(), chunk * k, chunk,
                                                              offsets.get(), offsets.get() + 1, stream));
  DeviceBuffer<unsigned char> sort_temp(std::max<size_t>(sort_bytes, 1));

  RowKernelArgs args{};
  args.w = w;
  args.s = sens;
  args.sorted_cols = cols_out.get();
  args.outlier_count = n_out > 0 ? outlier_count.get() : nullptr;
  args.k = k;
  args.dp_layers = dp_layers;
  args.params = {o.seed_bits, o.parent_bits, o.max_iter, mask};
  args.xs = sc.xs.get();
  args.ws = sc.ws.get();
  args.pw = sc.pw.get();
  args.pwx = sc.pwx.get();
  args.pwxx = sc.pwxx.get();
  args.dp_prev = sc.dp_prev.get();
  args.dp_cur = sc.dp_cur.get();
  args.dp_arg = sc.dp_arg.get();
  args.start = sc.start.get();
  args.next = sc.next.get();
  args.centroids = sc.centroids.get();
  args.c16 = sc.c16.get();
  args.lut = sc.lut.get();
  args.next_lut = sc.next_lut.get();
  args.codes = codes.get();
  for (int b = 0; b <= row::kMaxBits; ++b) args.luts[b] = luts[b].get();

  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    sort_keys_kernel<<<blocks_for(rows * k, 256), 256, 0, stream>>>(w, sens, r0, rows, k, n_out > 0, rule,
                                                                     keys_in.get(), cols_in.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    segment_offsets_kernel<<<static_cast<int>((rows + 256) / 256), 256, 0, stream>>>(rows, k, offsets.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    size_t temp_bytes = sort_temp.size();
    LOWBIT_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(sort_temp.get(), temp_bytes, keys_in.get(),
                                                                keys_out.get(), cols_in.get(), cols_out.get(),
                                                                rows * k, rows, offsets.get(), offsets.get() + 1,
                                                                stream));
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(codes.get(), 0, static_cast<size_t>(rows * k), stream));
    args.r0 = r0;
    args.rows = rows;
    row_kernel<<<static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
        args);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(q.codes.data() + r0 * k, codes.get(), static_cast<size_t>(rows * k),
                                      cudaMemcpyDeviceToHost, stream));
    for (auto& [b, lut] : q.luts)
      LOWBIT_CUDA_CHECK(cudaMemcpyAsync(lut.data() + (r0 << b), luts[b].get(),
                                        static_cast<size_t>(rows << b) * sizeof(uint16_t), cudaMemcpyDeviceToHost,
                                        stream));
    // The next chunk overwrites the scratch and the output buffers: wait for the copies.
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return q;
}

}  // namespace lowbit::cuda
