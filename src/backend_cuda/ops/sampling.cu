// One block of kThreads per row. Thread t owns the contiguous index range [t * chunk, (t + 1) * chunk), so "in index
// order" questions (which ties come first, where the inverse CDF lands) are answered by a block-wide exclusive
// scan of per-thread totals. Thresholds are found by bisection over the order-preserving integer image of the
// float logits (32 passes, each one block-wide count), which needs no sort and no extra memory.
#include "backend_cuda/ops/sampling.h"

#include <cfloat>

#include "backend_cuda/common/common.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 1024;

// Order-preserving map float -> uint32 (larger float, larger key) and back.
__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <typename T>
__device__ T block_sum(T v, T* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  T t = 0;
  for (int w = 0; w < kThreads / 32; ++w) t += red[w];
  return t;
}

__device__ float block_max(float v, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = -FLT_MAX;
  for (int w = 0; w < kThreads / 32; ++w) t = fmaxf(t, red[w]);
  return t;
}

// Exclusive prefix of v over threads in thread order (v of thread t counted before t + 1), and the total.
__device__ double block_exclusive_scan(double v, double* total, double* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = 0;
    for (int t = 0; t < kThreads; ++t) {
      const double x = buf[t];
      buf[t] = run;
      run += x;
    }
    buf[kThreads] = run;
  }
  __syncthreads();
  const double r = buf[threadIdx.x];
  *total = buf[kThreads];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int vocab, GpuSamplingParams p,
                                                           const float* u, int32_t* out) {
  __shared__ float redf[kThreads / 32];
  __shared__ double redd[kThreads / 32];
  __shared__ int redi[kThreads / 32];
  __shared__ double scan[kThreads + 1];
  const float* lg = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const float inv_t = 1.0f / p.temperature;
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);

  float mx = -FLT_MAX;
  for (int i = lo; i < hi; ++i) mx = fmaxf(mx, lg[i] * inv_t);
  mx = block_max(mx, redf);

  // Top-k: the largest key K with count(key >= K) >= k; keep key > K, and the first (k - count(key > K)) ties.
  uint32_t kk = 0;          // keep key > kk ...
  int tie_quota = 0;        // ... plus this many ties with key == kk, in index order (-1: all)
  bool use_k = p.top_k > 0 && p.top_k < vocab;
  if (use_k) {
    uint32_t a = 0, b = 0xFFFFFFFFu;   // invariant: count(>= a) >= k
    while (a < b) {
      const uint32_t mid = static_cast<uint32_t>(a + (static_cast<uint64_t>(b) - a + 1) / 2);   // no wrap at 2^32
      int c = 0;
      for (int i = lo; i < hi; ++i) c += fkey(lg[i] * inv_t) >= mid;
      if (block_sum(c, redi) >= p.top_k) a = mid;
      else b = mid - 1;
    }
    kk = a;
    int gt = 0;
    for (int i = lo; i < hi; ++i) gt += fkey(lg[i] * inv_t) > kk;
    tie_quota = p.top_k - block_sum(gt, redi);
  }
  // Ties at kk before this thread's range (index order), to apply the quota.
  int my_ties = 0;
  if (use_k)
    for (int i = lo; i < hi; ++i) my_ties += fkey(lg[i] * inv_t) == kk;
  double dummy = 0;
  const int ties_before = use_k ? static_cast<int>(block_exclusive_scan(my_ties, &dummy, scan)) : 0;
  auto kept_k = [&](int i, int& tie_seen) {
    if (!use_k) return true;
    const uint32_t key = fkey(lg[i] * inv_t);
    if (key > kk) return true;
    if (key < kk) return false;
    return ties_before + tie_seen++ < tie_quota;
  };

  // Mass of the top-k set.
  double z = 0;
  {
    int seen = 0;
    for (int i = lo; i < hi; ++i)
      if (kept_k(i, seen)) z += exp(static_cast<double>(lg[i] * inv_t - mx));
  }
  z = block_sum(z, redd);

  // Top-p: the largest key P such that the mass of {kept, key >= P} >= top_p * z; keep all of it (ties included).
  uint32_t pk = 0;
  if (p.top_p < 1.0f) {
    uint32_t a = 0, b = 0xFFFFFFFFu;   // invariant: mass(>= a) >= top_p z
    while (a < b) {
      const uint32_t mid = static_cast<uint32_t>(a + (static_cast<uint64_t>(b) - a + 1) / 2);   // no wrap at 2^32
      double m = 0;
      int seen = 0;
      for (int i = lo; i < hi; ++i)
        if (kept_k(i, seen) && fkey(lg[i] * inv_t) >= mid) m += exp(static_cast<double>(lg[i] * inv_t - mx));
      if (block_sum(m, redd) >= static_cast<double>(p.top_p) * z) a = mid;
      else b = mid - 1;
    }
    pk = a;
  }

  // Inverse CDF over the final kept set in index order.
  double mine = 0;
  {
    int seen = 0;
    for (int i = lo; i < hi; ++i)
      if (kept_k(i, seen) && fkey(lg[i] * inv_t) >= pk) mine += exp(static_cast<double>(lg[i] * inv_t - mx));
  }
  double total = 0;
  const double before = block_exclusive_scan(mine, &total, scan);
  const double target = static_cast<double>(u[blockIdx.x]) * total;
  __shared__ int chosen;
  if (threadIdx.x == 0) chosen = -1;
  __syncthreads();
  if (mine > 0 && target >= before && target < before + mine) {
    double run = before;
    int seen = 0, last = -1;
    for (int i = lo; i < hi; ++i)
      if (kept_k(i, seen) && fkey(lg[i] * inv_t) >= pk) {
        last = i;
        run += exp(static_cast<double>(lg[i] * inv_t - mx));
        if (target < run) break;
      }
    atomicMax(&chosen, last);   // one thread's interval holds the target; max() only guards rounding at an edge
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int c = chosen;
    if (c < 0) {   // target == total after rounding: the last kept token
      for (int i = vocab - 1; i >= 0 && c < 0; --i) {
        const uint32_t key = fkey(lg[i] * inv_t);
        if (key >= pk && (!use_k || key >= kk)) c = i;
      }
    }
    out[blockIdx.x] = c;
  }
}

}  // namespace

void sample_rows(const float* logits, int rows, int vocab, const GpuSamplingParams& p, const float* u, int32_t* out,
                 cudaStream_t s) {
  LOWBIT_CHECK(p.temperature > 0 && p.top_k >= 0 && p.top_p > 0 && p.top_p <= 1, "GPU sampling: temperature > 0, "
               "top_k >= 0, top_p in (0, 1] (got ", p.temperature, ", ", p.top_k, ", ", p.top_p, ")");
  if (rows > 0) sample_kernel<<<rows, kThreads, 0, s>>>(logits, vocab, p, u, out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
