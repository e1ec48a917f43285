#include "backend_cuda/dispatch/kernel_choice.h"

#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/knobs.h"
#include "formats/format_table.h"

namespace lowbit::cuda {
namespace {

// Why a candidate cannot run (a string with static storage), or kCan. The runtime asks on every linear call, so
// asking allocates nothing.
using Why = const char*;
constexpr Why kCan = nullptr;

bool is_gemv(const LinearProblem& p) { return p.m >= 1 && p.m <= kMaxGemvBatch; }
int64_t weights(const LinearProblem& p) { return p.n * p.k; }
constexpr int64_t k4096sq = 4096LL * 4096;

// "LOWBIT_X=0" for a switch knob turned off, built once per knob.
Why off(Knob k) {
  static const std::vector<std::string> reasons = [] {
    std::vector<std::string> r;
    for (const KnobInfo& info : knob_table()) r.push_back(std::string(info.name) + "=0");
    return r;
  }();
  return reasons.at(static_cast<size_t>(k)).c_str();
}
Why needs_presplit(const LinearProblem& p) {
  return p.presplit ? kCan : "reads pre-split activations (no xfrag scratch given)";
}

// ---- fp16 dense ------------------------------------------------------------------------------------------------
// Our GEMV at batch 1..2 (H200: batch 1 faster than cuBLAS on all nine Llama shapes, 4096x4096 13.7 against 16.4 us;
// batch 2 on eight of nine); from batch 4 cuBLAS's tensor cores win. Alignment of W and x is checked at launch.
Why dense_gemv_cannot(const LinearProblem& p, const GpuInfo&) {
  if (!knob_bool(Knob::DenseGemv)) return off(Knob::DenseGemv);
  if (p.m > 2) return "cuBLAS measured faster from batch 3";
  if (p.k % 8 != 0) return "needs k a multiple of 8";
  return kCan;
}
Why always(const LinearProblem&, const GpuInfo&) { return kCan; }

// ---- any-precision, batch 1..8 -----------------------------------------------------------------------------------
// The int8-table GEMV wherever it fits at 2..4 bits (faster than the register-table kernels on the 7B..70B shapes:
// 28672x8192 batch 1, 3 bits 38.0 against 50.9 us, 4 bits with two centroid pieces 70.0 against 77.7; in the decode
// step also on 4096-wide matrices, where the kernel alone was even).
Why ap_int8_cannot(const LinearProblem& p, const GpuInfo&) {
  if (Why w = needs_presplit(p)) return w;
  if (p.bits < 2 || p.bits > 4) return "widths 2..4 only";
  if (!knob_bool(Knob::Int8Tables)) return off(Knob::Int8Tables);
  if (!anyprec_i8_fits(p.n, p.k, static_cast<int>(p.m))) return "needs k a multiple of 128, >= 2048, n * k / 32 <= 2^29";
  return kCan;
}
// The streamed register-table GEMV beats the plain one at batch 1 except on rows longer than 16384 at 4 bits, and at
// batch 2 on matrices larger than 4096x4096 with rows of at most 16384 (8192x28672 4 bits batch 1: 89.0 against
// 85.4 us; 4096x4096 batch 2: 10.6 against 9.8).
Why ap_reglut_stream_cannot(const LinearProblem& p, const GpuInfo&) {
  if (Why w = needs_presplit(p)) return w;
  if (p.bits != 3 && p.bits != 4) return "widths 3..4 only";
  if (!anyprec_stream_fits(p.n, p.k, static_cast<int>(p.m))) return "needs batch 1..2, k a multiple of 128 and >= 2048";
  const bool preferred = p.m == 1 ? (p.bits == 3 || p.k <= 16384) : (p.k <= 16384 && weights(p) > k4096sq);
  if (!preferred) return "the unstreamed register-table GEMV measured faster on this shape and batch";
  return kCan;
}
Why ap_reglut_cannot(const LinearProblem& p, const GpuInfo&) {
  if (Why w = needs_presplit(p)) return w;
  if (p.bits > 4) return "widths 2..4 only";
  return kCan;
}
// The streamed shared-table GEMV at 5..8 bits: at 8 bits the fastest on every 7B and 70B shape at batch 1..8
// (12288x4096 batch 1 36.4 against 44.4 us); at 5..7 bits faster or within 1.3% on the 7B shapes, slower on the 70B
// ones (28672x8192 batch 1 111.3 against 105.1), hence matrices under 128M weights there.
Why ap_lut_stream_cannot(const LinearProblem& p, const GpuInfo&) {
  if (Why w = needs_presplit(p)) return w;
  if (p.bits < 5) return "widths 5..8 only";
  if (!knob_bool(Knob::LutStream)) return off(Knob::LutStream);
  if (!anyprec_lut_stream_fits(p.n, p.k, static_cast<int>(p.m))) return "needs k a multiple of 64 and >= 2048";
  if (p.bits != 8 && weights(p) >= 128LL * 1024 * 1024) return "at 5..7 bits measured slower on matrices of 128M+ weights";
  return kCan;
}
// The shared-table tensor-core GEMV against the CUDA cores: with pre-split x at 5..7 bits from batch 2, and at batch 1
// above 4096x4096 (5 bits 28672x8192 97.2 against 112.3 us); at 8 bits from batch 3, at batch 2 above 4096x4096, and
// at batch 1 on matrices of at least 8192x8192 with rows of at least 8192 (28672x8192 148.0 against 161.3). Without
// pre-split x, from batch 6.
Why ap_shared_lut_cannot(const LinearProblem& p, const GpuInfo&) {
  bool tc;
  if (!p.presplit) tc = p.m >= 6;
  else if (p.bits <= 7) tc = p.m >= 2 || weights(p) > k4096sq;
  else tc = p.m >= 3 || (p.m == 2 && weights(p) > k4096sq) || (weights(p) >= 8192LL * 8192 && p.k >= 8192);
  return tc ? kCan : "the CUDA-core GEMV measured faster at this batch and shape";
}

// ---- 2/4/16, batch 1..8 -----------------------------------------------------------------------------------------
Why mx_dp_cannot(const LinearProblem& p, const GpuInfo&) {
  if (Why w = needs_presplit(p)) return w;
  if (!knob_bool(Knob::Int8Tables)) return off(Knob::Int8Tables);
  if (!mixed24a_dp_fits(p.n, p.k, static_cast<int>(p.m))) return "needs batch 1..2, k a multiple of 256 and >= 1024";
  return kCan;
}
// The int8 tensor-core GEMV at batch 3..4: 0.64-0.74 of the streamed fp16 tensor-core GEMV's time on the 70B shapes;
// at 5..8 it was 0.93-1.10x of it.
Why mx_mma_cannot(const LinearProblem& p, const GpuInfo&) {
  if (Why w = needs_presplit(p)) return w;
  if (!knob_bool(Knob::MixedMma)) return off(Knob::MixedMma);
  if (!knob_bool(Knob::Int8Tables)) return off(Knob::Int8Tables);
  if (p.m < 3 || p.m > kMixedMmaMaxBatch) return "measured faster than the fp16 tensor-core GEMV at batch 3..4 only";
  if (!mixed24a_mma_fits(p.n, p.k, static_cast<int>(p.m))) return "needs k a multiple of 256 and >= 1024";
  return kCan;
}
// The streamed fp16 tensor-core GEMV from batch 3 (at batch 4 on all eight 7B..70B shapes: 8192x28672 100.9 against
// 193.8 us); at batch 1..2 the CUDA cores stay ahead (28672x8192 70.1 against 101.2).
Why mx_tc_stream_cannot(const LinearProblem& p, const GpuInfo&) {
  if (Why w = needs_presplit(p)) return w;
  if (p.m < 3) return "the CUDA-core GEMV measured faster at batch 1..2";
  if (!mixed24a_stream_fits(p.n, p.k, static_cast<int>(p.m))) return "needs k a multiple of 256 and >= 1024";
  return kCan;
}
// The unstreamed tensor-core GEMV: with pre-split x from batch 4 on matrices above 4096x4096 (11008x4096 batch 4:
// 35.9 against 41.9 us); without, from batch 5.
Why mx_tc_cannot(const LinearProblem& p, const GpuInfo&) {
  const bool tc = p.presplit ? p.m >= 4 && weights(p) > k4096sq : p.m >= 5;
  return tc ? kCan : "the CUDA-core GEMV measured faster at this batch and shape";
}

// ---- above batch 8 ------------------------------------------------------------------------------------------------
Why ap_two_tiles_cannot(const LinearProblem& p, const GpuInfo&) {
  if (!knob_bool(Knob::FusedGemm)) return off(Knob::FusedGemm);
  if (p.m > 2 * kMaxGemvBatch) return "batch 9..16 only";
  return kCan;
}
// The fused GEMMs against dequantize + cuBLAS: the warp-specialized wgmma GEMM faster at 65..512 tokens on all seven
// 7B..70B shapes at 3 bits (28672x8192, 512 tokens: 407.9 against 479.5 us) and within 3% at 4 bits; at 2048 tokens
// dequantize + cuBLAS wins. The staged mma.sync GEMM below 65 (batch 64, 28672x8192 3 bits: 126.3 against 276.3 us),
// and on GPUs without wgmma to 128 tokens where it measured faster (3 bits, or rows longer than 4096).
Why ap_wgmma_ws_cannot(const LinearProblem& p, const GpuInfo& gpu) {
  if (!knob_bool(Knob::FusedGemm)) return off(Knob::FusedGemm);
  if (p.bits < 2 || p.bits > 4) return "widths 2..4 only";
  if (!gpu.wgmma()) return "needs compute capability 9.0 and the sm_90a kernels";
  if (p.m < kWgmmaMinBatch) return "the staged GEMM measured faster below batch 65";
  if (p.m > kWgmmaMaxBatch) return "dequantize + cuBLAS measured faster above 512 tokens";
  return kCan;
}
Why ap_staged_cannot(const LinearProblem& p, const GpuInfo&) {
  if (!knob_bool(Knob::FusedGemm)) return off(Knob::FusedGemm);
  if (p.bits < 2 || p.bits > 4) return "widths 2..4 only";
  if (!(p.m <= 64 || (p.m <= 128 && (p.bits <= 3 || p.k > 4096))))
    return "dequantize + cuBLAS measured faster at this batch, width and shape";
  return kCan;
}
// The uniform mixed-input GEMM against dequantize + cuBLAS (which writes and reads an fp16 copy per call), w4 g128 on
// the six 7B / 70B shapes (H200): 1.1-3.6x faster at 16..1024 tokens (28672x8192 at 64 tokens 135.6 against 493.2 us),
// 1.12-1.23x at 2048, and from 0.97x (8192x28672: 3697.7 against 3580.9 us) to 1.09x at 4096; w8 g128 1.19-3.4x on
// 4096^2 / 8192^2 / 28672x8192 at 16..2048 tokens. Taken at every batch above 8.
Why uniform_fused_cannot(const LinearProblem& p, const GpuInfo& gpu) {
  if (!knob_bool(Knob::FusedGemm)) return off(Knob::FusedGemm);
  if (!gpu.wgmma() || !gpu.cutlass_kernels) return "needs compute capability 9.0 and the CUTLASS sm_90a kernels";
  if (p.bits != 4 && p.bits != 8) return "4- and 8-bit codes only (CUTLASS's narrow types)";
  if (p.act_order) return "act-order weights (g_idx): groups are not contiguous";
  if (!uniform_fused_fits(p.bits, p.n, p.k, p.group, p.act_order))
    return "needs groups of a multiple of 64 columns or whole rows, n a multiple of 8, k of 32";
  return kCan;
}
Why mx_two_tiles_cannot(const LinearProblem& p, const GpuInfo&) {
  if (!knob_bool(Knob::FusedGemm)) return off(Knob::FusedGemm);
  if (p.m > 2 * kMaxGemvBatch) return "batch 9..16 only";
  if (!mixed24a_stream_fits(p.n, p.k, kMaxGemvBatch)) return "needs k a multiple of 256 and >= 1024";
  return kCan;
}

constexpr KernelCandidate kDense[] = {{Kernel::DenseGemv, &dense_gemv_cannot}, {Kernel::Cublas, &always}};
constexpr KernelCandidate kAnyPrecGemv[] = {
    {Kernel::AnyPrecInt8Stream, &ap_int8_cannot},       {Kernel::AnyPrecRegLutStream, &ap_reglut_stream_cannot},
    {Kernel::AnyPrecRegLut, &ap_reglut_cannot},         {Kernel::AnyPrecSharedLutStream, &ap_lut_stream_cannot},
    {Kernel::AnyPrecSharedLut, &ap_shared_lut_cannot},  {Kernel::AnyPrecCudaCores, &always},
};
constexpr KernelCandidate kAnyPrecGemm[] = {
    {Kernel::AnyPrecTwoTiles, &ap_two_tiles_cannot},
    {Kernel::AnyPrecWgmmaWs, &ap_wgmma_ws_cannot},
    {Kernel::AnyPrecStaged, &ap_staged_cannot},
    {Kernel::DequantCublas, &always},
};
constexpr KernelCandidate kMixed24aGemv[] = {
    {Kernel::Mixed24aDp, &mx_dp_cannot},          {Kernel::Mixed24aInt8Mma, &mx_mma_cannot},
    {Kernel::Mixed24aTcStream, &mx_tc_stream_cannot}, {Kernel::Mixed24aTc, &mx_tc_cannot},
    {Kernel::Mixed24aCudaCores, &always},
};
constexpr KernelCandidate kMixed24aGemm[] = {{Kernel::Mixed24aTwoTiles, &mx_two_tiles_cannot}, {Kernel::DequantCublas, &always}};
constexpr KernelCandidate kUniformGemv[] = {{Kernel::UniformGemv, &always}};
constexpr KernelCandidate kUniformGemm[] = {{Kernel::UniformFused, &uniform_fused_cannot}, {Kernel::DequantCublas, &always}};
constexpr KernelCandidate kQuikGemv[] = {{Kernel::QuikGemv, &always}};
constexpr KernelCandidate kQuikGemm[] = {{Kernel::QuikGemm, &always}};

}  // namespace

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::DenseGemv: return "fp16 GEMV";
    case Kernel::Cublas: return "cuBLAS fp16";
    case Kernel::AnyPrecInt8Stream: return "anyprec int8-table GEMV (int8 mma, streamed)";
    case Kernel::AnyPrecRegLutStream: return "anyprec register-table GEMV (streamed)";
    case Kernel::AnyPrecRegLut: return "anyprec register-table GEMV";
    case Kernel::AnyPrecSharedLutStream: return "anyprec shared-table GEMV (streamed)";
    case Kernel::AnyPrecSharedLut: return "anyprec shared-table tensor-core GEMV";
    case Kernel::AnyPrecCudaCores: return "anyprec CUDA-core GEMV";
    case Kernel::Mixed24aDp: return "2/4/16 integer-dot GEMV";
    case Kernel::Mixed24aInt8Mma: return "2/4/16 int8 tensor-core GEMV";
    case Kernel::Mixed24aTcStream: return "2/4/16 fp16 tensor-core GEMV (streamed)";
    case Kernel::Mixed24aTc: return "2/4/16 fp16 tensor-core GEMV";
    case Kernel::Mixed24aCudaCores: return "2/4/16 CUDA-core GEMV";
    case Kernel::UniformGemv: return "uniform GEMV (tensor cores or CUDA cores over the stored codes)";
    case Kernel::UniformFused: return "uniform mixed-input wgmma GEMM (CUTLASS)";
    case Kernel::QuikGemv: return "QUIK GEMV (int8 dp4a / FP8 integers / A16 fp32)";
    case Kernel::QuikGemm: return "QUIK tensor-core GEMM (cuBLAS int8 / cuBLASLt FP8 / fp16) + outlier GEMM + epilogue";
    case Kernel::AnyPrecTwoTiles: return "anyprec two-tile GEMV";
    case Kernel::AnyPrecWgmmaWs: return "anyprec warp-specialized wgmma GEMM";
    case Kernel::AnyPrecStaged: return "anyprec staged mma.sync GEMM";
    case Kernel::Mixed24aTwoTiles: return "2/4/16 two-tile GEMV";
    case Kernel::DequantCublas: return "dequantize + cuBLAS fp16";
  }
  return "(invalid kernel)";
}

std::span<const KernelCandidate> kernel_candidates(const LinearProblem& p) {
  LOWBIT_CHECK(p.m >= 1 && p.n >= 1 && p.k >= 1, "kernel choice: bad problem ", p.n, "x", p.k, " at batch ", p.m);
  if (!p.format) return kDense;
  switch (*p.format) {
    case FormatId::AnyPrec:
      if (is_gemv(p)) return kAnyPrecGemv;
      return kAnyPrecGemm;
    case FormatId::Mixed24A:
      if (is_gemv(p)) return kMixed24aGemv;
      return kMixed24aGemm;
    case FormatId::Uniform:
      if (is_gemv(p)) return kUniformGemv;
      return kUniformGemm;
    case FormatId::Quik:
      if (is_gemv(p)) return kQuikGemv;
      return kQuikGemm;
    case FormatId::Mixed24:
      break;
  }
  fail("kernel choice: the ", format_name(*p.format), " format has no packed GPU kernels (",
       gpu_support_name(packed_format(*p.format).gpu), ")");
}

namespace {
// The first candidate that can run; each one passed over goes to `rejected` with its reason, when given.
Kernel first_runnable(const LinearProblem& p, const GpuInfo& gpu, std::vector<std::pair<Kernel, std::string>>* rejected) {
  for (const KernelCandidate& k : kernel_candidates(p)) {
    const char* why = k.cannot_run(p, gpu);
    if (why == nullptr) return k.kernel;
    if (rejected != nullptr) rejected->emplace_back(k.kernel, why);
  }
  fail("kernel choice: no kernel runs ", p.n, "x", p.k, " at batch ", p.m, " (the last candidate must always run)");
}
}  // namespace

Kernel pick_kernel(const LinearProblem& p, const GpuInfo& gpu) { return first_runnable(p, gpu, nullptr); }

KernelChoice choose_kernel(const LinearProblem& p, const GpuInfo& gpu) {
  KernelChoice c{Kernel::DequantCublas, {}};
  c.kernel = first_runnable(p, gpu, &c.rejected);
  return c;
}

std::string kernel_choice_table(const GpuInfo& gpu, bool reasons) {
  // The shapes of Llama-2-7B / Llama-3-8B / Llama-2-70B linears, a small model's (SmolLM2-135M: 576 wide) and an
  // odd one; the batches where a rule changes.
  const std::pair<int64_t, int64_t> shapes[] = {{576, 576},     {1536, 576},    {4096, 4096},  {12288, 4096},
                                                {11008, 4096},  {4096, 11008},  {28672, 8192}, {8192, 28672},
                                                {1000, 1000}};
  const int64_t batches[] = {1, 2, 3, 4, 5, 6, 8, 9, 16, 17, 64, 65, 128, 129, 512, 513, 2048};
  std::ostringstream out;
  out << "GPU cc " << gpu.cc_major << "." << gpu.cc_minor << (gpu.wgmma() ? " (wgmma)" : "") << "\n";
  auto row = [&](const char* fmt, int bits, int64_t n, int64_t k, int64_t m, const LinearProblem& p) {
    const KernelChoice c = choose_kernel(p, gpu);
    out << fmt;
    if (bits > 0) out << " " << bits << "b";
    out << " " << n << "x" << k << " m" << m << ": " << kernel_name(c.kernel) << "\n";
    if (reasons)
      for (const auto& [k2, why] : c.rejected) out << "    not " << kernel_name(k2) << ": " << why << "\n";
  };
  for (const auto& [n, k] : shapes)
    for (int64_t m : batches) {
      row("fp16", 0, n, k, m, {std::nullopt, n, k, m, 0, true});
      for (int bits = 2; bits <= 8; ++bits) row("anyprec", bits, n, k, m, {FormatId::AnyPrec, n, k, m, bits, true});
      row("mixed24a", 0, n, k, m, {FormatId::Mixed24A, n, k, m, 0, true});
      for (int bits : {3, 4, 8}) row("uniform g128", bits, n, k, m, {FormatId::Uniform, n, k, m, bits, true, 128});
      row("uniform act-order", 4, n, k, m, {FormatId::Uniform, n, k, m, 4, true, 128, true});
      row("quik", 0, n, k, m, {FormatId::Quik, n, k, m, 0, true});
    }
  return out.str();
}

}  // namespace lowbit::cuda
