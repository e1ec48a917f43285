// The fused any-precision GEMM for batches above 8: y [m, n] = x [m, k] · W_bᵀ with the b-bit weights decoded from
// their bitplanes in registers and fed straight to mma.sync m16n8k16, so no fp16 copy of W is written or read
// (batch 9..16 runs the GEMVs' two-tile form, anyprec_gemv_two_tiles; this file's staged kernel serves 2..4 bits).
// The dequantize + cuBLAS path writes and reads back n·k·2 bytes, 2.3-2.4x the fp16 GEMM's own time at batch 16..64
// (docs/PERF.md has the fused paths' times against it).
//
// A CTA computes kRows = 32 · kWarps weight rows for 8 · NT tokens over a range of word quads (split-k over the
// grid's z when the row and token blocks alone would leave SMs idle; the splits' partial sums are then added in
// order by a second kernel, so results do not depend on timing). Each warp owns two m16 tiles (32 rows); lane
// (g, t) holds the register tables (anyprec_codes.cuh) of rows g and g + 8 of both, so each A fragment it builds
// feeds NT mma, one per 8-token n tile.
//
// Per quad (4 plane words per row = 128 columns), a stage of a kStages-deep cp.async ring holds the CTA rows' plane
// words ([plane][row][4 words], 16 bytes per row and plane) and the tokens' activations in fp16, already permuted
// into the A fragments' k order by anyprec_gemm_xperm_kernel: slab (s, h) of a quad is the mma k16 step whose
// codes are word bits 16h + 4q + s (register_lookup: code q at k index 2t + (q & 1) + 8 (q >> 1) of lane t, whose
// word is 4Q + t). A token's 128 permuted columns are 16 chunks of 16 bytes, chunk c stored at c ^ (token % 8), so
// the ldmatrix of 8 tokens' 16-byte rows for one B fragment hits 8 different bank quads.
//
// Activations are rounded to fp16 (as the dequantize + cuBLAS path rounds them); the LUT values are exact in fp16;
// accumulation is fp32. Sparse outliers are added afterwards by the CSR pass (anyprec_outliers_add) in fp32.
#include <algorithm>

#include "backend_cuda/anyprec/anyprec_codes.cuh"
#include "backend_cuda/anyprec/anyprec_gemm_internal.h"
#include "backend_cuda/common/mma.cuh"
#include "backend_cuda/anyprec/anyprec.h"
#include "backend_cuda/common/stream.cuh"

namespace lowbit::cuda {
namespace {

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// x fp32 [m, k] -> xp fp16 [m, 128 quads], column (Q, sj = 2s + h, kappa) of the permuted row holding original
// column c of word 4Q + t, bit 16h + 4q + s, where kappa = 2t + (q & 1) + 8 (q >> 1); zero past k and past the
// row's words. One thread per 16-byte chunk (kappa 8 half .. 8 half + 7 of one slab).
__global__ void anyprec_gemm_xperm_kernel(AnyPrecDevice w, const float* __restrict__ x, int64_t m,
                                          __half* __restrict__ xp, int64_t quads) {
  const int64_t chunks = quads * 16;
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= m * chunks) return;
  const int64_t tok = id / chunks, ch = id % chunks, Q = ch / 16;
  const int sj = static_cast<int>(ch % 16) / 2, half = static_cast<int>(ch % 2);
  const int s = sj / 2, h = sj % 2;
  const float* xr = x + tok * w.k;
  alignas(16) __half v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int t = i / 2, q = 2 * half + i % 2;
    const int64_t word = 4 * Q + t;
    const int bit = 16 * h + 4 * q + s;
    float val = 0.0f;
    if (word < w.words) {
      const int64_t T = word / 32, nw = min_i64(32, w.words - 32 * T);
      const int64_t c = 1024 * T + (bit / 8) * 8 * nw + 8 * (word % 32) + bit % 8;
      if (c < w.k) val = __ldg(xr + c);
    }
    v[i] = __float2half_rn(val);
  }
  *reinterpret_cast<uint4*>(xp + tok * chunks * 8 + ch * 8) = *reinterpret_cast<const uint4*>(v);
}

template <int B, int NT, int kWarps, int kStages>
struct GemmTile {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 32 * kWarps;                  // two m16 tiles per warp
  static constexpr int kTokens = 8 * NT;
  static constexpr int kWBytes = B * kRows * 16;             // [plane][row] 4 words
  static constexpr int kXBytes = kTokens * kQuadCols * 2;    // [token] 16 swizzled chunks of 16 bytes
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
};

// out: y [m, n] (one split) or the partials [splits, m, n].
template <int B, int NT, int kWarps, int kStages>
__global__ void __launch_bounds__(32 * kWarps) anyprec_gemm_kernel(AnyPrecDevice w, const __half* __restrict__ xp,
                                                                  int64_t m, int64_t quads, int64_t split_quads,
                                                                  float* __restrict__ out) {
  using G = GemmTile<B, NT, kWarps, kStages>;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t n = w.n, W = w.words;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x) * G::kTokens;
  const int64_t rowc = static_cast<int64_t>(blockIdx.y) * G::kRows;
  const int64_t q0 = static_cast<int64_t>(blockIdx.z) * split_quads;
  const int nq = static_cast<int>(min_i64(quads, q0 + split_quads) - q0);
  constexpr int E = 1 << B;

  RegTable<B> tab[2][2];   // [m tile][row g, g + 8]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      load_register_table<B>(w.lut[B] + min_i64(rowc + 32 * warp + 16 * mt + 8 * hf + g, n - 1) * E, tab[mt][hf]);

  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(gemm_smem));
  const bool vec_w = W % 4 == 0;
  const int64_t xrow = quads * kQuadCols;
  // Copy assignments (kRows == kThreads): thread tid copies row tid of every plane, and chunk tid % 16 of tokens
  // tid / 16 + 8 i, whose swizzled slot (c ^ (token % 8)) is the same for every i.
  static_assert(G::kRows == G::kThreads && G::kTokens % 8 == 0, "one row per thread; tokens in steps of 8");
  static_assert(G::kThreads == 128, "16 chunks x 8 tokens per pass: xt0 = tid / 16 < 8 is also the token's swizzle");
  const int64_t plane_stride = n * W;
  const uint32_t* wsrc = w.plane_data + min_i64(rowc + tid, n - 1) * W;
  const int xc = tid % 16, xt0 = tid / 16;
  const __half* xsrc = xp + min_i64(tok0 + xt0, m - 1) * xrow + 8 * xc;
  const uint32_t xdst = static_cast<uint32_t>(G::kWBytes + xt0 * 256 + ((xc ^ xt0) * 16));
  auto issue = [&](int i) {   // quad q0 + i into stage i % kStages
    if (i < nq) {
      const int64_t Q = q0 + i;
      const uint32_t st = smem0 + static_cast<uint32_t>((i % kStages) * G::kStageBytes);
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const uint32_t* src = wsrc + j * plane_stride + 4 * Q;
        cp_async_quad_words(st + 16u * static_cast<uint32_t>(j * G::kRows + tid), src, Q, W, vec_w, w.plane_data);
      }
#pragma unroll
      for (int r = 0; r < G::kTokens / 8; ++r) {
        const bool ok = tok0 + xt0 + 8 * r < m;
        cp_async(st + xdst + 8u * 256u * static_cast<uint32_t>(r), xsrc + (ok ? 8 * r * xrow : 0) + Q * kQuadCols, 16, ok);
      }
    }
    cp_async_commit();
  };

  float acc[2][NT][4] = {};
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  // ldmatrix.x4 row addresses of this lane: matrix lane / 8 = (n tile 2 jp + mi / 2, chunk 2 sj + mi % 2), row lane % 8.
  const int mi = lane / 8, ri = lane % 8;
  for (int i = 0; i < nq; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();   // stage i landed for every thread; stage i - 1 (refilled next) is read by no one any more
    issue(i + kStages - 1);
    const uint32_t st = smem0 + static_cast<uint32_t>((i % kStages) * G::kStageBytes);
    uint32_t wv[2][2][B];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int j = 0; j < B; ++j)
          wv[mt][hf][j] = lds_u32(st + static_cast<uint32_t>((j * G::kRows + 32 * warp + 16 * mt + 8 * hf + g) * 16 + 4 * t));
    const uint32_t xs = st + G::kWBytes;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t sel[2][2], msel[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) register_selectors<B>(wv[mt][hf], s, sel[mt][hf], msel[mt][hf]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int sj = 2 * s + h;
        uint32_t b[NT][2];
#pragma unroll
        for (int jp = 0; jp < NT / 2; ++jp) {
          const int tok = 8 * (2 * jp + mi / 2) + ri, c = 2 * sj + mi % 2;
          ldmatrix_x4(xs + static_cast<uint32_t>(tok * 256 + ((c ^ ri) * 16)), b[2 * jp][0], b[2 * jp][1],
                      b[2 * jp + 1][0], b[2 * jp + 1][1]);
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t a[4];
          register_lookup<B>(tab[mt][0], h ? sel[mt][0] >> 16 : sel[mt][0], h ? msel[mt][0] >> 16 : msel[mt][0], a[0], a[2]);
          register_lookup<B>(tab[mt][1], h ? sel[mt][1] >> 16 : sel[mt][1], h ? msel[mt][1] >> 16 : msel[mt][1], a[1], a[3]);
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_16816(acc[mt][j], a, b[j][0], b[j][1]);
        }
      }
    }
  }
  cp_async_wait<0>();   // no copy may still target shared memory when the CTA exits

  float* o = out + static_cast<int64_t>(blockIdx.z) * m * n;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = rowc + 32 * warp + 16 * mt + g + (e >= 2 ? 8 : 0);
        const int64_t tok = tok0 + 8 * j + 2 * t + (e & 1);
        if (row < n && tok < m) o[tok * n + row] = acc[mt][j][e];
      }
}

// y = the sum of the splits' partials, in split order.
__global__ void sum_splits_kernel(const float* __restrict__ part, int splits, int64_t count, float* __restrict__ y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float v = part[i];
  for (int z = 1; z < splits; ++z) v += part[z * count + i];
  y[i] = v;
}

constexpr int kGemmWarps = 4;

// Ring depth: 4 stages, 3 for 64-token tiles (their 90 KB at 4 stages held 3-bit CTAs to 2 per SM by shared memory).
template <int B, int NT>
void launch_gemm(const AnyPrecDevice& w, const __half* xp, int64_t m, int64_t quads, float* y, GemmContext& ctx) {
  constexpr int kStages = NT == 8 ? 3 : 4;
  using G = GemmTile<B, NT, kGemmWarps, kStages>;
  auto kern = anyprec_gemm_kernel<B, NT, kGemmWarps, kStages>;
  const int per_sm = stream_blocks_per_sm(kern, G::kThreads, G::kSmemBytes);   // sets the shared-memory limit too
  const int64_t tb = (m + G::kTokens - 1) / G::kTokens, rb = (w.n + G::kRows - 1) / G::kRows;
  const int64_t split_quads = split_quads_for(tb * rb, per_sm, quads);
  const int64_t splits = (quads + split_quads - 1) / split_quads;
  float* out = y;
  if (splits > 1) out = reinterpret_cast<float*>(ctx.weight_scratch(static_cast<size_t>(2 * splits * m * w.n)));
  const dim3 grid(static_cast<unsigned>(tb), static_cast<unsigned>(rb), static_cast<unsigned>(splits));
  kern<<<grid, G::kThreads, G::kSmemBytes, ctx.stream()>>>(w, xp, m, quads, split_quads, out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) sum_splits(out, static_cast<int>(splits), m * w.n, y, ctx.stream());
}

template <int B>
void gemm_bits(const AnyPrecDevice& w, const __half* xp, int64_t m, int64_t quads, float* y, GemmContext& ctx) {
  if (m <= 16) launch_gemm<B, 2>(w, xp, m, quads, y, ctx);
  else if (m <= 32) launch_gemm<B, 4>(w, xp, m, quads, y, ctx);
  else launch_gemm<B, 8>(w, xp, m, quads, y, ctx);
}

}  // namespace

void anyprec_permute_x(const AnyPrecDevice& w, const float* x, int64_t m, __half* xp, int64_t quads, cudaStream_t s) {
  const int64_t threads = m * quads * 16;
  LOWBIT_CHECK((threads + 255) / 256 < (1LL << 31), "anyprec GEMM: ", m, " x ", w.k, " activations exceed one launch's grid");
  anyprec_gemm_xperm_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, s>>>(w, x, m, xp, quads);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void sum_splits(const float* part, int splits, int64_t count, float* y, cudaStream_t s) {
  sum_splits_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, s>>>(part, splits, count, y);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

int64_t split_quads_for(int64_t blocks, int per_sm, int64_t quads) {
  static const int sms = device_sm_count();
  const int64_t want = std::max<int64_t>(1, static_cast<int64_t>(per_sm) * sms / blocks);
  const int64_t splits = std::min<int64_t>(want, std::max<int64_t>(1, quads / kMinSplitQuads));
  return (quads + splits - 1) / splits;
}

bool anyprec_gemm_serves(int bits, GemmKernel kind) {
  if (kind == GemmKernel::TwoTiles) return bits >= 2 && bits <= 8;
  if (kind == GemmKernel::WgmmaWs && !sm90a_available()) return false;
  return bits >= 2 && bits <= 4;
}

const char* gemm_kernel_name(GemmKernel kind) {
  switch (kind) {
    case GemmKernel::TwoTiles: return "two-tile GEMV";
    case GemmKernel::Staged: return "staged";
    case GemmKernel::WgmmaWs: return "warp-specialized wgmma";
  }
  return "(invalid)";
}

void anyprec_gemm(const AnyPrecDevice& w, int bits, const float* x, int64_t m, float* y, GemmContext& ctx, GemmKernel kind) {
  LOWBIT_CHECK(m >= 1, "anyprec GEMM: batch ", m);
  const bool two_tiles_fit = m > kMaxGemvBatch && m <= 2 * kMaxGemvBatch;
  LOWBIT_CHECK(kind != GemmKernel::TwoTiles || two_tiles_fit, "anyprec GEMM: the two-tile GEMV serves batch 9..16 (asked: ", m, ")");
  LOWBIT_CHECK(anyprec_gemm_serves(bits, kind) && bits <= w.planes && ((w.widths >> bits) & 1u) != 0, "anyprec GEMM: width ",
               bits, " is not served by the ", gemm_kernel_name(kind), " kernel (",
               kind == GemmKernel::TwoTiles ? "2..8" : kind == GemmKernel::WgmmaWs ? "2..4 bits on compute capability 9.0" : "2..4",
               " bits that the weight serves)");
  if (kind == GemmKernel::TwoTiles) {
    void* xfrag = ctx.act_scratch((anyprec_xfrag_bytes(w.k) + 1) / 2);
    anyprec_gemv_two_tiles(w, bits, x, static_cast<int>(m), y, ctx.stream(), xfrag);
    return;
  }
  const int64_t quads = (w.words + 3) / 4;
  __half* xp = ctx.act_scratch(static_cast<size_t>(m * quads * kQuadCols));
  LOWBIT_CHECK((w.n + 32 * kGemmWarps - 1) / (32 * kGemmWarps) <= 65535, "anyprec GEMM: ", w.n, " rows exceed one launch's grid");
  anyprec_permute_x(w, x, m, xp, quads, ctx.stream());
  if (kind == GemmKernel::WgmmaWs) {
    anyprec_wgmma_ws_gemm(w, bits, xp, m, quads, y, ctx);
  } else {
    dispatch_int<2, 3, 4>(bits, [&](auto b) { gemm_bits<decltype(b)::value>(w, xp, m, quads, y, ctx); });
  }
  if (w.rowptr != nullptr) anyprec_outliers_add(w, bits, x, m, y, ctx.stream());
}

}  // namespace lowbit::cuda
