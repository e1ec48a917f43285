// The any-precision kernels (Park et al., ICML 2024): bitplane GEMVs at batch 1..8 reading only the planes of the
// requested width, the fused GEMMs above, dequantize to fp16, and the sparse outliers. Each kernel's CPU twin is the
// format's reference GEMM (formats/anyprec/): tests/test_cuda_kernels.cpp compares them on the same packed bytes.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/common/gemv_path.h"
#include "backend_cuda/dense/dense.h"
#include "backend_cuda/dispatch/device_weight.h"

namespace lowbit::cuda {

// The any-precision CUDA-core GEMV gives each warp several rows (their activation loads shared). At batch <= 4 a
// matrix with too few rows for that to fill the GPU (fewer than 4 x 32 x SMs rows) runs one row per warp when its
// rows are short (k <= 4096) or its width wide (>= 6 bits): measured on the H100 (docs/PERF.md), one row per warp
// took 8-bit 4096x4096 from 22.6 to 19.9 us but 3-bit 8192x28672 from 103 to 148 us.
constexpr int kNarrowMaxBatch = 4;
bool narrow_rows(int64_t n, int64_t k, int m, int bits);

// y [m, n] (fp32, row-major) = x [m, k] (fp32) · W_bᵀ, 1 <= m <= kMaxGemvBatch. bits: a served width.
// xfrag: optional device scratch of anyprec_xfrag_bytes(k) bytes. When the tensor-core path runs and it is given, a
// small kernel first writes the activations there in the lanes' fragment order, split into fp16 hi + lo, and the
// GEMV reads one 16-byte word per 16-column slab (the pre-split path); without it the GEMV splits in its loop.
// Only the fragments of lanes feeding batch columns < m are written: kernels reading the scratch must not index it
// by a lane of a column >= m (theirs read column 0's instead). Auto depends on whether xfrag is given: callers
// that want the runtime's choice pass anyprec_auto_path(..., presplit) explicitly, as packed_matmul does.
void anyprec_gemv(const AnyPrecDevice& w, int bits, const float* x, int m, float* y, cudaStream_t s,
                  OutlierMode mode = OutlierMode::Fused, GemvPath path = GemvPath::Auto, void* xfrag = nullptr);
size_t anyprec_xfrag_bytes(int64_t k);
// x [m, k] split into fp16 hi + lo in the shared-table tensor-core kernels' fragment order, one plane word per lane,
// into xfrag (anyprec_xfrag_bytes(k); only the fragments, for batch columns < m): the pre-split input of those kernels
// and of anyprec_gemv_mixed's.
void anyprec_presplit_x(const AnyPrecDevice& w, const float* x, int m, void* xfrag, cudaStream_t s);
// The int8 GEMV (GemvPath::TensorCoreInt8LutStream) on its own: xq, a scratch of anyprec_i8_x_bytes(k, m) bytes
// (anyprec_xfrag_bytes(k) is always enough), receives the activations' int8 pieces first. Outliers are always fused.
// xmax != nullptr: xmax[r] = max |x[r]| for the m rows, exact (written by the kernel that produced x: rmsnorm, SwiGLU,
// attention, gpu_ops.h); the activation kernel then skips its row-wide reduction.
// hmax_bits != nullptr (the SwiGLU epilogue; w a stacked gate/up weight, n = 2 H, n % 32 == 0): y [m, H] receives
// silu(gate) * up instead of the 2 H outputs (gpu_ops.h swiglu_rows' values, bit for bit), and hmax_bits[r] the bits of
// each row's max |h| by atomicMax (the slot zeroed before, as swiglu_rows' xmax_bits).
void anyprec_gemv_i8(const AnyPrecDevice& w, int bits, const float* x, int m, float* y, cudaStream_t s, bool fused, void* xq,
                     const float* xmax = nullptr, unsigned* hmax_bits = nullptr);
size_t anyprec_i8_x_bytes(int64_t k, int m);
// The warps per CTA (4 or 8) the int8 GEMV runs for this weight, width, batch and epilogue (gemv_balance_enabled and
// the shape rules). Its sums are integers reduced as integers, so both forms give the same bits.
int anyprec_i8_cta_warps(const AnyPrecDevice& w, int bits, int m, bool fused, bool swiglu);
void anyprec_dequant_f16(const AnyPrecDevice& w, int bits, __half* out, cudaStream_t s);

// The fused any-precision GEMM (anyprec_gemm.cu) for batches above 8: no fp16 copy of W; activations rounded to fp16
// (as the cuBLAS path rounds them), fp32 accumulation, outliers added by the CSR pass in fp32. kind: TwoTiles = the
// GEMV kernels in their two-tile form (batch 9..16, widths 2..8: anyprec_gemv_two_tiles); Staged = the cp.async-
// staged mma.sync GEMM with register tables (any batch, widths 2..4); WgmmaWs = the warp-specialized wgmma GEMM
// (widths 2..4, compute capability 9.0 only; anyprec_wgmma_ws.cu): a decoding warpgroup writes fp16 weight tiles to
// shared memory, TMA loads the activation tiles, two warpgroups run wgmma with both operands in shared memory (at
// 256..512 tokens 1.1-1.8x faster than wgmma with the decoded weights as its register A operand, which is why that form
// is not kept). Which one runs: kernel_choice.h.
// Scratch from ctx (fragments or permuted fp16 activations in act_scratch, split-k partials in weight_scratch).
enum class GemmKernel { Staged, TwoTiles, WgmmaWs };
bool anyprec_gemm_serves(int bits, GemmKernel kind);   // also false for WgmmaWs where the GPU or build cannot run it
const char* gemm_kernel_name(GemmKernel kind);
void anyprec_gemm(const AnyPrecDevice& w, int bits, const float* x, int64_t m, float* y, GemmContext& ctx, GemmKernel kind);
// Batch 9..16, widths 2..8: the register-table (2..4 bits) or shared-table (5..8) tensor-core GEMV with x entries of
// two fp16 columns in place of hi / lo (the work of a batch-8 call), outliers as the CSR pass; xfrag as for anyprec_gemv.
void anyprec_gemv_two_tiles(const AnyPrecDevice& w, int bits, const float* x, int m, float* y, cudaStream_t s, void* xfrag);
// y [m, n] += the sparse outliers' corrections (val - lut[code]) * x over each row's CSR entries (fp32 x [m, k]).
void anyprec_outliers_add(const AnyPrecDevice& w, int bits, const float* x, int64_t m, float* y, cudaStream_t s);
// The any-precision int8 GEMV picks 4- or 8-warp CTAs at batch 1..2 by which gives the busiest warp fewer work items
// (whole tiles per CTA leave some CTAs a tile more than others; anyprec_gemv_i8.cu, i8_form): on unless
// LOWBIT_GEMV_BALANCE=0 in the environment (read once); set_gemv_balance() overrides it (tests run both forms; a
// captured decode graph is keyed on it).
bool gemv_balance_enabled();
void set_gemv_balance(bool on);
// Whether the any-precision int8 GEMV sums both activation pieces in one mma at batch 1..4 (anyprec_gemv_i8.cu's
// kPackPieces): -1 by its rule (i8_form: always at 4 bits, at 2..3 bits where the busiest warp runs few items), 0 never,
// 1 always at 2..3 bits. LOWBIT_I8_PACK=0|1 in the environment sets it (read once); set_i8_pack_mode() overrides it
// (tests compare the forms, which give the same bits; a captured decode graph is keyed on it).
int i8_pack_mode();
void set_i8_pack_mode(int mode);

// y [m, n] (fp32) = x [m, k] (fp32) · W_{b_r}ᵀ per activation row r, b_r = row_bits[r] (device memory, m entries, each
// a served width <= max_bits); the planes (0..max_bits-1 at most) are read once for all rows. 1 <= m <= kMaxGemvBatch.
// (anyprec_gemv_mixed.cu.) The kernels read row_bits when they run, so a captured launch serves any mix of widths; a
// row whose width the weight does not serve, or above max_bits, comes out NaN. max_bits picks the instantiation
// (2..8, at most the weight's planes) and the shared memory; the planes read are those of the widest width present
// (beyond each CTA's first words), so one launch captured at the widest served width reads, at each replay, the
// planes that mix's widest row needs. Outliers are always fused, each row corrected at its own width.
// path: Auto (= TensorCore), TensorCore (mma.sync; widths 2..4 from register tables, 5..8 from shared memory) or Scalar
// (CUDA cores). xfrag: optional scratch of anyprec_xfrag_bytes(k) bytes; given, the tensor-core path reads x pre-split
// by a kernel launched first (its fragments only: the scratch's layout past them is not this call's).
void anyprec_gemv_mixed(const AnyPrecDevice& w, int max_bits, const int32_t* row_bits, const float* x, int m, float* y,
                        cudaStream_t s, GemvPath path = GemvPath::Auto, void* xfrag = nullptr);

}  // namespace lowbit::cuda
