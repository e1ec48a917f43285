// QUIK linears on the GPU (Ashkboos et al.; formats/quik/layout.h has the arithmetic), every activation form the
// format stores: integer (abits 4 / 8, asymmetric per token), FP8-E4M3 (symmetric per token, W4) and unquantized (A16):
//   1. per-token activation quantization of each row's base columns by quik_quantize_activations' own fp32 operations,
//      into the form the next step reads (int8 codes; FP8 as e4m3 bytes for the tensor cores or as the reference's
//      integers, value x 512, for the GEMV; A16 as fp32 for the GEMV, fp16 for the GEMM), rows padded to kbp with
//      zeros; the outlier columns' activations as fp16 beside them; each row's (sa, mn)
//   2. the base product: a GEMV at batch 1..8 (integer sums exact: int32 for int8, int64 for FP8; fp32 for A16); above
//      it, on compute capability 9.0 from 256 tokens, the fused CUTLASS GEMM (quik_fused.h: int8 -> exact int32,
//      e4m3 -> fp32) with step 4 in its epilogue; elsewhere (and for A16) one library GEMM on the tensor cores (cuBLAS
//      int8 -> exact int32; cuBLASLt FP8 e4m3 -> fp32; cuBLAS fp16 -> fp32 for A16). 4-bit codes are widened per call
//      (in registers by the fused GEMM at A8, into scratch otherwise): no second copy of a weight is kept
//   3. the outlier columns: inside the GEMV; above it a fp16 cuBLAS GEMM [m, no] x [no, n]: into y before the library
//      GEMMs' epilogue, added into y after the fused GEMM (or, for comparison, a per-output loop in the library form's
//      epilogue: OutlierPass)
//   4. the epilogue: y = sa sw acc + (H sa + mn) wReduced + outliers (integer), sa sw acc + outliers (FP8), sw acc +
//      outliers (A16); in fp32 on the accumulators in registers (fused), or as one pass over y in fp64 from the stored
//      sums (the library GEMMs)
// The CPU twin is quik_gemm_packed_ref (int64 sums, fp64 epilogue): tests/test_cuda_kernels.cpp checks the integer
// sums bit for bit where they are exact and y within named budgets.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/dense/dense.h"
#include "backend_cuda/dispatch/device_weight.h"
#include "backend_cuda/quik/quik_act_layout.h"

namespace lowbit::cuda {

// How the GEMM form adds the outlier columns' product: a fp16 cuBLAS GEMM into y before the epilogue (the runtime's
// form), or a loop over the outliers in each output's epilogue thread (timed beside it by bench --kernels).
enum class OutlierPass { Gemm, Epilogue };

// Scratch bytes the QUIK forms take from the context's activation scratch for m rows (quantized activations, row
// parameters, outlier activations) and from its weight scratch above batch 8 (sums, widened codes).
size_t quik_act_scratch_bytes(const QuikDevice& w, int64_t m);
size_t quik_gemm_scratch_bytes(const QuikDevice& w, int64_t m);

// y [m, n] fp32 = the QUIK product of x [m, k] fp32 (original column order) for any m >= 1: the GEMV at m <= 8, the
// GEMM above. acc_out (tests, optional): the integer sums [m, n] of the exact forms (integer activations at any m, FP8
// in the GEMV); left untouched by the others.
void quik_matmul(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out = nullptr);
// The two forms, for tests and benchmarks (quik_matmul picks by m).
void quik_gemv(const QuikDevice& w, const float* x, int m, float* y, GemmContext& ctx, int64_t* acc_out = nullptr);
void quik_gemm(const QuikDevice& w, const float* x, int64_t m, float* y, GemmContext& ctx, int64_t* acc_out = nullptr,
               OutlierPass outliers = OutlierPass::Gemm);
// Activations quantized by the kernel that produces them (quik_producers.cu), for every QUIK weight that quantizes its
// input alike (quik_same_activations: one quantization serves q / k / v, another gate / up): the RMSNorm writes y as
// rmsnorm() does (the same bits) and SwiGLU out as swiglu_rows() (out may be g when ld == width), and both write the row quantized for w into acts
// (quik_act_scratch_bytes(w, m) bytes) exactly as quik_matmul's activation step would from that output;
// quik_matmul_quantized then runs w's product from acts. quik_producer_quantizes: rows of `width` columns (a multiple of
// 4, at most 32768) for a weight of that input width (SwiGLU). The attention output's row is written by one block per
// head, so attention quantizes it through a QuikRowSink (below).
bool quik_producer_quantizes(const QuikDevice& w, int64_t width);
// The RMSNorm's form also needs the row in rmsnorm()'s float4 kernel (rmsnorm_writes_xmax: up to 16384 columns), whose
// arithmetic it repeats.
bool quik_rmsnorm_quantizes(const QuikDevice& w, int dim);
// acts_bytes: the buffer's size (refused below quik_act_scratch_bytes(w, m)).
void quik_rmsnorm_quantize(const QuikDevice& w, float* x, const float* delta, const float* norm_w, float* y, int m, int dim,
                           float eps, void* acts, size_t acts_bytes, cudaStream_t s);
void quik_swiglu_quantize(const QuikDevice& w, const float* g, const float* u, int64_t ld, float* out, int m, int64_t width,
                          void* acts, size_t acts_bytes, cudaStream_t s);
void quik_matmul_quantized(const QuikDevice& w, const void* acts, int64_t m, float* y, GemmContext& ctx,
                           int64_t* acc_out = nullptr);
// The attention output quantized inside the attention kernels (gpu_ops.h: attention, prefill_attention take a sink):
// a row of heads x hd columns is written by one block per head, so no block holds a row. Each block, once its share of
// a group of rows is written (a query tile of prefill_attention, a row of attention), counts itself in done[group]
// (one thread's acquire-release increment); the last of the group's `heads` blocks reads the group's rows back through
// L2 and quantizes them (the block per row for one-row groups, a warp per row for query tiles), by quik_act.cuh's
// arithmetic, into acts: the bytes quik_matmul's activation step writes from those rows (tested). The o projection then
// runs quik_matmul_quantized(w, acts), without its own pass over [m, heads x hd] fp32 (off by default: measured slower,
// below). The last block resets its count (the increment wraps at heads), so the counts stay zero between launches and
// a captured graph replays.
struct QuikRowSink {
  QuikDevice w;
  quik_act::ActScratch s{};
  quik_act::ActForm form = quik_act::ActForm::Int8;
  unsigned* done = nullptr;   // nullptr: no sink (the kernels write out alone)
  int64_t groups = 0;         // counts in done, each zero when unused
};
// Whether attention can quantize rows of `width` columns for w: quik_producer_quantizes, and the outlier map fits the
// 4 KB of shared memory the attention kernels lend it (w.k <= 16384).
bool quik_attention_quantizes(const QuikDevice& w, int64_t width);
// The sink for m rows of attention output quantized for w into acts (acts_bytes >= quik_act_scratch_bytes(w, m); the
// GEMM's padding rows zeroed here); done: `groups` >= m counts, zeroed when allocated.
QuikRowSink quik_row_sink(const QuikDevice& w, int64_t m, void* acts, size_t acts_bytes, unsigned* done, int64_t groups,
                          cudaStream_t s);
// Whether the GPU forward has attention quantize the o projection's input (with the producers' quantization on) for a
// step of `rows` rows, by the mode LOWBIT_QUIK_ATTENTION_ACT sets (read once; set_quik_attention_act_mode() overrides
// it: bench --e2e and the tests compare them): 0, the default, never; -1 in decode-shaped steps (rows <=
// kQuikAttentionActRows, a row per group); 1 at every row count (a 64-row query tile per group in prefill). Both were
// measured slower than the o projection's own pass on the H200 (docs/PERF.md): the group's quantization runs on the 4
// warps of one block, latency-bound, where the separate kernel spreads the rows over the whole GPU.
inline constexpr int64_t kQuikAttentionActRows = 8;
bool quik_attention_act_at(int64_t rows);
int quik_attention_act_mode();
void set_quik_attention_act_mode(int mode);
// Same input width, activation bits and form, and outlier columns.
bool quik_same_activations(const DevicePackedWeight& a, const DevicePackedWeight& b);
// Whether the GPU forward quantizes QUIK activations in their producers: LOWBIT_QUIK_PRODUCER_ACT (default on, read
// once); set_quik_producer_act() overrides it (bench --e2e and the tests compare both).
bool quik_producer_act_enabled();
void set_quik_producer_act(bool on);

// Whether quik_matmul / quik_gemm run the fused CUTLASS GEMM for this weight at m tokens with OutlierPass::Gemm and a
// 16-byte aligned y: built with CUTLASS, a compute capability 9.0 GPU, an integer or FP8 form, n a multiple of 4, at
// least one base column, and m from 256 (LOWBIT_QUIK_FUSED: -1 that rule, 0 never, 1 from batch 9).
bool quik_gemm_fused(const QuikDevice& w, int64_t m);

}  // namespace lowbit::cuda
