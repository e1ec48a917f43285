// The fused any-precision GEMM on Hopper's warpgroup MMA (wgmma): y [m, n] = x [m, k] · W_bᵀ with the b-bit weights
// (2..4 bits) decoded from their bitplanes into registers and fed to wgmma as its A operand, the activations read by
// the tensor cores straight from shared memory. No fp16 copy of W is written or read. Auto's kernel for batch 65..128
// in session 15; since session 17 the warp-specialized kernel (anyprec_wgmma_ws.cu) is, and this one is kept as
// GemmKernel::Wgmma (benchmarked and tested beside it; docs/perf-history.md, sessions 15 and 17).
//
// Against the staged mma.sync GEMM (anyprec_gemm.cu): one A fragment per warp and k16 step feeds one m64nNk16 wgmma
// (N tokens) instead of N / 8 mma.sync, and B needs no ldmatrix.
//
// A CTA is two warpgroups computing 128 weight rows x N tokens (N = 64 or 128) over a range of word quads (split-k
// over the grid's z as in the staged kernel). Warpgroup wg owns rows 64 wg .. 64 wg + 63, its warp w the rows
// 16 w .. 16 w + 15 of those, lane (g, t) the register tables of rows g and g + 8 (anyprec_codes.cuh); the A fragment
// register_lookup builds is the mma.sync m16n8k16 one, which is also wgmma's register-A layout for the warp's 16 rows.
//
// A kStages-deep cp.async ring holds per quad the CTA rows' plane words ([plane][row][4 words]) and the N tokens'
// activations, permuted into the fragments' k order and rounded to fp16 (anyprec_permute_x), in wgmma's K-major
// 128-byte-swizzled layout: per k half of 64 columns, 1 KB atoms of 8 tokens x 128 bytes, 16-byte chunk c of token row
// r stored in slot c ^ r (x_offset_of). The k16 step of slab sj reads chunks 2 sj and 2 sj + 1. (The unswizzled
// layout, 8-token core matrices at strides of 128 bytes and 2 KB, took 971 against 607 us at 28672x8192, 512 tokens.)
// Each k16 step is one commit group: the warpgroup builds the step's A fragment, issues its wgmma and waits for all
// but that one. The copies run kStages - 2 quads ahead: a stage is refilled two quads after it was computed, when
// every warpgroup has retired all its wgmmas that read it.
//
// Measured on the H200 (docs/perf-history.md, session 15): 1.12-1.80x faster than dequantize + cuBLAS at batch 128, slower
// at 512 tokens; ncu at 512 tokens: tensor pipe 43% busy, 2 warps per scheduler, issue 33% (latency-bound). Tried:
// eight wgmmas per commit group with the next quad's lookups overlapping them (wrong results: ptxas does not track
// the asynchronous A-register reads across the loop's back edge; pinning the registers made it serialize every
// wgmma), and warpgroup 1 running one quad behind warpgroup 0 (slower).
#include <algorithm>

#include "cuda/anyprec_codes.cuh"
#include "cuda/anyprec_gemm_internal.h"
#include "cuda/stream.cuh"
#include "cuda/wgmma.cuh"

namespace lowbit::cuda {
namespace {

constexpr int kWgs = 2;                  // warpgroups per CTA
constexpr int kThreads = 128 * kWgs;
constexpr int kRows = 64 * kWgs;         // one m64 tile per warpgroup

// Byte offset in a stage's activations of 16-byte chunk c (columns 8c .. 8c + 7 of the quad) of token 8 tg + r:
// k half c / 8 (N / 8 atoms each), atom tg, row r, chunk slot (c % 8) ^ r (the 128-byte swizzle wgmma undoes).
template <int N>
__host__ __device__ constexpr uint32_t x_offset_of(int tg, int r, int c) {
  return static_cast<uint32_t>((c / 8) * (N / 8) * kAtomBytes + tg * kAtomBytes + r * 128 + (((c % 8) ^ r) * 16));
}

template <int B, int N, int kStages>
struct WgTile {
  static constexpr int kXBytes = N * kQuadCols * 2;   // first, so every stage's x starts 128-byte aligned
  static constexpr int kWBytes = B * kRows * 16;
  static constexpr int kStageBytes = kXBytes + kWBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kStageBytes % kAtomBytes == 0, "stages keep the activations' swizzle atoms 1 KB aligned");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The k16 step of slab sj (chunks 2 sj, 2 sj + 1): k half sj / 4, 32 bytes per step into its 128-byte token rows.
template <int N>
__device__ __forceinline__ uint64_t x_desc(uint32_t stage, int sj) {
  return smem_desc_sw128(stage + static_cast<uint32_t>((sj / 4) * (N / 8) * kAtomBytes + (sj % 4) * 32));
}
#endif

// out: y [m, n] (one split) or the partials [splits, m, n].
template <int B, int N, int kStages>
__global__ void __launch_bounds__(kThreads, 1) anyprec_wgmma_kernel(AnyPrecDevice w, const __half* __restrict__ xp,
                                                                   int64_t m, int64_t quads, int64_t split_quads,
                                                                   float* __restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = WgTile<B, N, kStages>;
  static_assert(kStages >= 3, "the ring refills a stage two quads after its compute");
  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  const int tid = static_cast<int>(threadIdx.x), wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t n = w.n, W = w.words;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x) * N;
  const int64_t rowc = static_cast<int64_t>(blockIdx.y) * kRows;
  const int64_t q0 = static_cast<int64_t>(blockIdx.z) * split_quads;
  const int nq = static_cast<int>(min_i64(quads, q0 + split_quads) - q0);
  constexpr int E = 1 << B;
  const int lrow = 64 * wg + 16 * warp + g;   // the lane's first row in the CTA (the second: + 8)

  RegTable<B> tab[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) load_register_table<B>(w.lut[B] + min_i64(rowc + lrow + 8 * hf, n - 1) * E, tab[hf]);

  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(wgmma_smem));
  if (smem0 % kAtomBytes != 0) __trap();   // the swizzle atoms must be 1 KB aligned (no static shared memory here)
  auto x_offset = [](int tg, int r, int c) { return x_offset_of<N>(tg, r, c); };
  const bool vec_w = W % 4 == 0;
  const int64_t xrow = quads * kQuadCols, plane_stride = n * W;
  auto issue = [&](int i) {   // quad q0 + i into stage i % kStages
    if (i < nq) {
      const int64_t Q = q0 + i;
      const uint32_t st = smem0 + static_cast<uint32_t>((i % kStages) * T::kStageBytes);
#pragma unroll
      for (int r = 0; r < N * 16 / kThreads; ++r) {   // chunk (token tg * 8 + tok8, c) of the quad's activations
        const int idx = tid + kThreads * r, tok8 = idx % 8, c = (idx / 8) % 16, tg = idx / 128;
        const int64_t tok = tok0 + 8 * tg + tok8;
        const bool ok = tok < m;
        cp_async(st + x_offset(tg, tok8, c), xp + (ok ? tok : 0) * xrow + Q * kQuadCols + 8 * c, 16, ok);
      }
#pragma unroll
      for (int idx = tid; idx < B * kRows; idx += kThreads) {   // plane idx / kRows of row idx % kRows
        const int j = idx / kRows, row = idx % kRows;
        const uint32_t* src = w.plane_data + j * plane_stride + min_i64(rowc + row, n - 1) * W + 4 * Q;
        cp_async_quad_words(st + static_cast<uint32_t>(T::kXBytes + 16 * idx), src, Q, W, vec_w, w.plane_data);
      }
    }
    cp_async_commit();
  };

  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  constexpr int kAhead = kStages - 2;
#pragma unroll
  for (int i = 0; i < kAhead; ++i) issue(i);
  for (int i = 0; i < nq; ++i) {
    cp_async_wait<kAhead - 1>();   // this thread's copies of quad i landed
    fence_proxy_async();
    __syncthreads();               // everyone's did; every wgmma reading quad i - 2's stage has retired
    issue(i + kAhead);
    const uint32_t st = smem0 + static_cast<uint32_t>((i % kStages) * T::kStageBytes);
    uint32_t wv[2][B];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int j = 0; j < B; ++j) wv[hf][j] = lds_u32(st + static_cast<uint32_t>(T::kXBytes + (j * kRows + lrow + 8 * hf) * 16 + 4 * t));
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t sel[2], msel[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) register_selectors<B>(wv[hf], s, sel[hf], msel[hf]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4];
        register_lookup<B>(tab[0], h ? sel[0] >> 16 : sel[0], h ? msel[0] >> 16 : msel[0], a[0], a[2]);
        register_lookup<B>(tab[1], h ? sel[1] >> 16 : sel[1], h ? msel[1] >> 16 : msel[1], a[1], a[3]);
        wgmma_fence();
        wgmma_rs<N>(acc, a, x_desc<N>(st, 2 * s + h));
        wgmma_commit();
        wgmma_wait<1>();   // the previous step's wgmma retired: its A registers (and, at a quad's start, the
                           // quad before's stage) are free; ptxas keeps the in-flight step's registers apart
      }
    }
  }
  wgmma_wait<0>();
  cp_async_wait<0>();   // no copy may still target shared memory when the CTA exits

  // Accumulator i of the m64nN tile: n tile i / 4, row g + 8 ((i / 2) % 2), token 8 (i / 4) + 2 t + i % 2.
  float* o = out + static_cast<int64_t>(blockIdx.z) * m * n;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int64_t row = rowc + lrow + 8 * ((i / 2) % 2);
    const int64_t tok = tok0 + 8 * (i / 4) + 2 * t + i % 2;
    if (row < n && tok < m) o[tok * n + row] = acc[i];
  }
#else
  (void)w, (void)xp, (void)m, (void)quads, (void)split_quads, (void)out;
  __trap();   // built for sm_90a only; anyprec_wgmma_available() keeps other GPUs away
#endif
}

template <int B, int N, int kStages>
void launch_wgmma(const AnyPrecDevice& w, const __half* xp, int64_t m, int64_t quads, float* y, GemmContext& ctx) {
  using T = WgTile<B, N, kStages>;
  auto kern = anyprec_wgmma_kernel<B, N, kStages>;
  const int per_sm = stream_blocks_per_sm(kern, kThreads, T::kSmemBytes);   // sets the shared-memory limit too
  const int64_t tb = (m + N - 1) / N, rb = (w.n + kRows - 1) / kRows;
  const int64_t split_quads = split_quads_for(tb * rb, per_sm, quads);
  const int64_t splits = (quads + split_quads - 1) / split_quads;
  float* out = y;
  if (splits > 1) out = reinterpret_cast<float*>(ctx.weight_scratch(static_cast<size_t>(2 * splits * m * w.n)));
  LOWBIT_CHECK(tb < (1LL << 31) && rb <= 65535, "anyprec wgmma GEMM: ", m, " tokens or ", w.n, " rows exceed one launch's grid");
  const dim3 grid(static_cast<unsigned>(tb), static_cast<unsigned>(rb), static_cast<unsigned>(splits));
  kern<<<grid, kThreads, T::kSmemBytes, ctx.stream()>>>(w, xp, m, quads, split_quads, out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) sum_splits(out, static_cast<int>(splits), m * w.n, y, ctx.stream());
}

template <int B>
void wgmma_bits(const AnyPrecDevice& w, const __half* xp, int64_t m, int64_t quads, float* y, GemmContext& ctx) {
  // Ring depth: 6 stages of 64 tokens, 5 of 128 (each under the 227 KB of one CTA per SM).
  if (m <= 64) launch_wgmma<B, 64, 6>(w, xp, m, quads, y, ctx);
  else launch_wgmma<B, 128, 5>(w, xp, m, quads, y, ctx);
}

}  // namespace

bool anyprec_wgmma_available() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;   // sm_90a code runs on compute capability 9.0 only
  }();
  return ok;
}

void anyprec_wgmma_gemm(const AnyPrecDevice& w, int bits, const __half* xp, int64_t m, int64_t quads, float* y,
                        GemmContext& ctx) {
  LOWBIT_CHECK(anyprec_wgmma_available(), "anyprec wgmma GEMM: needs a compute capability 9.0 GPU (H100 / H200)");
  if (!dispatch_int<2, 3, 4>(bits, [&](auto b) { wgmma_bits<decltype(b)::value>(w, xp, m, quads, y, ctx); }))
    fail("anyprec wgmma GEMM: widths 2..4 (asked: ", bits, ")");
}

}  // namespace lowbit::cuda
