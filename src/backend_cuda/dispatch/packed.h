// packed_matmul: y = x · Wᵀ for a packed weight on the device, on the kernel kernel_choice.h picks, and the
// runtime's switches around it (grouped GEMVs, the SwiGLU epilogue, the rows' max |x| from the producing kernels).
#pragma once
#include <cstdint>
#include <vector>

#include "backend_cuda/anyprec/anyprec.h"
#include "backend_cuda/dense/dense.h"
#include "backend_cuda/dispatch/device_weight.h"
#include "backend_cuda/dispatch/kernel_choice.h"
#include "backend_cuda/mixed24a/mixed24a.h"
#include "backend_cuda/quik/quik.h"
#include "backend_cuda/uniform/uniform.h"

namespace lowbit::cuda {

// The GEMV path of a batch-1..8 kernel of kernel_choice.h (Auto for the others).
GemvPath gemv_path_of(Kernel k);
// The GPU the runtime runs on, as kernel_choice.h describes it (read once).
const GpuInfo& runtime_gpu();
// Whether Auto runs the int8 GEMVs where they fit (LOWBIT_INT8_TABLES, core/knobs.h; set_int8_tables() overrides it:
// benchmarks time both in one run, and a captured decode graph is keyed on it). The any-precision centroids are the
// fp16 LUT's rounded to int8 under a row scale, in two pieces at 4 bits (int8_tables.h): one piece measured +0.09%
// perplexity at 3 bits and +0.69% at 4 bits as a what-if on every layer of SmolLM2, so 4 bits carries the second piece.
bool int8_tables_enabled();
void set_int8_tables(bool on);
// Auto's choice (kernel_choice.h) as a GemvPath. presplit: whether the caller gives the xfrag scratch.
GemvPath anyprec_auto_path(int64_t n, int64_t k, int m, int bits, bool presplit);
GemvPath mixed24a_auto_path(int64_t n, int64_t k, int m, bool presplit);
// The runtime (packed_matmul) feeds the tensor-core GEMVs pre-split activations (the xfrag argument below): faster than
// splitting in the loop on every shape and batch measured.
constexpr bool kPreSplitInRuntime = true;

// The fused packed GEMMs above batch 8 where kernel_choice.h takes them (LOWBIT_FUSED_GEMM, core/knobs.h;
// set_fused_gemm() overrides it: bench --e2e times both in one run, and a captured decode graph is keyed on it).
bool fused_gemm_enabled();
void set_fused_gemm(bool on);

// y [m, n] fp32 = x [m, k] fp32 · Wᵀ for any m >= 1, on the kernel kernel_choice.h picks for the weight's format,
// width, shape, batch and GPU: a GEMV for m <= 8; above, a fused GEMM or dequantize + cuBLAS (fp16 inputs, fp32
// accumulation and output). bits: the anyprec width (0 = widest); ignored by single-width formats.
// x_max: as anyprec_gemv_i8's xmax (rows' exact max |x|), used where the int8 GEMV or the 2/4/16 integer-dot GEMV
// runs, ignored elsewhere.
void packed_matmul(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* y, GemmContext& ctx,
                   OutlierMode mode = OutlierMode::Fused, const float* x_max = nullptr);
// Whether the runtime hands the int8 GEMV the rows' max |x| from the kernels that produce x (packed_matmul's x_max):
// on unless LOWBIT_PRODUCER_XMAX=0 in the environment (read once); set_producer_xmax() overrides it (bench --e2e times
// both in one run; a captured decode graph is keyed on it).
bool producer_xmax_enabled();
// Whether packed_matmul runs the int8 GEMV (GemvPath::TensorCoreInt8LutStream) or the 2/4/16 integer-dot GEMV
// (GemvPath::Dp2aStream) for this weight, width (0 = the widest) and batch: where x_max is read.
bool packed_runs_int8_gemv(const DevicePackedWeight& w, int bits, int64_t m);
void set_producer_xmax(bool on);
// SwiGLU in the gate/up GEMV's epilogue (anyprec_gemv_i8's hmax_bits): whether it serves this stacked gate/up weight,
// width and batch (the int8 GEMV runs at 2..3 bits, n % 32 == 0) and is on (LOWBIT_FOLD_SWIGLU=0 in the environment turns it off,
// read once; set_fold_swiglu() overrides it: bench --e2e times both in one run, a captured decode graph is keyed on it).
bool fold_swiglu_enabled();
void set_fold_swiglu(bool on);
bool packed_swiglu_fuses(const DevicePackedWeight& w, int bits, int64_t m);
// Matrices that read the same x (q / k / v, gate / up; 2..3 of them) in one launch of the 2/4/16 integer-dot GEMV
// (mixed24a_gemv_group): whether it serves them at batch m (every one mixed24a with the same k, Auto's kernel for it the
// integer-dot GEMV) and is on (LOWBIT_GROUP_GEMV=0 in the environment turns it off, read once; set_group_gemv()
// overrides it: bench --e2e times both in one run, a captured decode graph is keyed on it). ys[p]: part p's output.
bool group_gemv_enabled();
void set_group_gemv(bool on);
bool packed_group_runs(const std::vector<const DevicePackedWeight*>& ws, int64_t m);
void packed_matmul_group(const std::vector<const DevicePackedWeight*>& ws, const float* x, int64_t m, const std::vector<float*>& ys,
                         GemmContext& ctx, const float* x_max = nullptr);
// h [m, n / 2] = silu(x W_gateᵀ) * (x W_upᵀ) for a stacked [gate; up] weight where packed_swiglu_fuses, h_max_bits as
// anyprec_gemv_i8's hmax_bits; x_max as packed_matmul's.
void packed_matmul_swiglu(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* h, GemmContext& ctx,
                          const float* x_max, unsigned* h_max_bits);

// One decode step's rows at different any-precision widths (continuous batching with per-request precision):
// y [m, n] = x [m, k] · W_{b_r}ᵀ per row r, b_r = row_bits[r] (device memory, read when the kernel runs: a captured
// step serves any mix), max_bits the widest of them. The planes of max_bits are read once for all rows
// (anyprec_gemv_mixed) instead of once per width. Served for any-precision weights at batch m <= kMaxGemvBatch.
bool packed_mixed_serves(const DevicePackedWeight& w, int64_t m);
void packed_matmul_mixed(const DevicePackedWeight& w, int max_bits, const int32_t* row_bits, const float* x, int64_t m,
                         float* y, GemmContext& ctx);

}  // namespace lowbit::cuda
