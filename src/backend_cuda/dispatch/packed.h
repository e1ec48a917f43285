// Packed weights on the GPU, stored exactly as in the file (no dequantized copy is kept), and the kernels that
// read them: the any-precision bitplane GEMV (any served width, chosen per call, from the same planes), the
// 2/4/16 mixed24a GEMV, and for batches above 8 the fused GEMM paths (two-tile GEMVs, the staged any-precision GEMM)
// or, where those measured slower, a dequantize-to-fp16 kernel feeding cuBLAS.
// Each kernel's CPU twin is the format's reference GEMM (formats/*/): tests/test_cuda_kernels.cpp compares them on
// the same packed bytes.
#pragma once
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dispatch/kernel_choice.h"
#include "model/weight_set.h"

namespace lowbit::cuda {


// Device views (non-owning) of one packed weight, one per format.
struct AnyPrecDevice {
  int64_t n = 0, k = 0, words = 0;         // words = 32-bit words per plane row
  int planes = 0;                           // parent width P
  uint32_t widths = 0;                      // bit b: width b served
  const uint32_t* plane_data = nullptr;     // [P, n, words]
  const __half* lut[9] = {};                // lut[b]: [n, 2^b] for every served b
  // Derived at upload for the served widths 2..4 (int8_tables.h; the int8 GEMV, GemvPath::TensorCoreInt8LutStream):
  // lut8[b] [n16, 2^b] int8 centroids and lut8_scale[b] [n16] their row scales, n16 = n rounded up to 16 (zeros).
  // 4 bits in two pieces (int8_tables.h, i8_table_row2): lut8[4] the hi and lut8_lo4 the lo bytes, each in i8_split16's form.
  const int8_t* lut8[5] = {};
  const float* lut8_scale[5] = {};
  const int8_t* lut8_lo4 = nullptr;
  const int32_t* rowptr = nullptr;          // CSR of outliers, or null
  const int32_t* col = nullptr;
  const __half* val = nullptr;
  int64_t nnz = 0;
};

struct Mixed24ADevice {
  int64_t n = 0, k = 0;
  const uint16_t* perm = nullptr;           // [k/16]
  const uint4* qa = nullptr;                // [n, U]
  const uint32_t* qb = nullptr;             // [n, U]
  const uint16_t* meta2 = nullptr;          // [n, U]
  const uint8_t* meta4 = nullptr;           // [n, U]
  const __half* ss2 = nullptr;              // [RG, 3U]
  const __half* sm2 = nullptr;
  const __half* ss4 = nullptr;              // [RG, U]
  const __half* sm4 = nullptr;
  const int32_t* rowptr = nullptr;          // CSR of outliers (stored columns), or null
  const uint16_t* col = nullptr;
  const __half* val = nullptr;
  int64_t nnz = 0;
};

// The parts of a packed weight copied to the device as stored (validated on the host first by the reader).
class DevicePackedWeight {
 public:
  explicit DevicePackedWeight(const PackedWeight& w);
  // Random weights of the real layouts generated on the device (benchmarks of shapes that are not on disk; content
  // does not change the work): an 8-bit anyprec parent serving 2..8 (k a multiple of 32), or a mixed24a weight with
  // a random group permutation and `outlier_frac` fp16 outliers per row (k a multiple of 64).
  static DevicePackedWeight random_anyprec(int64_t n, int64_t k, uint64_t seed);
  static DevicePackedWeight random_mixed24a(int64_t n, int64_t k, double outlier_frac, uint64_t seed);
  // The rows of several anyprec weights stacked into one (q/k/v or gate/up as one GEMV, outputs side by side): the
  // same input width, parent, served widths and outlier presence required, else null. Planes [P, sum n, W], LUTs and
  // the CSR outliers concatenated in order.
  static std::unique_ptr<DevicePackedWeight> concat_rows(const std::vector<const DevicePackedWeight*>& ws);
  // The same weight without its outliers (a view sharing the parts): for timing the dense kernel alone.
  Mixed24ADevice mixed24a_dense() const;
  FormatId format() const { return format_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  uint32_t served_widths() const;           // anyprec: its widths; others 0
  uint64_t bytes() const;                   // device bytes held
  uint64_t bytes_read(int bits) const;      // bytes one GEMV at that width reads
  uint64_t outlier_bytes() const;           // bytes of the CSR outlier parts (0 without)
  AnyPrecDevice anyprec() const;            // throws unless format() == FormatId::AnyPrec
  Mixed24ADevice mixed24a() const;          // throws unless format() == FormatId::Mixed24A

 private:
  DevicePackedWeight() = default;
  const uint8_t* part(const std::string& name) const;
  template <typename View>
  void view_outliers(View& d) const;   // the CSR outlier parts, when the weight has them
  // anyprec: the int8 tables of the served widths 2..4 (parts "derived_lut8_<b>", "derived_lut8s_<b>") from the fp16
  // LUTs; rebuilt, never concatenated, by concat_rows (their rows are padded to 16).
  void derive_int8_tables();
  FormatId format_ = FormatId::AnyPrec;
  int64_t n_ = 0, k_ = 0;
  std::map<std::string, int64_t> params_;
  std::map<std::string, DeviceBuffer<uint8_t>> parts_;
};

enum class OutlierMode { Fused, SpMV };   // sparse outliers inside the GEMV, or a CSR SpMV launched after it
// A GEMV kernel to run explicitly (tests and benchmarks time each one), or Auto: the one kernel_choice.h picks. Each
// value is a Kernel of kernel_choice.h (gemv_path_of maps them):
//   Scalar                     CUDA-core FMAs, centroids from shared-memory tables (any width, any batch 1..8);
//   TensorCore                 mma.sync, A from shared-memory tables; x split in the loop, or pre-split (xfrag given);
//   TensorCoreRegisterLut      mma.sync, A looked up from registers by PRMT (any-precision 2..4 bits; xfrag required);
//   TensorCoreRegisterLutStream  the register-table kernel with persistent CTAs streaming each warp's plane words, LUT
//                              rows and x fragments through shared memory by cp.async (batch 1..2, k a multiple of 128
//                              and >= 2048);
//   TensorCoreInt8LutStream    int8 tables and int8 mma.sync, streamed (any-precision 2..4 bits, batch 1..8, k a
//                              multiple of 128 and >= 2048; anyprec_gemv_i8.cu): the centroids rounded to int8 under a
//                              row scale, x as two int8 pieces under a column scale (int8_tables.h); outliers fused;
//   TensorCoreSharedLutStream  shared-memory tables, streamed (any-precision 5..8 bits, batch 1..8);
//   TensorCoreStream           2/4/16 fp16 tensor-core kernel, streamed (x pre-split; k a multiple of 256, >= 1024);
//   Dp2aStream                 2/4/16 integer dot products on int16 activations (batch 1..2);
//   Int8MmaStream              2/4/16 int8 mma.sync with exact int32 group sums (batch 1..8).
enum class GemvPath { Auto, Scalar, TensorCore, TensorCoreRegisterLut, TensorCoreRegisterLutStream, TensorCoreStream,
                      TensorCoreInt8LutStream, TensorCoreSharedLutStream, Dp2aStream, Int8MmaStream };
// The register-table kernels (any-precision 2..4 bits, x pre-split), and every tensor-core path.
constexpr bool is_register_table(GemvPath p) {
  return p == GemvPath::TensorCoreRegisterLut || p == GemvPath::TensorCoreRegisterLutStream;
}
constexpr bool is_streamed(GemvPath p) { return p == GemvPath::TensorCoreRegisterLutStream; }
constexpr bool is_tensor_core(GemvPath p) {
  return p == GemvPath::TensorCore || is_register_table(p) || p == GemvPath::TensorCoreInt8LutStream ||
         p == GemvPath::TensorCoreSharedLutStream;
}
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
// The 2/4/16 paths that read the xfrag scratch (the pre-split tensor-core paths, the int8-activation ones): where the
// runtime (packed_matmul) and the benchmarks pass it.
constexpr bool mixed24a_path_takes_xfrag(GemvPath p) {
  return p == GemvPath::TensorCore || p == GemvPath::TensorCoreStream || p == GemvPath::Dp2aStream || p == GemvPath::Int8MmaStream;
}
// The runtime (packed_matmul) feeds the tensor-core GEMVs pre-split activations (the xfrag argument below): faster than
// splitting in the loop on every shape and batch measured.
constexpr bool kPreSplitInRuntime = true;
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
// xfrag: as for anyprec_gemv, mixed24a_xfrag_bytes(k) bytes (the activations gathered through the permutation;
// GemvPath::Dp2aStream: their 16-bit integer values, mixed24a_dp_x_bytes(k, m) <= mixed24a_xfrag_bytes(k) of it;
// GemvPath::Int8MmaStream: their int8 pieces and group sums, mixed24a_mma_x_bytes(k, m)).
// xmax: as for anyprec_gemv_i8 (read by GemvPath::Dp2aStream and GemvPath::Int8MmaStream only).
void mixed24a_gemv(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s,
                   OutlierMode mode = OutlierMode::Fused, GemvPath path = GemvPath::Auto, void* xfrag = nullptr,
                   const float* xmax = nullptr);
size_t mixed24a_xfrag_bytes(int64_t k);
size_t mixed24a_dp_x_bytes(int64_t k, int m, int parts = 1);
// GemvPath::Int8MmaStream's part of the xfrag scratch (the activations' int8 pieces in its B-fragment order and each
// group's sum): at most mixed24a_xfrag_bytes(k) for 1..3 parts.
size_t mixed24a_mma_x_bytes(int64_t k, int m, int parts = 1);
// The integer-dot 2/4/16 GEMV (GemvPath::Dp2aStream, batch 1..2) or the int8 tensor-core one (GemvPath::Int8MmaStream,
// batch 3..8; the runtime groups at 3..kMixedMmaMaxBatch, where Auto runs it) over 1..3 matrices that read the same x (q / k / v, gate / up): one activation kernel and one GEMV launch,
// ys[p] [m, n_p] the outputs. Each matrix: the same k, mixed24a_dp_fits / mixed24a_mma_fits. xfrag:
// mixed24a_xfrag_bytes(k) bytes (mixed24a_dp_x_bytes(k, m, 3) / mixed24a_mma_x_bytes(k, m, 3) of it); xmax as
// mixed24a_gemv's.
void mixed24a_gemv_group(const Mixed24ADevice* ws, int parts, const float* x, int m, float* const* ys, cudaStream_t s,
                         OutlierMode mode, void* xfrag, const float* xmax = nullptr);
// The whole matrix [n, k] in fp16, original column order, outliers included (the large-batch path's first step).
void anyprec_dequant_f16(const AnyPrecDevice& w, int bits, __half* out, cudaStream_t s);
void mixed24a_dequant_f16(const Mixed24ADevice& w, __half* out, cudaStream_t s);
// Batch 9..16 (k a multiple of 256, >= 1024: mixed24a_stream_fits): the streamed 2/4/16 tensor-core GEMV with x entries
// of two fp16 columns in place of hi / lo (the work of a batch-8 call), outliers as the CSR pass; xfrag of
// mixed24a_xfrag_bytes(k). packed_matmul takes it over dequantize + cuBLAS while fused_gemm_enabled().
void mixed24a_gemv_two_tiles(const Mixed24ADevice& w, const float* x, int m, float* y, cudaStream_t s, void* xfrag);
void f32_to_f16(const float* in, __half* out, int64_t count, cudaStream_t s);

// Scratch for the large-batch path (grown on demand, reused across calls) and the cuBLAS handle.
class GemmContext {
 public:
  explicit GemmContext(cudaStream_t s);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return handle_; }
  __half* weight_scratch(size_t elements);
  __half* act_scratch(size_t elements);
  // Bumped whenever a scratch buffer is reallocated: a captured CUDA graph that baked in the old pointers is stale.
  uint64_t generation() const { return generation_; }

 private:
  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<__half> wbuf_, abuf_;
  DeviceBuffer<uint8_t> cublas_ws_;   // cuBLAS's workspace, owned here so nothing is allocated during graph capture
  uint64_t generation_ = 0;
};

// y [m, n] fp32 = x [m, k] fp32 · Wᵀ with W [n, k] fp16 already on the device: x is converted to fp16 in the
// context's scratch, then one cuBLAS GEMM (fp32 accumulation and output). The large-batch path's second step.
void dense_f16_matmul(const __half* w, int64_t n, int64_t k, const float* x, int64_t m, float* y, GemmContext& ctx);
// The same with the activations already in fp16 (xh [m, k]): no conversion kernel.
void dense_f16_matmul_h(const __half* w, int64_t n, int64_t k, const __half* xh, int64_t m, float* y, GemmContext& ctx);

// Batch 1..8 on fp16 weights (dense_gemv.cu): y [m, n] fp32 = x [m, k] · Wᵀ (+ bias[n] when bias != nullptr), x fp32
// or fp16, fp32 accumulation, launched with programmatic dependent launch. dense_gemv_fits: batch 1..kMaxGemvBatch, k a
// positive multiple of 8, W and x 16-byte aligned (else the caller takes cuBLAS). rows_per_warp 1, 2 or 4 (0 = the
// measured default for the batch). Used by the runtime's dense linears while dense_gemv_enabled() (LOWBIT_DENSE_GEMV=0
// in the environment turns it off, read once; set_dense_gemv() overrides it: bench --e2e times both in one run, and a
// captured decode graph is keyed on it).
bool dense_gemv_fits(const __half* w, int64_t n, int64_t k, int64_t m, const void* x);
void dense_f16_gemv(const __half* w, int64_t n, int64_t k, const float* x, int m, const float* bias, float* y,
                    cudaStream_t s, int rows_per_warp = 0);
void dense_f16_gemv(const __half* w, int64_t n, int64_t k, const __half* x, int m, const float* bias, float* y,
                    cudaStream_t s, int rows_per_warp = 0);
int dense_gemv_rows_per_warp(int64_t n, int m);   // the default form
bool dense_gemv_preferred(int64_t n, int64_t k, int64_t m);   // where the runtime takes it over cuBLAS (measured)
bool dense_gemv_enabled();
void set_dense_gemv(bool on);

// The fused any-precision GEMM (anyprec_gemm.cu) for batches above 8: no fp16 copy of W; activations rounded to fp16
// (as the cuBLAS path rounds them), fp32 accumulation, outliers added by the CSR pass in fp32. kind: TwoTiles = the
// GEMV kernels in their two-tile form (batch 9..16, widths 2..8: anyprec_gemv_two_tiles); Staged = the cp.async-
// staged mma.sync GEMM with register tables (any batch, widths 2..4); WgmmaWs = the warp-specialized wgmma GEMM
// (widths 2..4, compute capability 9.0 only; anyprec_wgmma_ws.cu): a decoding warpgroup writes fp16 weight tiles to
// shared memory, TMA loads the activation tiles, two warpgroups run wgmma with both operands in shared memory (at
// 256..512 tokens 1.1-1.8x faster than wgmma with the decoded weights as its register A operand, which was therefore
// dropped). Which one runs: kernel_choice.h.
// Scratch from ctx (fragments or permuted fp16 activations in act_scratch, split-k partials in weight_scratch).
enum class GemmKernel { Staged, TwoTiles, WgmmaWs };
bool anyprec_gemm_serves(int bits, GemmKernel kind);   // also false for WgmmaWs where the GPU or build cannot run it
const char* gemm_kernel_name(GemmKernel kind);
void anyprec_gemm(const AnyPrecDevice& w, int bits, const float* x, int64_t m, float* y, GemmContext& ctx, GemmKernel kind);
// Batch 9..16, widths 2..8: the register-table (2..4 bits) or shared-table (5..8) tensor-core GEMV with x entries of
// two fp16 columns in place of hi / lo (the work of a batch-8 call), outliers as the CSR pass; xfrag as for anyprec_gemv.
void anyprec_gemv_two_tiles(const AnyPrecDevice& w, int bits, const float* x, int m, float* y, cudaStream_t s, void* xfrag);
// The fused packed GEMMs above batch 8 where kernel_choice.h takes them (LOWBIT_FUSED_GEMM, core/knobs.h;
// set_fused_gemm() overrides it: bench --e2e times both in one run, and a captured decode graph is keyed on it).
bool fused_gemm_enabled();
void set_fused_gemm(bool on);
// y [m, n] += the sparse outliers' corrections (val - lut[code]) * x over each row's CSR entries (fp32 x [m, k]).
void anyprec_outliers_add(const AnyPrecDevice& w, int bits, const float* x, int64_t m, float* y, cudaStream_t s);

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
bool packed_group_runs(const std::vector<const DevicePackedWeight*>& ws, int64_t m);
void packed_matmul_group(const std::vector<const DevicePackedWeight*>& ws, const float* x, int64_t m, const std::vector<float*>& ys,
                         GemmContext& ctx, const float* x_max = nullptr);
// h [m, n / 2] = silu(x W_gateᵀ) * (x W_upᵀ) for a stacked [gate; up] weight where packed_swiglu_fuses, h_max_bits as
// anyprec_gemv_i8's hmax_bits; x_max as packed_matmul's.
void packed_matmul_swiglu(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* h, GemmContext& ctx,
                          const float* x_max, unsigned* h_max_bits);

void cublas_check(cublasStatus_t st, const char* what);
// Device-side random fills (splitmix64 of seed and index): bytes, and fp16 / fp32 values uniform in [lo, hi).
void fill_random_bytes(void* p, int64_t nbytes, uint64_t seed, cudaStream_t s = nullptr);
void fill_random_half(__half* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t s = nullptr);
void fill_random_float(float* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t s = nullptr);

}  // namespace lowbit::cuda
