// Prefill attention on tensor cores (the flash-attention form): each block takes 64 consecutive query rows of one
// sequence and one head, and walks the keys in tiles of 64 held in shared memory (cp.async, two stages), with the
// scores and the weighted values as mma.sync m16n8k16 products and the softmax kept online in registers. The decode
// kernel (gpu_ops.cu) scores one query row per block on CUDA cores, which at a 2048-token prompt made attention most
// of the Llama-2-7B prefill.
//
// Arithmetic, against the CUDA-core kernel's fp32 q x fp16 keys and values: q and the weights P are each split into
// fp16 hi + lo (mma.cuh's split_pair: two mma per fragment, ~22 bits), so scores and outputs keep fp32-class accuracy
// (a 2e-3 relative error in a score of 30 would move its weight by 6%), accumulated in fp32. With P rounded to fp16
// alone, SmolLM2 QUIK W4A8's perplexity on the first 8 WikiText-2 windows moved by 0.1% against the CPU path (the
// activation codes amplify any upstream rounding): the extra P V products cost less than that is worth.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backend_cuda/common/common.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/common/mma.cuh"
#include "backend_cuda/common/stream.cuh"
#include "backend_cuda/ops/gpu_ops.h"
#include "backend_cuda/ops/kv_row.cuh"
#include "backend_cuda/quik/quik_row_sink.cuh"
#include "core/knobs.h"

namespace lowbit::cuda {
namespace {

constexpr int kRowsPerBlock = 64;   // 4 warps x 16 query rows
constexpr int kKeysPerTile = 64;
constexpr int kThreads = 128;
constexpr int kMinTokens = 16;   // below this a prompt's rows are few enough for the per-row kernel
constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory row stride in halves: 16 bytes of padding put the 8 rows one ldmatrix reads on distinct banks.
template <int HD>
constexpr int kLd = HD + 8;
template <int HD>
constexpr int kStageHalves = 2 * kKeysPerTile * kLd<HD>;   // K then V
// Two stages of K and V, then the low halves of the block's q rows ([64][kLd], read back as A fragments: in registers
// beside the high halves they took the kernel past 255 registers at hd 128).
template <int HD>
constexpr size_t kSmemBytes = (2 * kStageHalves<HD> + kRowsPerBlock * kLd<HD>) * sizeof(__half);

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// The first key a query at position p attends to.
__device__ __forceinline__ int first_key(int p, int window) { return window > 0 ? max(0, p - window + 1) : 0; }

// grid (query tiles, heads, sequences), or (heads, query tiles, sequences) with a sink: block (tile x, head h, b) takes
// rows b * n + t0 .. (t0 = 64 x, heaviest tiles first), the rows of sequence seq[b * n] at consecutive positions
// pos[b * n] + i (the forward's layout, gpu_model.cu). Warp w owns rows 16 w .. 16 w + 15 of the tile; lane 4 g + t
// holds rows g and g + 8 of them (mma.cuh's fragment layout).
template <int HD>
__global__ void __launch_bounds__(kThreads, 2) prefill_attention_kernel(
    const float* __restrict__ q, const int32_t* __restrict__ seq, const int32_t* __restrict__ pos, int n, int heads,
    int kv_heads, int layer, KvMap map, int window, const __half* __restrict__ kc, const __half* __restrict__ vc,
    float* __restrict__ out, QuikRowSink sink) {
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ __align__(16) __half smem[];
  constexpr int LD = kLd<HD>;
  constexpr int KK = HD / 16;   // k-steps of the score product
  constexpr int DT = HD / 8;    // n8 tiles of the output
  constexpr int ST = kKeysPerTile / 8;   // n8 tiles of the scores
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool by_head = sink.done != nullptr;
  const int tiles_n = static_cast<int>(by_head ? gridDim.y : gridDim.x);
  const int tile = tiles_n - 1 - static_cast<int>(by_head ? blockIdx.y : blockIdx.x);
  const int h = static_cast<int>(by_head ? blockIdx.x : blockIdx.y), b = blockIdx.z;
  const int t0 = tile * kRowsPerBlock, cnt = min(kRowsPerBlock, n - t0);
  const int64_t row0 = static_cast<int64_t>(b) * n + t0;
  const int p_lo = pos[row0], p_hi = pos[row0 + cnt - 1];
  const int k_begin = first_key(p_lo, window), k_end = p_hi + 1;
  const int tiles = (k_end - k_begin + kKeysPerTile - 1) / kKeysPerTile;
  const int sq = seq[row0];
  const int kvd = kv_heads * HD, kvh = h / (heads / kv_heads);

  // The warp's two rows per lane: their positions (-1: past the tile's rows, no key valid) and q as hi + lo fragments,
  // pre-scaled by log2(e) / sqrt(hd) so that the softmax runs on exp2.
  const int ra = warp * 16 + g, rb = ra + 8;
  const int pa = ra < cnt ? pos[row0 + ra] : -1, pb = rb < cnt ? pos[row0 + rb] : -1;
  const int fa = first_key(pa, window), fb = first_key(pb, window);
  const float qscale = rsqrtf(static_cast<float>(HD)) * kLog2e;
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  __half* qlo_s = smem + 2 * kStageHalves<HD>;
  uint32_t qhi[KK][4];
  {
    const float* qa = q + ((row0 + ra) * heads + h) * HD;
    const float* qb = q + ((row0 + rb) * heads + h) * HD;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {   // k 2t, 2t+1 then 2t+8, 2t+9
        const int d = 16 * kk + 2 * t + 8 * half;
        const float2 va = pa >= 0 ? *reinterpret_cast<const float2*>(qa + d) : make_float2(0.0f, 0.0f);
        const float2 vb = pb >= 0 ? *reinterpret_cast<const float2*>(qb + d) : make_float2(0.0f, 0.0f);
        uint32_t la_, lb_;
        split_pair(va.x * qscale, va.y * qscale, qhi[kk][2 * half], la_);
        split_pair(vb.x * qscale, vb.y * qscale, qhi[kk][2 * half + 1], lb_);
        *reinterpret_cast<uint32_t*>(qlo_s + ra * LD + d) = la_;
        *reinterpret_cast<uint32_t*>(qlo_s + rb * LD + d) = lb_;
      }
    }
  }
  __syncwarp();   // each warp reads back only its own rows
  // The A fragment of k-step kk from the low halves: ldmatrix.x4 of rows (lane & 7) + 8 ((lane >> 3) & 1), columns
  // 16 kk + 8 (lane >> 4).
  const uint32_t qlo_at = sbase + static_cast<uint32_t>(
      ((2 * kStageHalves<HD>) + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4)) * sizeof(__half));

  // Tile j's keys and values into stage j & 1: 16-byte chunks, keys past k_end zero-filled (their weights are 0).
  const __half* kbase = kc + static_cast<int64_t>(kvh) * HD;
  const __half* vbase = vc + static_cast<int64_t>(kvh) * HD;
  auto load_tile = [&](int j) {
    const uint32_t st = sbase + static_cast<uint32_t>((j & 1) * kStageHalves<HD> * sizeof(__half));
    constexpr int kChunks = kKeysPerTile * HD / 8;
#pragma unroll
    for (int c = threadIdx.x; c < kChunks; c += kThreads) {
      const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
      const int key = k_begin + j * kKeysPerTile + r;
      const bool ok = key < k_end;
      const int64_t at = (ok ? kv_row(map, sq, layer, key) : 0) * kvd + col;
      const uint32_t dst = st + static_cast<uint32_t>((r * LD + col) * sizeof(__half));
      cp_async(dst, kbase + at, 16, ok);
      cp_async(dst + static_cast<uint32_t>(kKeysPerTile * LD * sizeof(__half)), vbase + at, 16, ok);
    }
    cp_async_commit();
  };

  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;   // running max (log2 units) and this lane's sums

  if (tiles > 0) load_tile(0);
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();   // tile j landed for every thread; every warp is done with stage (j + 1) & 1
    if (j + 1 < tiles) load_tile(j + 1);
    const uint32_t ks = sbase + static_cast<uint32_t>((j & 1) * kStageHalves<HD> * sizeof(__half));
    const uint32_t vs = ks + static_cast<uint32_t>(kKeysPerTile * LD * sizeof(__half));
    const int key0 = k_begin + j * kKeysPerTile;

    // S = q K^T: ldmatrix.x4 of keys 8 nt + (lane & 7), dimensions 16 kk + 8 (lane >> 3) gives b0 / b1 of k-steps
    // kk and kk + 1.
    float s[ST][4];
#pragma unroll
    for (int nt = 0; nt < ST; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KK; kk += 2) {
      uint32_t lo0[4], lo1[4];
      ldmatrix_x4(qlo_at + static_cast<uint32_t>(16 * kk * sizeof(__half)), lo0);
      ldmatrix_x4(qlo_at + static_cast<uint32_t>(16 * (kk + 1) * sizeof(__half)), lo1);
#pragma unroll
      for (int nt = 0; nt < ST; ++nt) {
        uint32_t bf[4];
        ldmatrix_x4(ks + static_cast<uint32_t>(((8 * nt + (lane & 7)) * LD + 16 * kk + 8 * (lane >> 3)) * sizeof(__half)), bf);
        mma_16816(s[nt], qhi[kk], bf[0], bf[1]);
        mma_16816(s[nt], lo0, bf[0], bf[1]);
        mma_16816(s[nt], qhi[kk + 1], bf[2], bf[3]);
        mma_16816(s[nt], lo1, bf[2], bf[3]);
      }
    }
    // Causal / window mask, only on tiles that reach past some row's range.
    const bool edge = key0 + kKeysPerTile - 1 > p_lo || key0 < first_key(p_hi, window) || pa < 0 || pb < 0;
    if (edge) {
#pragma unroll
      for (int nt = 0; nt < ST; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * nt + 2 * t + e;
          if (key > pa || key < fa) s[nt][e] = -INFINITY;
          if (key > pb || key < fb) s[nt][2 + e] = -INFINITY;
        }
      }
    }
    // Online softmax: the rows' maxima over the quad of lanes that share them.
    float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < ST; ++nt) {
      xa = fmaxf(xa, fmaxf(s[nt][0], s[nt][1]));
      xb = fmaxf(xb, fmaxf(s[nt][2], s[nt][3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, off));
      xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, off));
    }
    const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
    const float ba = na == -INFINITY ? 0.0f : na, bb = nb == -INFINITY ? 0.0f : nb;   // rows with no key yet
    const float ca = exp2f(ma - ba), cb = exp2f(mb - bb);
    ma = na;
    mb = nb;
    la *= ca;
    lb *= cb;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      o[i][0] *= ca;
      o[i][1] *= ca;
      o[i][2] *= cb;
      o[i][3] *= cb;
    }
    // O += P V: the score fragments of n8 tiles 2 ks, 2 ks + 1 are the A fragment of key step ks; ldmatrix.x4.trans of
    // keys 16 ks + 8 (i & 1) + (lane & 7), dimensions 8 (dt + (i >> 1)) (i = lane >> 3) gives b0 / b1 of n8 tiles dt,
    // dt + 1.
#pragma unroll
    for (int kstep = 0; kstep < kKeysPerTile / 16; ++kstep) {
      uint32_t a[4];
      float pr[2][4];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const float* sv = s[2 * kstep + u];
        pr[u][0] = exp2f(sv[0] - ba);
        pr[u][1] = exp2f(sv[1] - ba);
        pr[u][2] = exp2f(sv[2] - bb);
        pr[u][3] = exp2f(sv[3] - bb);
        la += pr[u][0] + pr[u][1];
        lb += pr[u][2] + pr[u][3];
      }
      uint32_t alo[4];
      split_pair(pr[0][0], pr[0][1], a[0], alo[0]);
      split_pair(pr[0][2], pr[0][3], a[1], alo[1]);
      split_pair(pr[1][0], pr[1][1], a[2], alo[2]);
      split_pair(pr[1][2], pr[1][3], a[3], alo[3]);
      const int i = lane >> 3;
      const int vrow = 16 * kstep + 8 * (i & 1) + (lane & 7);
#pragma unroll
      for (int dt = 0; dt < DT; dt += 2) {
        uint32_t bf[4];
        ldmatrix_x4_trans(vs + static_cast<uint32_t>((vrow * LD + 8 * (dt + (i >> 1))) * sizeof(__half)), bf);
        mma_16816(o[dt], a, bf[0], bf[1]);
        mma_16816(o[dt], alo, bf[0], bf[1]);
        mma_16816(o[dt + 1], a, bf[2], bf[3]);
        mma_16816(o[dt + 1], alo, bf[2], bf[3]);
      }
    }
  }

  // The sums over the quad, then out = O / l for the tile's rows.
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    la += __shfl_xor_sync(0xffffffffu, la, off);
    lb += __shfl_xor_sync(0xffffffffu, lb, off);
  }
  const float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
  float* oa = out + ((row0 + ra) * heads + h) * HD;
  float* ob = out + ((row0 + rb) * heads + h) * HD;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int d = 8 * dt + 2 * t;
    if (pa >= 0) *reinterpret_cast<float2*>(oa + d) = make_float2(o[dt][0] * ia, o[dt][1] * ia);
    if (pb >= 0) *reinterpret_cast<float2*>(ob + d) = make_float2(o[dt][2] * ib, o[dt][3] * ib);
  }
  // The tile's rows quantized for a QUIK o projection once all heads wrote them (the stages' shared memory is free).
  if (by_head)
    quik_sink_part_done(sink, heads, static_cast<int64_t>(b) * tiles_n + tile, out, row0, cnt, reinterpret_cast<uint32_t*>(smem), cnt <= 2);
}

template <int HD>
void launch_prefill(const float* q, const int32_t* seq, const int32_t* pos, int seqs, int n, int heads, int kv_heads,
                    int layer, const KvMap& map, int window, const __half* kc, const __half* vc, float* out, cudaStream_t s,
                    const QuikRowSink& sink) {
  auto kern = prefill_attention_kernel<HD>;
  static_assert(kSmemBytes<HD> >= kSinkMapBytes);
  // On every call, not once per process: the attribute is per device (a host call of a few microseconds).
  LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes<HD>)));
  const unsigned tiles = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  const dim3 grid = sink.done != nullptr ? dim3(static_cast<unsigned>(heads), tiles, static_cast<unsigned>(seqs))
                                         : dim3(tiles, static_cast<unsigned>(heads), static_cast<unsigned>(seqs));
  launch_pdl(kPdlOps, kern, grid, kThreads, kSmemBytes<HD>, s, q, seq, pos, n, heads, kv_heads, layer, map, window, kc, vc, out,
             sink);
}

bool& tc_state() {   // from the environment on first use
  static bool on = knob_bool(Knob::TcAttention);
  return on;
}

}  // namespace

bool tc_attention_enabled() { return tc_state(); }
void set_tc_attention(bool on) { tc_state() = on; }

bool attention_on_tensor_cores(int n, int hd) {
  return tc_attention_enabled() && n >= kMinTokens && (hd == 64 || hd == 128);
}

void prefill_attention(const float* q, const int32_t* seq, const int32_t* pos, int seqs, int n, int heads, int kv_heads,
                       int hd, int layer, const KvMap& map, int window, const __half* kc, const __half* vc, float* out,
                       cudaStream_t s, const QuikRowSink* sink) {
  LOWBIT_CHECK(hd == 64 || hd == 128, "CUDA prefill attention: head_dim ", hd, " unsupported (64 or 128)");
  LOWBIT_CHECK(n >= 1 && seqs >= 1 && seqs <= 65535 && heads >= 1 && heads <= 65535 && kv_heads >= 1 && heads % kv_heads == 0,
               "CUDA prefill attention: ", seqs, " x ", n, " rows, ", heads, " heads over ", kv_heads, " KV heads");
  LOWBIT_CHECK(sink == nullptr || (sink->w.k == static_cast<int64_t>(heads) * hd &&
                                   sink->groups >= static_cast<int64_t>(seqs) * ((n + kRowsPerBlock - 1) / kRowsPerBlock)),
               "CUDA prefill attention: a sink for ", sink != nullptr ? sink->w.k : 0, " columns and ",
               sink != nullptr ? sink->groups : 0, " row groups takes ", seqs, " x ", n, " rows of ", heads, " x ", hd);
  (hd == 64 ? launch_prefill<64> : launch_prefill<128>)(q, seq, pos, seqs, n, heads, kv_heads, layer, map, window, kc, vc,
                                                       out, s, sink != nullptr ? *sink : QuikRowSink{});
}

}  // namespace lowbit::cuda
