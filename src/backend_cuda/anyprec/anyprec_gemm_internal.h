// Internal to the fused any-precision GEMM (anyprec_gemm.cu, anyprec_wgmma_ws.cu): the pieces both kernels share.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/anyprec/anyprec.h"
#include "backend_cuda/common/stream.cuh"

namespace lowbit::cuda {

constexpr int kQuadCols = 128;   // columns of one word quad (4 plane words per row)
// Split-k never cuts a row into pieces of fewer quads (the staged GEMM tuned on the H200 at 3 and 4 bits, batch 32..128,
// against floors of 8 and 16 quads and no split).
constexpr int kMinSplitQuads = 4;

// cp.async of one row's plane words 4Q .. 4Q + 3 (src points at word 4Q) to dst: one 16-byte copy when rows are a
// multiple of 4 words (vec), else four 4-byte copies, zeros past the row's W words.
__device__ __forceinline__ void cp_async_quad_words(uint32_t dst, const uint32_t* src, int64_t Q, int64_t W, bool vec,
                                                    const uint32_t* any_valid) {
  if (vec) {
    cp_async(dst, src, 16);
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const bool ok = 4 * Q + c < W;
      cp_async(dst + 4u * c, ok ? src + c : any_valid, 4, ok);
    }
  }
}

// x fp32 [m, k] -> xp fp16 [m, quads * 128]: each quad's 128 columns in the A fragments' k order (slab sj = 2s + h of
// the quad is the k16 step whose codes are word bits 16h + 4q + s), zero past k and past the row's words.
void anyprec_permute_x(const AnyPrecDevice& w, const float* x, int64_t m, __half* xp, int64_t quads, cudaStream_t s);

// y = the sum of `splits` partials [splits, count], added in split order (deterministic).
void sum_splits(const float* part, int splits, int64_t count, float* y, cudaStream_t s);

// Splits of k for a grid of `blocks` row x token blocks at `per_sm` CTAs per SM: only while they fill less than one wave,
// never below kMinSplitQuads quads per split. Returns the quads per split.
int64_t split_quads_for(int64_t blocks, int per_sm, int64_t quads);

// The warp-specialized wgmma GEMM (anyprec_wgmma_ws.cu, built for sm_90a only; sm90a_available() says whether the
// current GPU runs it): the launch over x already permuted (anyprec_permute_x), 2..4 bits, any m >= 1.
void anyprec_wgmma_ws_gemm(const AnyPrecDevice& w, int bits, const __half* xp, int64_t m, int64_t quads, float* y,
                           GemmContext& ctx);

}  // namespace lowbit::cuda
