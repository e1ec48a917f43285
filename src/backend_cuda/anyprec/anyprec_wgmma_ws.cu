// The warp-specialized fused any-precision GEMM on Hopper (GemmKernel::WgmmaWs): y [m, n] = x [m, k] · W_bᵀ for
// 2..4-bit weights decoded from their bitplanes, for prefill-sized batches (kernel_choice.h: 65..512 tokens). Built
// for sm_90a only.
//
// Why warp-specialized: a wgmma kernel that decodes each A fragment in the warpgroup that multiplies it (the decoded
// weights as wgmma's register A operand) makes the decode and the tensor cores take turns (ptxas keeps one wgmma step
// in flight with register operands), and its 128-token tiles decode every weight four times at 512 tokens (ncu,
// H200: tensor pipe 43% busy). That form is not kept: this kernel measured 1.1-1.8x faster at 256..512 tokens. Here
// the roles are split, as in CUTLASS's warp-specialized mainloops:
// - warpgroup 0 (the decoder) streams each row's plane words through a cp.async ring of its own, decodes them with
//   the register-table PRMT lookups (anyprec_codes.cuh) into fp16, and stores the CTA's 128 x 64 weight tile of each
//   k64 step into shared memory in wgmma's K-major 128-byte-swizzled layout; its thread 0 also issues the TMA load of
//   the step's N x 64 activation tile (x permuted into the fragments' k order and rounded to fp16: anyprec_permute_x);
// - warpgroups 1 and 2 (the consumers) only wait and issue wgmma with both operands in shared memory, 64 weight rows
//   x N tokens each, four m64nNk16 per k64 step, one commit group per step, one group left in flight.
// A kStages-deep ring of (activation tile, weight tile) stages is handed over by mbarriers: full[s] completes when the
// TMA bytes have landed and all 128 decoder threads have stored and fenced their rows (129 arrivals + tx bytes);
// empty[s] when both consumer warpgroups' wgmmas that read it have retired (2 arrivals).
// N = 256 tokens decodes each weight twice at 512 tokens (once per token tile) instead of four times.
//
// Thread r of the decoder owns CTA row r. Per word quad Q (128 columns, 4 plane words per row): slab sj = 2s + h of
// the quad (the k16 step whose codes are word bits 16h + 4q + s, the order anyprec_permute_x gives x) takes column
// 2t + e from word t's code 4e + s (+16h) and column 8 + 2t + e from code 4(2 + e) + s: register_lookup's two half2
// outputs for word t are exactly those pairs, so the slab's 16 columns are two 16-byte chunks
// [low(t=0..3)] and [high(t=0..3)]. Slabs 0..3 form the quad's first k64 step, 4..7 its second.
#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>

#include "backend_cuda/anyprec/anyprec_codes.cuh"
#include "backend_cuda/anyprec/anyprec_gemm_internal.h"
#include "backend_cuda/common/stream.cuh"
#include "backend_cuda/common/wgmma.cuh"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 384;      // decoder warpgroup + two consumer warpgroups
constexpr int kRows = 128;         // weight rows per CTA (64 per consumer warpgroup)
constexpr int kStepCols = 64;      // k columns per stage (one 128-byte swizzle row of fp16)
constexpr int kPlaneDepth = 4;     // quads of plane words in flight per decoder thread

template <int B, int N, int kStages>
struct WsTile {
  static constexpr int kXBytes = N * kStepCols * 2;          // activations of a stage: N token rows of 128 bytes
  static constexpr int kABytes = kRows * kStepCols * 2;      // decoded weights: 128 rows of 128 bytes
  static constexpr int kStageBytes = kXBytes + kABytes;
  static constexpr int kPlaneBytes = kPlaneDepth * B * kRows * 16;   // [depth][plane][row] 16-byte quads
  static constexpr int kBarOffset = kStages * kStageBytes + kPlaneBytes;
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8;
  static_assert(kXBytes % kAtomBytes == 0 && kStageBytes % kAtomBytes == 0, "tiles stay 1 KB aligned (the swizzle atom)");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
};

// CTA x computes tile tile0 + x (token block (tile0 + x) % tb, row block (tile0 + x) / tb: the token blocks of a row
// block run side by side and share its plane words through L2), over quads split_quads * y .. of its k.
// partial = false: y [m, n] directly (gridDim.y = 1); true: the compact partials [gridDim.y][gridDim.x][N tokens][128 rows]
// that sum_tile_splits adds.
template <int B, int N, int kStages>
__global__ void __launch_bounds__(kThreads, 1) anyprec_wgmma_ws_kernel(const __grid_constant__ CUtensorMap xmap, AnyPrecDevice w,
                                                                      int64_t m, int64_t quads, int64_t split_quads,
                                                                      int64_t tile0, int64_t tb, bool partial,
                                                                      float* __restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = WsTile<B, N, kStages>;
  extern __shared__ __align__(1024) unsigned char ws_smem[];
  const int tid = static_cast<int>(threadIdx.x), wg = tid / 128;
  const int64_t n = w.n;
  const int64_t tile = tile0 + blockIdx.x;
  const int64_t tok0 = (tile % tb) * N;
  const int64_t rowc = (tile / tb) * kRows;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * split_quads;
  const int nq = static_cast<int>(min_i64(quads, q0 + split_quads) - q0);
  const int steps = 2 * nq;

  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(ws_smem));
  if (smem0 % kAtomBytes != 0) __trap();   // the swizzle atoms must be 1 KB aligned (no static shared memory here)
  auto full_bar = [&](int s) { return smem0 + static_cast<uint32_t>(T::kBarOffset + 8 * s); };
  auto empty_bar = [&](int s) { return smem0 + static_cast<uint32_t>(T::kBarOffset + 8 * (kStages + s)); };
  auto stage_x = [&](int s) { return smem0 + static_cast<uint32_t>(s * T::kStageBytes); };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 129);
      mbar_init(empty_bar(s), 2);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- decoder: plane words -> fp16 weight tiles; thread 0 also loads the activation tiles ----
    constexpr int E = 1 << B;
    const int r = tid;
    const int64_t row = min_i64(rowc + r, n - 1);
    RegTable<B> tab;
    load_register_table<B>(w.lut[B] + row * E, tab);
    const int64_t W = w.words, plane_stride = n * W;
    const bool vec_w = W % 4 == 0;
    const uint32_t planes0 = smem0 + static_cast<uint32_t>(kStages * T::kStageBytes);
    auto plane_slot = [&](int d, int j) { return planes0 + static_cast<uint32_t>(((d * B + j) * kRows + r) * 16); };
    auto issue_planes = [&](int i) {   // quad q0 + i into ring slot i % kPlaneDepth (this thread's row only)
      if (i < nq) {
        const int64_t Q = q0 + i;
#pragma unroll
        for (int j = 0; j < B; ++j)
          cp_async_quad_words(plane_slot(i % kPlaneDepth, j), w.plane_data + j * plane_stride + row * W + 4 * Q, Q, W, vec_w,
                              w.plane_data);
      }
      cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < kPlaneDepth - 1; ++i) issue_planes(i);
    const uint32_t a_row = static_cast<uint32_t>((r / 8) * kAtomBytes + (r % 8) * 128);   // the row's 128 bytes (sw128_offset)
    for (int i = 0; i < nq; ++i) {
      issue_planes(i + kPlaneDepth - 1);
      cp_async_wait<kPlaneDepth - 1>();   // this thread's copies of quad i landed (it alone reads them)
      uint32_t wq[4][B];                  // [word t][plane j]
#pragma unroll
      for (int j = 0; j < B; ++j) {
        uint32_t v[4];
        lds_u32x4(plane_slot(i % kPlaneDepth, j), v);
#pragma unroll
        for (int t = 0; t < 4; ++t) wq[t][j] = v[t];
      }
#pragma unroll
      for (int sh = 0; sh < 2; ++sh) {
        const int it = 2 * i + sh, st = it % kStages;
        // (Decoding into registers before the stage wait, so that the decode overlaps the consumers' use of the stage,
        // measured no faster: 3-bit 8192x28672, 512 tokens, 423.6 against 394.7 us in the same run.)
        if (it >= kStages) mbar_wait(empty_bar(st), static_cast<uint32_t>((it / kStages - 1) & 1));
        const uint32_t sx = stage_x(st), sa = sx + T::kXBytes;
        if (tid == 0) {
          mbar_arrive_expect_tx(full_bar(st), T::kXBytes);
          tma_load_2d(sx, &xmap, static_cast<int>((q0 + i) * kQuadCols + kStepCols * sh), static_cast<int>(tok0), full_bar(st));
        }
        uint32_t lo[2][2][4], hi[2][2][4];   // [ss][h][word t]: columns 2t, 2t + 1 / 8 + 2t, 9 + 2t of slab 2s + h
#pragma unroll
        for (int ss = 0; ss < 2; ++ss) {
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            uint32_t sel, msel;
            register_selectors<B>(wq[t], 2 * sh + ss, sel, msel);
#pragma unroll
            for (int h = 0; h < 2; ++h)
              register_lookup<B>(tab, h ? sel >> 16 : sel, h ? msel >> 16 : msel, lo[ss][h][t], hi[ss][h][t]);
          }
        }
#pragma unroll
        for (int ss = 0; ss < 2; ++ss) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int c = 2 * (2 * ss + h);   // the slab's first chunk in the k64 step
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(sa + a_row + ((c ^ (r % 8)) << 4)), "r"(lo[ss][h][0]),
                         "r"(lo[ss][h][1]), "r"(lo[ss][h][2]), "r"(lo[ss][h][3])
                         : "memory");
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(sa + a_row + (((c + 1) ^ (r % 8)) << 4)), "r"(hi[ss][h][0]),
                         "r"(hi[ss][h][1]), "r"(hi[ss][h][2]), "r"(hi[ss][h][3])
                         : "memory");
          }
        }
        fence_proxy_async();   // the tile's st.shared visible to the consumers' wgmma (async proxy)
        mbar_arrive(full_bar(st));
      }
    }
    cp_async_wait<0>();   // no copy outlives the CTA
  } else {
    // ---- consumers: wgmma over the ring ----
    const int cw = wg - 1, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
    for (int it = 0; it < steps; ++it) {
      const int st = it % kStages;
      mbar_wait(full_bar(st), static_cast<uint32_t>((it / kStages) & 1));
      const uint32_t sx = stage_x(st), sa = sx + T::kXBytes + static_cast<uint32_t>(cw * 64 * 128);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_ss<N>(acc, smem_desc_sw128(sa + 32 * kk), smem_desc_sw128(sx + 32 * kk));
      wgmma_commit();
      wgmma_wait<1>();   // the step before has retired: its stage goes back to the decoder
      if (it > 0 && tid % 128 == 0) mbar_arrive(empty_bar((it - 1) % kStages));
    }
    wgmma_wait<0>();

    // Accumulator i of the m64nN tile: n tile i / 4, row g + 8 ((i / 2) % 2), token 8 (i / 4) + 2 t + i % 2.
    const int lrow = 64 * cw + 16 * warp + g;
    if (partial) {
      float* o = out + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * (N * kRows);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) o[(8 * (i / 4) + 2 * t + i % 2) * kRows + lrow + 8 * ((i / 2) % 2)] = acc[i];
    } else {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const int64_t rr = rowc + lrow + 8 * ((i / 2) % 2);
        const int64_t tok = tok0 + 8 * (i / 4) + 2 * t + i % 2;
        if (rr < n && tok < m) out[tok * n + rr] = acc[i];
      }
    }
  }
#else
  (void)xmap, (void)w, (void)m, (void)quads, (void)split_quads, (void)tile0, (void)tb, (void)partial, (void)out;
  __trap();   // built for sm_90a only; sm90a_available() keeps other GPUs away
#endif
}

// y's elements of the split tiles tile0 .. tile0 + tiles - 1: the sum of their `splits` compact partials, in split order.
template <int N>
__global__ void sum_tile_splits_kernel(const float* __restrict__ part, int splits, int64_t tiles, int64_t tile0, int64_t tb,
                                       int64_t m, int64_t n, float* __restrict__ y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, per_tile = static_cast<int64_t>(N) * kRows;
  if (i >= tiles * per_tile) return;
  const int64_t tile = tile0 + i / per_tile, tok = (tile % tb) * N + (i % per_tile) / kRows, row = (tile / tb) * kRows + i % kRows;
  if (tok >= m || row >= n) return;
  float v = part[i];
  for (int z = 1; z < splits; ++z) v += part[z * tiles * per_tile + i];
  y[tok * n + row] = v;
}

// The TMA descriptor of the permuted activations xp [m, quads * 128] fp16: boxes of N tokens x 64 columns, 128-byte
// swizzle, zeros past m.
CUtensorMap activation_map(const __half* xp, int64_t m, int64_t quads, int N) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    LOWBIT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    LOWBIT_CHECK(q == cudaDriverEntryPointSuccess && fn != nullptr, "anyprec wgmma GEMM: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(quads * kQuadCols), static_cast<cuuint64_t>(m)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(quads * kQuadCols * 2)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kStepCols), static_cast<cuuint32_t>(N)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult rc = encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<__half*>(xp), dims, strides, box, elem,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LOWBIT_CHECK(rc == CUDA_SUCCESS, "anyprec wgmma GEMM: cuTensorMapEncodeTiled failed (", static_cast<int>(rc), ") for ", m,
               " tokens x ", quads * kQuadCols, " columns");
  return map;
}

template <int B, int N, int kStages>
void launch_ws(const AnyPrecDevice& w, const __half* xp, int64_t m, int64_t quads, float* y, GemmContext& ctx) {
  using T = WsTile<B, N, kStages>;
  auto kern = anyprec_wgmma_ws_kernel<B, N, kStages>;
  const int per_sm = stream_blocks_per_sm(kern, kThreads, T::kSmemBytes);   // sets the shared-memory limit too
  LOWBIT_CHECK(per_sm >= 1, "anyprec wgmma GEMM: the warp-specialized kernel does not fit an SM");
  const int64_t tb = (m + N - 1) / N, rb = (w.n + kRows - 1) / kRows, tiles = tb * rb;
  LOWBIT_CHECK(tiles < (1LL << 31) && m < (1LL << 31) && quads * kQuadCols < (1LL << 31), "anyprec wgmma GEMM: ", m,
               " tokens or ", w.n, " rows exceed one launch's grid");
  const CUtensorMap map = activation_map(xp, m, quads, N);
  // Whole waves of tiles run over all of k; the tiles of the last, partial wave (all of them when there are fewer
  // than one wave) are split in k so that they fill the GPU: ceil(tiles / slots) waves of work become
  // floor(tiles / slots) + 1 / splits (28672x8192 at 512 tokens: 448 tiles on 132 SMs, 4 waves -> 3.5).
  static const int sms = device_sm_count();
  const int64_t slots = static_cast<int64_t>(per_sm) * sms, whole = tiles / slots * slots, tail = tiles - whole;
  const int64_t want = std::min(tail > 0 ? std::max<int64_t>(1, slots / tail) : 1, std::max<int64_t>(1, quads / kMinSplitQuads));
  const int64_t split_quads = (quads + want - 1) / want, splits = (quads + split_quads - 1) / split_quads;
  const int64_t direct = splits > 1 ? whole : tiles;   // tiles written straight into y
  if (direct > 0) {
    kern<<<dim3(static_cast<unsigned>(direct), 1), kThreads, T::kSmemBytes, ctx.stream()>>>(map, w, m, quads, quads, 0, tb, false, y);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
  }
  if (splits > 1) {
    const int64_t per_tile = static_cast<int64_t>(N) * kRows, count = tail * per_tile;
    float* part = reinterpret_cast<float*>(ctx.weight_scratch(static_cast<size_t>(2 * splits * count)));
    kern<<<dim3(static_cast<unsigned>(tail), static_cast<unsigned>(splits)), kThreads, T::kSmemBytes, ctx.stream()>>>(
        map, w, m, quads, split_quads, whole, tb, true, part);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    sum_tile_splits_kernel<N><<<static_cast<unsigned>((count + 255) / 256), 256, 0, ctx.stream()>>>(part, static_cast<int>(splits),
                                                                                                    tail, whole, tb, m, w.n, y);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void anyprec_wgmma_ws_gemm(const AnyPrecDevice& w, int bits, const __half* xp, int64_t m, int64_t quads, float* y,
                           GemmContext& ctx) {
  LOWBIT_CHECK(sm90a_available(), "anyprec wgmma GEMM: needs a compute capability 9.0 GPU (H100 / H200)");
  // Ring depth: 4 stages of 256 tokens (48 KB each), 6 of 128 (32 KB), under the 227 KB of one CTA per SM with the
  // plane ring (24 KB at 3 bits, 32 at 4).
  if (!dispatch_int<2, 3, 4>(bits, [&](auto b) {
        constexpr int kB = decltype(b)::value;
        if (m <= 128) launch_ws<kB, 128, 6>(w, xp, m, quads, y, ctx);
        else launch_ws<kB, 256, 4>(w, xp, m, quads, y, ctx);
      }))
    fail("anyprec wgmma GEMM: widths 2..4 (asked: ", bits, ")");
}

}  // namespace lowbit::cuda
