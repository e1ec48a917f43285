// Which kernel runs a linear layer on the GPU: the one module that decides (STYLE habit 13).
//
// For a linear of a given weight format (fp16 dense or a packed FormatId), width, shape [n, k], batch m and GPU,
// `kernel_candidates` lists the kernels that could run it, fastest first as measured by `lowbit bench --kernels`
// (docs/PERF.md has the figures behind each rule). Each candidate's `cannot_run` returns why it cannot (a shape it
// does not serve, a width it does not read, a knob that turns it off, or "measured slower here"); `choose_kernel`
// takes the first that can and keeps the reasons of the ones before it. `lowbit bench --kernels` prints both, and
// tests/test_kernel_choice.cpp pins the whole table for an H100/H200 and for a GPU without Hopper's wgmma.
//
// This file is plain C++ (no CUDA headers): it is built into the core library, so the choice is tested in CI on a
// machine without a GPU. The launchers (backend_cuda/dispatch/packed.cu) switch over the chosen Kernel.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/format_id.h"

namespace lowbit::cuda {

inline constexpr int kMaxGemvBatch = 8;       // above this, the fused GEMMs or dequantize + cuBLAS
inline constexpr int kMixedMmaMaxBatch = 4;   // the 2/4/16 int8 tensor-core GEMV's batches: 3..4
inline constexpr int64_t kWgmmaMinBatch = 65; // the warp-specialized wgmma GEMM from this batch (staged below)
inline constexpr int64_t kWgmmaMaxBatch = 512;

// Shapes each kernel serves (its own limits, not preferences).
// The streamed any-precision GEMVs' 32-bit plane offsets (up to 4 planes of n * k / 32 words).
constexpr bool anyprec_offsets_fit(int64_t n, int64_t k) { return n * ((k + 31) / 32) <= (int64_t{1} << 29); }
// The int8-table GEMV (2..4 bits): k a multiple of 128 and >= 2048, batch 1..8.
constexpr bool anyprec_i8_fits(int64_t n, int64_t k, int m) {
  return n >= 1 && k % 128 == 0 && k >= 2048 && anyprec_offsets_fit(n, k) && m >= 1 && m <= kMaxGemvBatch;
}
// The streamed register-table GEMV (3..4 bits): k % 128 == 0, k >= 2048, batch 1..2.
constexpr bool anyprec_stream_fits(int64_t n, int64_t k, int m) { return n >= 1 && k % 128 == 0 && k >= 2048 && m <= 2; }
// The streamed shared-table GEMV (5..8 bits): k a multiple of 64 and >= 2048, batch 1..8.
constexpr bool anyprec_lut_stream_fits(int64_t n, int64_t k, int m) {
  return n >= 1 && k % 64 == 0 && k >= 2048 && m >= 1 && m <= kMaxGemvBatch;
}
// The streamed 2/4/16 tensor-core GEMV: k % 256 == 0, k >= 1024, batch 1..8.
constexpr bool mixed24a_stream_fits(int64_t n, int64_t k, int m) { return n >= 1 && k % 256 == 0 && k >= 1024 && m <= 8; }
// The 2/4/16 integer-dot GEMV: k % 256 == 0, k >= 1024, batch 1..2, n * k / 64 < 2^31 (32-bit element offsets).
constexpr bool mixed24a_dp_fits(int64_t n, int64_t k, int m) {
  return n >= 1 && k % 256 == 0 && k >= 1024 && m >= 1 && m <= 2 && n * (k / 64) < (int64_t{1} << 31);
}
// The 2/4/16 int8 tensor-core GEMV: as the integer-dot one at batch 1..8.
constexpr bool mixed24a_mma_fits(int64_t n, int64_t k, int m) {
  return n >= 1 && k % 256 == 0 && k >= 1024 && m >= 1 && m <= 8 && n * (k / 64) < (int64_t{1} << 31);
}
// The uniform mixed-input GEMM (uniform_fused.h): 4- or 8-bit codes (CUTLASS's narrow types), groups contiguous (no
// g_idx) of a multiple of 64 columns (its k tile) or the whole row (group 0 or k), n a multiple of 8 and k of 32 (the
// TMA's 16-byte rows of codes and MN-major scales).
constexpr bool uniform_fused_fits(int bits, int64_t n, int64_t k, int64_t group, bool act_order) {
  return (bits == 4 || bits == 8) && !act_order && (group == 0 || group >= k || group % 64 == 0) && n >= 8 &&
         n % 8 == 0 && k >= 32 && k % 32 == 0 && n <= INT32_MAX && k <= INT32_MAX;
}

enum class Kernel : uint8_t {
  // fp16 dense weights.
  DenseGemv,                // backend_cuda/dense/dense_gemv.cu, batch 1..8
  Cublas,                   // cuBLAS fp16 GEMM (fp32 accumulation)
  // any-precision GEMVs, batch 1..8 (backend_cuda/anyprec/).
  AnyPrecInt8Stream,        // int8 tables, int8 mma.sync, cp.async-streamed (anyprec_gemv_i8.cu), 2..4 bits
  AnyPrecRegLutStream,      // register tables (PRMT), fp16 mma.sync, streamed, 3..4 bits, batch 1..2
  AnyPrecRegLut,            // register tables, fp16 mma.sync, 2..4 bits
  AnyPrecSharedLutStream,   // shared-memory tables, fp16 mma.sync, streamed, 5..8 bits
  AnyPrecSharedLut,         // shared-memory tables, fp16 mma.sync, any width
  AnyPrecCudaCores,         // shared-memory tables, CUDA-core FMAs, any width
  // 2/4/16 GEMVs, batch 1..8 (backend_cuda/mixed24a/).
  Mixed24aDp,               // integer dot products (dp2a/dp4a) on int16 activations, batch 1..2
  Mixed24aInt8Mma,          // int8 mma.sync, exact int32 group sums
  Mixed24aTcStream,         // fp16 mma.sync, streamed
  Mixed24aTc,               // fp16 mma.sync
  Mixed24aCudaCores,        // CUDA-core FMAs
  // uniform (RTN / GPTQ) GEMV, batch 1..8 (backend_cuda/uniform/).
  UniformGemv,              // CUDA-core FMAs over the stored bit streams, every width 2..8
  UniformFused,             // mixed-input wgmma GEMM (CUTLASS, Hopper) over the stored 4- / 8-bit codes, batch > 8
  // QUIK, integer activations (backend_cuda/quik/).
  QuikGemv,                 // per-token activations (int8 dp4a, FP8 integers, or fp32 for A16), batch 1..8
  QuikGemm,                 // tensor-core library GEMM (int8 / FP8 / fp16), outliers by a fp16 GEMM, epilogue, batch > 8
  // Above batch 8.
  AnyPrecTwoTiles,          // the tensor-core GEMVs over two batch tiles, batch 9..16
  AnyPrecWgmmaWs,           // warp-specialized wgmma GEMM (Hopper), 2..4 bits
  AnyPrecStaged,            // cp.async-staged mma.sync GEMM with register tables, 2..4 bits
  Mixed24aTwoTiles,         // the streamed 2/4/16 GEMV over two batch tiles, batch 9..16
  DequantCublas,            // dequantize to fp16 in scratch, then cuBLAS
};
const char* kernel_name(Kernel k);

// The GPU the choice is for (the runtime asks the device; tests pass fixed ones).
struct GpuInfo {
  int cc_major = 9, cc_minor = 0;
  int sms = 132;
  bool sm90a_kernels = true;   // this build holds the sm_90a (wgmma) kernels
  bool cutlass_kernels = true; // ... and the CUTLASS ones (built where CMake found its headers)
  bool wgmma() const { return cc_major == 9 && cc_minor == 0 && sm90a_kernels; }
};

struct LinearProblem {
  std::optional<FormatId> format;   // nullopt: fp16 dense weights
  int64_t n = 0, k = 0, m = 0;      // weight [n, k], batch m
  int bits = 0;                     // any-precision: the width read (a served width); uniform: the code width
  bool presplit = true;             // the caller gives the xfrag scratch (the runtime always does)
  int64_t group = 0;                // uniform: columns per group (0: the whole row)
  bool act_order = false;           // uniform: a g_idx gives each column's group
};

struct KernelCandidate {
  Kernel kernel;
  // nullptr when the kernel can run the problem, else why not (one line, static storage).
  const char* (*cannot_run)(const LinearProblem& p, const GpuInfo& gpu);
};

struct KernelChoice {
  Kernel kernel;
  std::vector<std::pair<Kernel, std::string>> rejected;   // the candidates before it, with their reasons
};

// The ordered candidates for a problem (its format and whether m is a GEMV batch). Throws lowbit::Error for a format
// without packed GPU kernels (formats/format_table.h GpuSupport).
std::span<const KernelCandidate> kernel_candidates(const LinearProblem& p);
KernelChoice choose_kernel(const LinearProblem& p, const GpuInfo& gpu);
// The same choice without the reasons: what the runtime asks on every linear call (allocates nothing).
Kernel pick_kernel(const LinearProblem& p, const GpuInfo& gpu);
// The whole table for a GPU: one line per (format, width, shape, batch) with the choice and, when `reasons`, why
// each earlier candidate was passed over. Pinned by tests/test_kernel_choice.cpp; printed by `lowbit bench --kernels`.
std::string kernel_choice_table(const GpuInfo& gpu, bool reasons);

}  // namespace lowbit::cuda
