#include "backend_cuda/ops/gpu_ops.h"

#include <algorithm>
#include <cfloat>
#include <cooperative_groups.h>
#include <type_traits>

#include "backend_cuda/common/common.h"
#include "backend_cuda/anyprec/int8_tables.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/ops/kv_row.cuh"
#include "backend_cuda/ops/rms.cuh"
#include "backend_cuda/ops/swiglu.cuh"
#include "backend_cuda/quik/quik_row_sink.cuh"
#include "core/knobs.h"

namespace lowbit::cuda {
namespace {

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// max |v| as ordered bits (non-negative floats order as unsigned; a NaN, 0x7fc00000 after fabsf, tops +inf, so it
// propagates as i8_absmax_step does): for atomicMax into an exact row max (the int8 GEMV's column scale).
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(fabsf(v)); }
// One atomicMax per warp of the lanes' |v| into *slot (every lane of the warp calls it, all for the same slot).
__device__ __forceinline__ void warp_atomic_absmax(unsigned* slot, float v) {
  const unsigned m = __reduce_max_sync(0xffffffffu, abs_bits(v));
  if (threadIdx.x % 32 == 0) atomicMax(slot, m);
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__global__ void embed_kernel(const __half* emb, const int32_t* tokens, int dim, float* x) {
  pdl_launch_dependents();
  pdl_wait();
  const int r = blockIdx.x;
  const __half* e = emb + static_cast<int64_t>(tokens[r]) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) x[static_cast<int64_t>(r) * dim + i] = __half2float(e[i]);
}

// One block per row. With delta != nullptr the residual is added first (x += delta, written back), so the
// residual add and the next norm are one pass over x. With yh != nullptr the normalised row is also written in
// fp16 (the dense linears' cuBLAS input, converted once for every linear that reads it). The row is read once
// into registers as float4 (up to kNormVec per thread, as many threads as the row needs, <= 1024), so a decode
// step's single row costs one round of loads instead of a loop of dependent ones.
constexpr int kNormVec = 4;
// xmax != nullptr: max |y| of the row into xmax[row] (exact, the int8 GEMV's column scale: its x kernel then skips
// the row-wide reduction); zero != nullptr: zero[row] = 0 (a slot other kernels atomicMax into later in the step).
__global__ void __launch_bounds__(1024) rmsnorm_kernel(float* x, const float* delta, const float* w, float* y,
                                                       __half* yh, int dim, float eps, float* xmax, float* zero) {
  pdl_launch_dependents();
  const int n4 = dim / 4;
  // The norm's weights are loaded before the wait (they are weights: no kernel before writes them), so the one round
  // of memory latency after it is the row's (H200, Llama-2-7B 3-bit decode with the RoPE tables below: 508.3 / 508.0
  // -> 513.0 / 512.4 tok/s, runs alternated; per-launch timestamps: the GEMV-to-x-kernel gap across a norm 4.0-4.5 ->
  // 2.9-3.5 us).
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4 wv[kNormVec];
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * static_cast<int>(blockDim.x);
    if (i < n4) wv[j] = w4[i];
  }
  pdl_wait();
  float4* xr = reinterpret_cast<float4*>(x + static_cast<int64_t>(blockIdx.x) * dim);
  const float4* dr = delta != nullptr ? reinterpret_cast<const float4*>(delta + static_cast<int64_t>(blockIdx.x) * dim) : nullptr;
  float4 v[kNormVec];
  const float inv = block_rms_inv(load_residual_row(xr, dr, n4, v), dim, eps);
  float4* yr = reinterpret_cast<float4*>(y + static_cast<int64_t>(blockIdx.x) * dim);
  float mx = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * static_cast<int>(blockDim.x);
    if (i < n4) {
      const float4 o = rms_scale(v[j], wv[j], inv);
      mx = i8_absmax_step(i8_absmax_step(i8_absmax_step(i8_absmax_step(mx, o.x), o.y), o.z), o.w);
      yr[i] = o;
      if (yh != nullptr) {
        __half2* h = reinterpret_cast<__half2*>(yh + static_cast<int64_t>(blockIdx.x) * dim) + 2 * i;
        h[0] = __floats2half2_rn(o.x, o.y);
        h[1] = __floats2half2_rn(o.z, o.w);
      }
    }
  }
  if (zero != nullptr && threadIdx.x == 0) zero[blockIdx.x] = 0.0f;
  if (xmax != nullptr) {
    __shared__ float red[32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = i8_absmax_step(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
    __syncthreads();
    if (threadIdx.x < 32) {   // warp 0 merges the warps' maxima by shuffles (a max: any order gives the same value)
      mx = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = i8_absmax_step(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      if (threadIdx.x == 0) xmax[blockIdx.x] = mx;
    }
  }
}

// The same for any width (dim not a multiple of 4, or wider than 1024 threads x kNormVec float4): strided loops.
__global__ void rmsnorm_any_kernel(float* x, const float* delta, const float* w, float* y, __half* yh, int dim, float eps) {
  pdl_launch_dependents();
  pdl_wait();
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  const float* dr = delta != nullptr ? delta + static_cast<int64_t>(blockIdx.x) * dim : nullptr;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (dr != nullptr) {
      v += dr[i];
      xr[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  const float inv = block_rms_inv(ss, dim, eps);
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = w[i] * (xr[i] * inv);   // each thread re-reads only the elements it wrote itself
    yr[i] = v;
    if (yh != nullptr) yh[static_cast<int64_t>(blockIdx.x) * dim + i] = __float2half_rn(v);
  }
}

// The rotation of one pair (a, b) = (x[i], x[i + hd / 2]) by (c, s): the one expression rope_kv_store_kernel and the
// attention that folds it in both use (explicit roundings, so both give the same bits).
__device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float& lo, float& hi) {
  lo = __fmaf_rn(a, c, -__fmul_rn(b, s));
  hi = __fmaf_rn(b, c, __fmul_rn(a, s));
}

// grid (rows, slices): q rotated into q_out (row stride heads * hd; may be q itself); k rotated and, with v, stored
// into the fp16 cache at (seq[r], pos[r]). q, k, v rows are q_ld / kv_ld floats apart (one fused q/k/v output row).
// The row's work is spread over gridDim.y blocks so that a decode step's few rows still fill several SMs.
__global__ void rope_kv_store_kernel(const float* q, int64_t q_ld, const float* k, const float* v, int64_t kv_ld,
                                     float* q_out, const int32_t* seq, const int32_t* pos, int heads, int kv_heads, int hd,
                                     const float* cos_t, const float* sin_t, int layer, KvMap map,
                                     __half* kc, __half* vc) {
  pdl_launch_dependents();
  const int r = blockIdx.x, half = hd / 2, kvd = kv_heads * hd;
  const int first = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x), step = static_cast<int>(gridDim.y * blockDim.x);
  // The tables are weights and pos was copied in before the forward began (as attention's early loads, launch.cuh): when
  // every index a thread visits has the same rotation pair (step a multiple of half), its one cos / sin is loaded
  // before the wait.
  const bool one_pair = step % half == 0;
  float c1 = 0.0f, s1 = 0.0f;
  if (one_pair) {
    c1 = cos_t[static_cast<int64_t>(pos[r]) * half + first % half];
    s1 = sin_t[static_cast<int64_t>(pos[r]) * half + first % half];
  }
  pdl_wait();
  const float* cs = cos_t + static_cast<int64_t>(pos[r]) * half;
  const float* sn = sin_t + static_cast<int64_t>(pos[r]) * half;
  for (int idx = first; idx < heads * half; idx += step) {
    const int h = idx / half, i = idx % half;
    const float* qv = q + r * q_ld + h * hd;
    float* qo = q_out + (static_cast<int64_t>(r) * heads + h) * hd;
    const float a = qv[i], b = qv[i + half];
    const float c = one_pair ? c1 : cs[i], sv = one_pair ? s1 : sn[i];
    rope_rotate(a, b, c, sv, qo[i], qo[i + half]);
  }
  const int64_t base = kv_row(map, seq[r], layer, pos[r]) * kvd;
  for (int idx = first; idx < kv_heads * half; idx += step) {
    const int h = idx / half, i = idx % half;
    const float* kv = k + r * kv_ld + h * hd;
    const float a = kv[i], b = kv[i + half];
    const float c = one_pair ? c1 : cs[i], sv = one_pair ? s1 : sn[i];
    float lo, hi;
    rope_rotate(a, b, c, sv, lo, hi);
    kc[base + h * hd + i] = __float2half_rn(lo);
    kc[base + h * hd + i + half] = __float2half_rn(hi);
  }
  for (int i = first; i < kvd; i += step) vc[base + i] = __float2half_rn(v[r * kv_ld + i]);
}

constexpr int kAttnWarps = 4;
constexpr int kMaxHd = 256;
constexpr int kTableRun = 512;   // paged caches: block numbers per attention block held in shared memory
constexpr int kMinPagedBlock = 16;   // positions per block at least: a 32-key chunk spans at most three blocks
constexpr int kMaxClusterSplits = 8;   // the portable cluster size

// The key splits' partials (m, l, acc[hd], as attention_kernel leaves them; part(s) points at split s's) merged into
// out [hd] by the block's threads, and the row's max |out| into xmax_bits (one atomic per warp): the combine kernel's
// and the clustered attention's one arithmetic, so the two give the same bits.
template <typename Part>
__device__ __forceinline__ void combine_splits(Part part, int splits, int hd, float* out, unsigned* xmax_bits) {
  float M = -FLT_MAX;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, part(s)[0]);
  float L = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float ms = part(s)[0];
    if (ms != -FLT_MAX) L += part(s)[1] * __expf(ms - M);
  }
  float mx = 0.0f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = part(s)[0];
      if (ms != -FLT_MAX) a += part(s)[2 + d] * __expf(ms - M);
    }
    const float o = L > 0.0f ? a / L : 0.0f;
    out[d] = o;
    mx = i8_absmax_step(mx, o);
  }
  if (xmax_bits != nullptr) warp_atomic_absmax(xmax_bits, mx);
}

// grid (rows, heads, splits), 4 warps. Each warp takes chunks of 32 keys in turn: phase 1, lane j scores key
// c0 + j against q (full dot product over hd from the fp16 row); phase 2, the warp adds p_j v_j over the chunk.
// Online softmax per warp, the 4 warps merged in shared memory, then either the final output (splits == 1) or a
// partial (m, l, acc) for attention_combine_kernel, or (cluster != 0: launched in clusters of the splits blocks of one
// row and head) a partial in the block's shared memory, merged by the cluster's first block from the others' shared
// memory (combine_splits, the combine kernel's arithmetic): no combine kernel.
// HD > 0: the head dimension known at compile time (64, 128, 256): the key row is loaded as HD/8 independent
// 16-byte loads and lane l owns the dimension pairs 2l + 64p, read as half2 with eight keys in flight; HD == 0:
// any even head dimension, element by element.
template <int HD, bool kPrefetch, bool kPaged>
// Blocks per SM the registers must allow: the decode form with values prefetched (head dims 64, 128) 3, so that a 7B
// decode grid (32 heads x 9 key splits) fits one wave (the folded RoPE took it to 230 registers unbounded, 168 with 48
// bytes spilled at 3); elsewhere no bound (0: an explicit 1 let prefill grow from 40-64 to 72-144 registers and the
// 512-token prefill fall ~5%, H200).
__global__ void __launch_bounds__(kAttnWarps * 32, kPrefetch && (HD == 64 || HD == 128) ? 3 : 0) attention_kernel(
    const float* q, const int32_t* seq, const int32_t* pos, int heads, int kv_heads, int hd, int layer, KvMap map,
    int window, const __half* kc, const __half* vc, float* out, int splits, float* scratch,
    int single_token, unsigned* xmax_bits, RopeIn rope, int cluster, QuikRowSink sink) {
  pdl_launch_dependents();
  constexpr bool kPrefetchV = kPrefetch && (HD == 64 || HD == 128);
  // Early loads (the decode form, one new token per sequence): every key but the row's own position p was written by
  // an earlier forward, and pos / seq by this forward's host-to-device copies; a copy in the stream (every forward and
  // decode step starts with them, gpu_model.cu) waits for everything before it, so all of that is complete now
  // (launch.cuh). So the first chunk's keys and values are loaded before pdl_wait(), their memory latency hidden behind
  // the kernels before this one; position p, stored by rope_kv_store just before, is reloaded after the wait.
  const bool early = kPrefetchV && single_token != 0;
  if (!early) pdl_wait();
  __shared__ float qs[kMaxHd];
  __shared__ float ps[kAttnWarps][32];
  __shared__ float wm[kAttnWarps], wl[kAttnWarps];
  __shared__ float wacc[kAttnWarps][kMaxHd];
  __shared__ float part[kMaxHd + 2];   // cluster: this split's (m, l, acc)
  if constexpr (HD > 0) hd = HD;
  const int r = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvd = kv_heads * hd, kvh = h / (heads / kv_heads);
  const int p = pos[r];
  const int first = window > 0 ? max(0, p - window + 1) : 0;
  const int span = p + 1 - first;
  const int per = (span + splits - 1) / splits;
  const int k0 = first + split * per, k1 = min(p + 1, k0 + per);
  const float scale = rsqrtf(static_cast<float>(hd));
  const int sq = seq[r];
  const __half* kb = kc + static_cast<int64_t>(kvh) * hd;
  const __half* vb = vc + static_cast<int64_t>(kvh) * hd;
  // The cache rows (kv_row) of a chunk's keys c0 .. c0 + 31. Contiguous (kPaged false): consecutive from the
  // sequence's base. Paged: the chunk spans at most three blocks (blocks of 16 positions or more), whose rows are
  // found once per chunk; key c0 + jj is then row r[(o + jj) >> shift] + ((o + jj) & mask), o = c0's offset in its
  // block: a few integer operations per key, no table read in front of each key's load. The block numbers of
  // the keys [k0, k1) are read into shared memory at the start (up to kTableRun of them; past that, from the table).
  const int64_t cbase = (static_cast<int64_t>(sq) * map.layers + layer) * map.block;
  const int mask = static_cast<int>((1u << map.shift) - 1u);
  __shared__ int32_t blk_s[kPaged ? kTableRun : 1];
  const int b0 = kPaged ? k0 >> map.shift : 0;
  const int nb = kPaged && k1 > k0 ? ((k1 - 1) >> map.shift) - b0 + 1 : 0;
  const bool table_in_smem = kPaged && nb > 0 && nb <= kTableRun;
  if constexpr (kPaged) {
    if (table_in_smem) {
      const int32_t* t = map.table + static_cast<int64_t>(sq) * map.max_blocks + b0;
      for (int i = threadIdx.x; i < nb; i += blockDim.x) blk_s[i] = __ldg(t + i);
      __syncthreads();
    }
  }
  auto block_row = [&](int b) -> int64_t {   // row of the block's first position
    const int32_t blk = table_in_smem ? blk_s[b - b0] : __ldg(map.table + static_cast<int64_t>(sq) * map.max_blocks + b);
    return (static_cast<int64_t>(blk) * map.layers + layer) * map.block;
  };
  struct ChunkRows {
    int64_t r0 = 0, r1 = 0, r2 = 0;
    int o = 0;
  };
  auto chunk_rows = [&](int c0) {
    ChunkRows c;
    if constexpr (!kPaged) {
      c.r0 = cbase + c0;
    } else {
      const int bf = c0 >> map.shift, bl = min(c0 + 31, k1 - 1) >> map.shift;
      c.o = c0 & mask;
      c.r0 = block_row(bf);
      if (bf + 1 <= bl) c.r1 = block_row(bf + 1);
      if (bf + 2 <= bl) c.r2 = block_row(bf + 2);
    }
    return c;
  };
  auto row_in = [&](const ChunkRows& c, int jj) -> int64_t {
    if constexpr (!kPaged) {
      return c.r0 + jj;
    } else {
      const int t = c.o + jj, i = t >> map.shift;
      return (i == 0 ? c.r0 : i == 1 ? c.r1 : c.r2) + (t & mask);
    }
  };
  // kPrefetchV (decode, head dims 64, 128): the chunk's 32 value rows are loaded with its keys, before the scores
  // exist (they do not depend on them), so a chunk costs one round of memory latency instead of one for the keys and
  // four more for the values (8 in flight); keys past the range load nothing and hold zeros (their weight is 0 too).
  // It takes 168 registers at hd 128 (62 without): prefill, with thousands of blocks, keeps the occupancy instead
  // (measured on the H100, Llama-2-7B shape: decode attention 431 -> 413 us per step, 512-token prefill 12% slower
  // with the prefetch).
  uint32_t vpre[kPrefetchV ? 32 : 1][kPrefetchV ? HD / 64 : 1];
  uint4 kraw[kPrefetchV ? HD / 8 : 1];
  // kPrefetchV: the keys of lane j = c0 + lane and the chunk's value rows; with only >= 0, key and value row c0 + only
  // alone (position p reloaded after the wait), the others kept.
  auto load_chunk = [&](int c0, int only) {
    if constexpr (kPrefetchV) {
      const int cnt = min(32, k1 - c0);
      const ChunkRows cr = chunk_rows(c0);
#pragma unroll
      for (int jj = 0; jj < 32; ++jj) {
        if (only >= 0 && jj != only) continue;
        const __half* vr = vb + row_in(cr, jj) * kvd + 2 * lane;
#pragma unroll
        for (int pp = 0; pp < HD / 64; ++pp) vpre[jj][pp] = jj < cnt ? *reinterpret_cast<const uint32_t*>(vr + 64 * pp) : 0u;
      }
      if (c0 + lane < k1 && (only < 0 || lane == only)) {
        const __half* kr = kb + row_in(cr, lane) * kvd;
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) kraw[i] = *reinterpret_cast<const uint4*>(kr + 8 * i);
      }
    }
  };
  // RoPE folded in (rope.q != nullptr, the early form only). The rotation tables are read after the wait, beside the
  // rows they rotate (one round of latency either way; before the wait they held registers across it: 232 a thread).
  const bool fold = kPrefetchV && early && rope.q != nullptr;
  const int64_t tb = static_cast<int64_t>(p) * (hd / 2);   // the tables' row of position p
  // fold: the new position p in the warp's chunk at c0 (warp-uniform): its key rotated and its value from the linears'
  // rows, rounded to fp16 as rope_kv_store stores them, into lane p - c0's key registers and every lane's value row
  // p - c0; the first head of each kv group writes both to the cache.
  __shared__ __align__(16) __half knew[kAttnWarps][kPrefetchV ? HD : 2];
  auto patch_new = [&](int c0) {
    if constexpr (kPrefetchV) {
      const float* kr = rope.k + static_cast<int64_t>(r) * rope.kv_ld + static_cast<int64_t>(kvh) * hd;
      const float* vr = rope.v + static_cast<int64_t>(r) * rope.kv_ld + static_cast<int64_t>(kvh) * hd;
      const bool store = h % (heads / kv_heads) == 0;
      // kv_row, not the chunk's rows: a chunk that ends this split's range short of p may still hold p, outside the
      // blocks read for the range.
      const int64_t at = kv_row(map, sq, layer, p) * kvd + static_cast<int64_t>(kvh) * hd;
#pragma unroll
      for (int t = 0; t < HD / 64; ++t) {   // pairs i = lane + 32 t
        const int i = lane + 32 * t;
        float lo, hi;
        rope_rotate(kr[i], kr[i + HD / 2], rope.cos_t[tb + i], rope.sin_t[tb + i], lo, hi);
        knew[warp][i] = __float2half_rn(lo);
        knew[warp][i + HD / 2] = __float2half_rn(hi);
        if (store) {
          rope.kc[at + i] = knew[warp][i];
          rope.kc[at + i + HD / 2] = knew[warp][i + HD / 2];
        }
      }
      const int jn = p - c0;
#pragma unroll
      for (int pp = 0; pp < HD / 64; ++pp) {
        const __half2 v2 = __floats2half2_rn(vr[2 * lane + 64 * pp], vr[2 * lane + 64 * pp + 1]);
        if (store) *reinterpret_cast<__half2*>(rope.vc + at + 2 * lane + 64 * pp) = v2;
        const uint32_t u = *reinterpret_cast<const uint32_t*>(&v2);
#pragma unroll
        for (int jj = 0; jj < 32; ++jj)
          if (jj == jn) vpre[jj][pp] = u;
      }
      __syncwarp();
      if (lane == jn) {
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) kraw[i] = reinterpret_cast<const uint4*>(knew[warp])[i];
      }
      __syncwarp();
    }
  };
  const int c_first = k0 + warp * 32;
  if (early) {
    if (c_first < k1) load_chunk(c_first, -1);
    pdl_wait();
    if (!fold && c_first < k1 && p >= c_first && p < c_first + 32) load_chunk(c_first, p - c_first);   // this chunk holds p
  }
  if (fold) {
    if (threadIdx.x < hd) {
      const int i = static_cast<int>(threadIdx.x) % (hd / 2);
      const float* qr = rope.q + static_cast<int64_t>(r) * rope.q_ld + static_cast<int64_t>(h) * hd;
      float lo, hi;
      rope_rotate(qr[i], qr[i + hd / 2], rope.cos_t[tb + i], rope.sin_t[tb + i], lo, hi);
      qs[threadIdx.x] = (static_cast<int>(threadIdx.x) < hd / 2 ? lo : hi) * scale;
    }
  } else {
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(static_cast<int64_t>(r) * heads + h) * hd + i] * scale;
  }
  __syncthreads();
  constexpr int kDims = kMaxHd / 32;   // accumulators per lane: dims lane + 32 i (HD == 0) or 2 lane + 64 p + {0, 1}
  float acc[kDims];
#pragma unroll
  for (int i = 0; i < kDims; ++i) acc[i] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;
  for (int c0 = c_first; c0 < k1; c0 += kAttnWarps * 32) {
    const int j = c0 + lane;
    const int cnt = min(32, k1 - c0);
    if (!early || c0 != c_first) load_chunk(c0, -1);
    if (fold && p >= c0 && p < c0 + 32) patch_new(c0);   // the chunk holds p
    ChunkRows cr;   // the forms without the prefetch: this chunk's rows
    if constexpr (!kPrefetchV) cr = chunk_rows(c0);
    float sc = -FLT_MAX;
    if (j < k1) {
      const __half* kr = kb + row_in(cr, lane) * kvd;
      float d = 0.0f;
      if constexpr (HD > 0) {
        uint4 raw[HD / 8];
        if constexpr (kPrefetchV) {
#pragma unroll
          for (int i = 0; i < HD / 8; ++i) raw[i] = kraw[i];
        } else {
#pragma unroll
          for (int i = 0; i < HD / 8; ++i) raw[i] = *reinterpret_cast<const uint4*>(kr + 8 * i);
        }
        float dp[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // four independent FMA chains
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) {
          const __half2* h2 = reinterpret_cast<const __half2*>(&raw[i]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(h2[e]);
            dp[i % 4] = fmaf(qs[8 * i + 2 * e], f.x, dp[i % 4]);
            dp[i % 4] = fmaf(qs[8 * i + 2 * e + 1], f.y, dp[i % 4]);
          }
        }
        d = (dp[0] + dp[1]) + (dp[2] + dp[3]);
      } else {
        for (int i = 0; i < hd; ++i) d = fmaf(qs[i], __half2float(kr[i]), d);
      }
      sc = d;
    }
    const float cmax = warp_max(sc);
    const float m_new = fmaxf(m, cmax);
    const float pj = j < k1 ? __expf(sc - m_new) : 0.0f;
    const float corr = __expf(m - m_new);
    l = l * corr + warp_sum(pj);
    m = m_new;
    ps[warp][lane] = pj;
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kDims; ++i) acc[i] *= corr;
    if constexpr (kPrefetchV) {
#pragma unroll
      for (int jj = 0; jj < 32; ++jj) {
        const float pw = ps[warp][jj];
#pragma unroll
        for (int pp = 0; pp < HD / 64; ++pp) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&vpre[jj][pp]));
          acc[2 * pp] = fmaf(pw, f.x, acc[2 * pp]);
          acc[2 * pp + 1] = fmaf(pw, f.y, acc[2 * pp + 1]);
        }
      }
    } else if constexpr (HD > 0) {
#pragma unroll 8
      for (int jj = 0; jj < cnt; ++jj) {
        const float pw = ps[warp][jj];
        const __half* vr = vb + row_in(cr, jj) * kvd + 2 * lane;
#pragma unroll
        for (int pp = 0; pp < HD / 64; ++pp) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(vr + 64 * pp));
          acc[2 * pp] = fmaf(pw, f.x, acc[2 * pp]);
          acc[2 * pp + 1] = fmaf(pw, f.y, acc[2 * pp + 1]);
        }
      }
    } else {
      for (int jj = 0; jj < cnt; ++jj) {
        const float pw = ps[warp][jj];
        const __half* vr = vb + row_in(cr, jj) * kvd;
#pragma unroll
        for (int i = 0; i < kDims; ++i) {
          const int d = lane + 32 * i;
          if (d < hd) acc[i] = fmaf(pw, __half2float(vr[d]), acc[i]);
        }
      }
    }
    __syncwarp();
  }
  // Merge the warps.
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = HD > 0 ? 2 * lane + 64 * (i / 2) + (i % 2) : lane + 32 * i;
    if (d < hd) wacc[warp][d] = acc[i];
  }
  __syncthreads();
  float M = -FLT_MAX;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, wm[w]);
  float L = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) L += wl[w] * (wm[w] == -FLT_MAX ? 0.0f : __expf(wm[w] - M));
  float omax = 0.0f;   // splits == 1: max |out| of the thread's dimensions
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (wm[w] != -FLT_MAX) a += wacc[w][d] * __expf(wm[w] - M);
    if (splits == 1) {
      const float o = L > 0.0f ? a / L : 0.0f;
      out[(static_cast<int64_t>(r) * heads + h) * hd + d] = o;
      omax = i8_absmax_step(omax, o);
    } else if (cluster != 0) {
      part[2 + d] = a;
      if (d == 0) {
        part[0] = M;
        part[1] = L;
      }
    } else {
      float* sp = scratch + ((static_cast<int64_t>(r) * heads + h) * splits + split) * (hd + 2);
      sp[2 + d] = a;
      if (d == 0) {
        sp[0] = M;
        sp[1] = L;
      }
    }
  }
  if (splits == 1 && xmax_bits != nullptr) warp_atomic_absmax(xmax_bits + r, omax);
  // The row's quantization for a QUIK o projection, in the outlier map's place the warps' accumulators leave.
  uint32_t* map_smem = reinterpret_cast<uint32_t*>(&wacc[0][0]);
  static_assert(sizeof(wacc) >= kSinkMapBytes);
  if (splits == 1 && sink.done != nullptr) quik_sink_part_done(sink, heads, r, out, r, 1, map_smem, true);
  if (splits > 1 && cluster != 0) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();   // every split's partial is in its block's shared memory
    if (cl.block_rank() == 0) {
      combine_splits([&](int sp) { return static_cast<const float*>(cl.map_shared_rank(part, sp)); }, splits, hd,
                     out + (static_cast<int64_t>(r) * heads + h) * hd, xmax_bits != nullptr ? xmax_bits + r : nullptr);
      if (sink.done != nullptr) quik_sink_part_done(sink, heads, r, out, r, 1, map_smem, true);
    }
    cl.sync();   // the partials stay until the first block has read them
  }
}

// xmax_bits (attention_kernel with splits == 1, attention_combine_kernel): max |out| of each row atomically into
// xmax_bits[row] (as abs_bits; zeroed earlier in the step), one atomic per warp.
__global__ void attention_combine_kernel(int heads, int hd, int splits, const float* scratch, float* out, unsigned* xmax_bits,
                                         QuikRowSink sink) {
  pdl_launch_dependents();
  pdl_wait();
  const int r = blockIdx.x, h = blockIdx.y;
  const float* sp = scratch + (static_cast<int64_t>(r) * heads + h) * splits * (hd + 2);
  combine_splits([&](int s) { return sp + s * (hd + 2); }, splits, hd, out + (static_cast<int64_t>(r) * heads + h) * hd,
                 xmax_bits != nullptr ? xmax_bits + r : nullptr);
  __shared__ uint32_t map_smem[kSinkMapBytes / 4];
  if (sink.done != nullptr) quik_sink_part_done(sink, heads, r, out, r, 1, map_smem, true);
}

// xmax_bits != nullptr (width % 32 == 0: a warp's lanes in one row): max |out| of each row atomically into
// xmax_bits[row] (as abs_bits; zeroed earlier in the step), one atomic per warp.
__global__ void swiglu_kernel(const float* g, const float* u, int64_t ld, float* out, int64_t width, int64_t n, unsigned* xmax_bits) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float h = 0.0f;
  if (i < n) {
    const int64_t r = i / width, c = i % width;
    const float a = g[r * ld + c];
    h = silu_mul(a, u[r * ld + c]);
    out[i] = h;
  }
  if (xmax_bits != nullptr) {
    const int64_t first = i - threadIdx.x % 32;   // the warp's first element: its row is every lane's
    if (first < n) warp_atomic_absmax(xmax_bits + first / width, h);
  }
}

__global__ void bias_kernel(float* y, const float* b, int rows, int n) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < static_cast<int64_t>(rows) * n) y[i] += b[i % n];
}

// One block per row: max (with the lowest index), then sum of exp.
__global__ void nll_kernel(const float* logits, const int32_t* target, int vocab, float* nll, int* hit) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* lg = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float mx = -FLT_MAX;
  int arg = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (lg[i] > mx) {
      mx = lg[i];
      arg = i;
    }
  for (int off = 16; off > 0; off >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, mx, off);
    const int oi = __shfl_xor_sync(0xffffffffu, arg, off);
    if (om > mx || (om == mx && oi < arg)) {
      mx = om;
      arg = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  if (lane == 0) {
    sv[warp] = mx;
    si[warp] = arg;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < nw; ++w)
      if (sv[w] > sv[0] || (sv[w] == sv[0] && si[w] < si[0])) {
        sv[0] = sv[w];
        si[0] = si[w];
      }
  }
  __syncthreads();
  const float M = sv[0];
  const int A = si[0];
  __syncthreads();
  float s = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += __expf(lg[i] - M);
  s = warp_sum(s);
  if (lane == 0) sv[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (int w = 0; w < nw; ++w) t += sv[w];
    if (nll != nullptr) {
      const int tg = target[blockIdx.x];
      nll[blockIdx.x] = logf(t) + M - lg[tg];
      if (hit != nullptr) hit[blockIdx.x] = A == tg;
    } else {
      hit[blockIdx.x] = A;   // argmax mode
    }
  }
}

__global__ void increment_kernel(int32_t* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

}  // namespace

void embed_rows(const __half* emb, const int32_t* tokens, int rows, int dim, float* x, cudaStream_t s) {
  launch_pdl(kPdlOps, embed_kernel, rows, 256, 0, s, emb, tokens, dim, x);
}
bool rmsnorm_writes_xmax(int dim) { return dim % 4 == 0 && dim / 4 <= 1024 * kNormVec; }

void rmsnorm(float* x, const float* delta, const float* w, float* y, __half* yh, int rows, int dim, float eps,
             cudaStream_t s, float* xmax, float* zero) {
  const int n4 = dim / 4;
  if (dim % 4 == 0 && n4 <= 1024 * kNormVec) {
    // As many threads as give every thread one float4 (at most 1024; wider rows take up to kNormVec each).
    const int t = std::min(1024, std::max(32, (n4 + 31) / 32 * 32));
    launch_pdl(kPdlOps, rmsnorm_kernel, rows, t, 0, s, x, delta, w, y, yh, dim, eps, xmax, zero);
  } else {
    LOWBIT_CHECK(xmax == nullptr && zero == nullptr, "rmsnorm: row maxima need a width the float4 kernel serves (", dim, ")");
    launch_pdl(kPdlOps, rmsnorm_any_kernel, rows, 256, 0, s, x, delta, w, y, yh, dim, eps);
  }
}
void rope_kv_store(const float* q, int64_t q_ld, const float* k, const float* v, int64_t kv_ld, float* q_out,
                   const int32_t* seq, const int32_t* pos, int rows, int heads, int kv_heads, int hd, const float* cos_t,
                   const float* sin_t, int layer, const KvMap& map, __half* kc, __half* vc, cudaStream_t s) {
  const int work = std::max({heads * hd / 2, kv_heads * hd});   // the widest of the three loops
  const unsigned slices = static_cast<unsigned>(std::min(16, (work + 255) / 256));
  launch_pdl(kPdlOps, rope_kv_store_kernel, dim3(rows, slices), 256, 0, s, q, q_ld, k, v, kv_ld, q_out, seq, pos, heads, kv_heads, hd,
                                                          cos_t, sin_t, layer, map, kc, vc);
}
namespace {
bool& fold_rope_state() {   // from the environment on first use
  static bool on = knob_bool(Knob::FoldRope);
  return on;
}
}  // namespace
static bool& cluster_combine_state() {   // from the environment on first use
  static bool on = knob_bool(Knob::ClusterCombine);
  return on;
}
bool fold_rope_enabled() { return fold_rope_state(); }
bool cluster_combine_enabled() { return cluster_combine_state(); }
void set_cluster_combine(bool on) { cluster_combine_state() = on; }
bool attention_combines_in_cluster(int splits) {
  return cluster_combine_enabled() && splits > 1 && splits <= kMaxClusterSplits && sm90_or_newer();
}
void set_fold_rope(bool on) { fold_rope_state() = on; }
bool attention_folds_rope(int rows, int hd, bool single_token) {
  return fold_rope_enabled() && single_token && rows <= 8 && (hd == 64 || hd == 128);
}
void attention(const float* q, const int32_t* seq, const int32_t* pos, int rows, int heads, int kv_heads, int hd,
               int layer, const KvMap& map, int window, const __half* kc, const __half* vc, float* out,
               int splits, float* scratch, bool single_token, cudaStream_t s, unsigned* xmax_bits, const RopeIn* rope,
               const QuikRowSink* sink) {
  LOWBIT_CHECK(hd <= kMaxHd && hd % 2 == 0, "CUDA attention: head_dim ", hd, " unsupported (even, <= ", kMaxHd, ")");
  LOWBIT_CHECK(sink == nullptr || (sink->w.k == static_cast<int64_t>(heads) * hd && sink->groups >= rows),
               "CUDA attention: a sink for ", sink != nullptr ? sink->w.k : 0, " columns and ",
               sink != nullptr ? sink->groups : 0, " rows takes ", rows, " rows of ", heads, " x ", hd);
  const QuikRowSink sk = sink != nullptr ? *sink : QuikRowSink{};
  const dim3 grid(rows, heads, splits);
  const bool decode = rows <= 8;   // one row per sequence: a grid too small to hide memory latency by occupancy
  const bool paged = map.table != nullptr;
  LOWBIT_CHECK(!paged || map.block >= kMinPagedBlock, "CUDA attention: paged KV blocks of ", map.block,
               " positions (at least ", kMinPagedBlock, ")");
  auto pick = [decode, paged](auto hd_const) {
    constexpr int HD = decltype(hd_const)::value;
    return decode ? (paged ? attention_kernel<HD, true, true> : attention_kernel<HD, true, false>)
                  : (paged ? attention_kernel<HD, false, true> : attention_kernel<HD, false, false>);
  };
  const auto kern = hd == 64    ? pick(std::integral_constant<int, 64>{})
                    : hd == 128 ? pick(std::integral_constant<int, 128>{})
                    : hd == 256 ? pick(std::integral_constant<int, 256>{})
                                : pick(std::integral_constant<int, 0>{});
  LOWBIT_CHECK(rope == nullptr || attention_folds_rope(rows, hd, single_token), "attention: RoPE folds into decode attention only");
  const bool cluster = attention_combines_in_cluster(splits);
  launch_pdl(kPdlOps, kern, grid, kAttnWarps * 32, 0, s, dim3(1, 1, cluster ? splits : 1), q, seq, pos, heads, kv_heads, hd,
             layer, map, window, kc, vc, out, splits, scratch, single_token ? 1 : 0, xmax_bits,
             rope != nullptr ? *rope : RopeIn{}, cluster ? 1 : 0, sk);
  if (splits > 1 && !cluster)
    launch_pdl(kPdlOps, attention_combine_kernel, dim3(rows, heads), 128, 0, s, heads, hd, splits, scratch, out, xmax_bits, sk);
}
void swiglu_rows(const float* g, const float* u, int64_t ld, float* out, int rows, int64_t width, cudaStream_t s,
                 unsigned* xmax_bits) {
  LOWBIT_CHECK(xmax_bits == nullptr || width % 32 == 0, "swiglu: row maxima need a width that is a multiple of 32 (", width, ")");
  const int64_t n = rows * width;
  launch_pdl(kPdlOps, swiglu_kernel, blocks_for(n, 256), 256, 0, s, g, u, ld, out, width, n, xmax_bits);
}
void add_bias_rows(float* y, const float* bias, int rows, int n, cudaStream_t s) {
  launch_pdl(kPdlOps, bias_kernel, blocks_for(static_cast<int64_t>(rows) * n, 256), 256, 0, s, y, bias, rows, n);
}
void nll_rows(const float* logits, const int32_t* target, int rows, int vocab, float* nll, int* hit, cudaStream_t s) {
  if (rows > 0) launch_pdl(kPdlOps, nll_kernel, rows, 512, 0, s, logits, target, vocab, nll, hit);
}
// Split argmax: block (slice, row) reduces its slice of the row with the comparisons of nll_kernel (NaN never wins,
// ties to the lower index) into one 64-bit key, the value's order-preserving bits above the complement of its
// index, so that the larger key is the larger value and, among equal values, the lower index; one warp per row then
// takes the largest of the kArgmaxSlices keys. One 512-thread block per row read a 128K vocabulary (Llama-3) in ~0.1 ms
// of the decode step, latency-bound on one SM.
__device__ __forceinline__ uint64_t argmax_key(float v, int i) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

__global__ void argmax_slices_kernel(const float* logits, int vocab, uint64_t* keys) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ uint64_t sk[32];
  const int len = (vocab + kArgmaxSlices - 1) / kArgmaxSlices, lo = static_cast<int>(blockIdx.x) * len;
  const int hi = min(vocab, lo + len);
  const float* lg = logits + static_cast<int64_t>(blockIdx.y) * vocab;
  float mx = -FLT_MAX;
  int arg = 0;
  for (int i = lo + static_cast<int>(threadIdx.x); i < hi; i += static_cast<int>(blockDim.x)) {
    const float v = lg[i];
    if (v > mx) {
      mx = v;
      arg = i;
    }
  }
  uint64_t k = argmax_key(mx, arg);
  for (int off = 16; off > 0; off >>= 1) {
    const uint64_t o = __shfl_xor_sync(0xffffffffu, k, off);
    k = o > k ? o : k;
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) sk[warp] = k;
  __syncthreads();
  if (warp == 0) {
    k = lane < static_cast<int>(blockDim.x) / 32 ? sk[lane] : 0;
    for (int off = 16; off > 0; off >>= 1) {
      const uint64_t o = __shfl_xor_sync(0xffffffffu, k, off);
      k = o > k ? o : k;
    }
    if (lane == 0) keys[static_cast<int64_t>(blockIdx.y) * kArgmaxSlices + blockIdx.x] = k;
  }
}

__global__ void argmax_combine_kernel(const uint64_t* keys, int rows, int32_t* out) {
  pdl_launch_dependents();
  pdl_wait();
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  static_assert(kArgmaxSlices == 32, "one key per lane");
  uint64_t k = keys[static_cast<int64_t>(row) * kArgmaxSlices + lane];
  for (int off = 16; off > 0; off >>= 1) {
    const uint64_t o = __shfl_xor_sync(0xffffffffu, k, off);
    k = o > k ? o : k;
  }
  // A row whose every value is -FLT_MAX, -inf or NaN keeps nll_kernel's answer, 0: every slice's key then holds 0.
  if (lane == 0) out[row] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k));
}

void argmax_rows(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s, uint64_t* scratch) {
  if (rows <= 0) return;
  if (scratch != nullptr && vocab >= kArgmaxSplitVocab) {
    launch_pdl(kPdlOps, argmax_slices_kernel, dim3(kArgmaxSlices, static_cast<unsigned>(rows)), 256, 0, s, logits, vocab, scratch);
    launch_pdl(kPdlOps, argmax_combine_kernel, static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0, s,
               static_cast<const uint64_t*>(scratch), rows, out);
    return;
  }
  // nll_kernel in argmax mode: with nll == nullptr it writes the argmax into hit and never reads target.
  launch_pdl(kPdlOps, nll_kernel, rows, 512, 0, s, logits, nullptr, vocab, nullptr, out);
}
void increment(int32_t* pos, int count, cudaStream_t s) { increment_kernel<<<blocks_for(count, 128), 128, 0, s>>>(pos, count); }

}  // namespace lowbit::cuda
