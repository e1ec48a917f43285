// packed_matmul and the kernel-choice glue: the chosen Kernel (kernel_choice.h) launched on the packed weight.
#include "backend_cuda/dispatch/packed.h"

#include <algorithm>

#include "core/knobs.h"
#include "formats/format_table.h"

namespace lowbit::cuda {

namespace {
int served_width(const DevicePackedWeight& w, int bits) {   // anyprec: 0 = the widest
  return bits == 0 && w.format() == FormatId::AnyPrec ? static_cast<int>(31 - __builtin_clz(w.served_widths())) : bits;
}
LinearProblem problem_of(const DevicePackedWeight& w, int bits, int64_t m) {
  if (w.format() == FormatId::Uniform) {
    const UniformDevice u = w.uniform();
    return {w.format(), w.n(), w.k(), m, u.bits, kPreSplitInRuntime, u.gs, u.g_idx != nullptr};
  }
  return {w.format(), w.n(), w.k(), m, served_width(w, bits), kPreSplitInRuntime};
}
}  // namespace

const GpuInfo& runtime_gpu() {
  static const GpuInfo g = [] {
    GpuInfo i;
    int dev = 0;
    LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&i.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&i.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    i.sms = device_sm_count();
    i.sm90a_kernels = true;   // the library always carries its sm_90a build (CMakeLists.txt: lowbit_cuda_sm90a)
#if LOWBIT_WITH_CUTLASS
    i.cutlass_kernels = true;
#else
    i.cutlass_kernels = false;
#endif
    return i;
  }();
  return g;
}

GemvPath gemv_path_of(Kernel k) {
  switch (k) {
    case Kernel::AnyPrecInt8Stream: return GemvPath::TensorCoreInt8LutStream;
    case Kernel::AnyPrecRegLutStream: return GemvPath::TensorCoreRegisterLutStream;
    case Kernel::AnyPrecRegLut: return GemvPath::TensorCoreRegisterLut;
    case Kernel::AnyPrecSharedLutStream: return GemvPath::TensorCoreSharedLutStream;
    case Kernel::AnyPrecSharedLut: return GemvPath::TensorCore;
    case Kernel::AnyPrecCudaCores: return GemvPath::Scalar;
    case Kernel::Mixed24aDp: return GemvPath::Dp2aStream;
    case Kernel::Mixed24aInt8Mma: return GemvPath::Int8MmaStream;
    case Kernel::Mixed24aTcStream: return GemvPath::TensorCoreStream;
    case Kernel::Mixed24aTc: return GemvPath::TensorCore;
    case Kernel::Mixed24aCudaCores: return GemvPath::Scalar;
    case Kernel::UniformGemv:
    case Kernel::UniformFused:
    case Kernel::QuikGemv:
    case Kernel::QuikGemm:
    case Kernel::DenseGemv:
    case Kernel::Cublas:
    case Kernel::AnyPrecTwoTiles:
    case Kernel::AnyPrecWgmmaWs:
    case Kernel::AnyPrecStaged:
    case Kernel::Mixed24aTwoTiles:
    case Kernel::DequantCublas: break;
  }
  return GemvPath::Auto;
}

GemvPath anyprec_auto_path(int64_t n, int64_t k, int m, int bits, bool presplit) {
  return gemv_path_of(pick_kernel({FormatId::AnyPrec, n, k, m, bits, presplit}, runtime_gpu()));
}

GemvPath mixed24a_auto_path(int64_t n, int64_t k, int m, bool presplit) {
  return gemv_path_of(pick_kernel({FormatId::Mixed24A, n, k, m, 0, presplit}, runtime_gpu()));
}

bool packed_runs_int8_gemv(const DevicePackedWeight& w, int bits, int64_t m) {
  if (m < 1 || m > kMaxGemvBatch) return false;
  const Kernel k = pick_kernel(problem_of(w, bits, m), runtime_gpu());
  return k == Kernel::AnyPrecInt8Stream || k == Kernel::Mixed24aDp || k == Kernel::Mixed24aInt8Mma;
}

// 2..3 bits only: at 4 bits the epilogue measured slower (H200, Llama-2-7B 4-bit: batch 1 325.3 against 327.0 tok/s,
// batch 8 2,238.5 against 2,253.8, same run).
bool packed_swiglu_fuses(const DevicePackedWeight& w, int bits, int64_t m) {
  return fold_swiglu_enabled() && w.format() == FormatId::AnyPrec && w.n() % 32 == 0 && served_width(w, bits) <= 3 &&
         packed_runs_int8_gemv(w, bits, m);
}

void packed_matmul_swiglu(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* h, GemmContext& ctx,
                          const float* x_max, unsigned* h_max_bits) {
  LOWBIT_CHECK(packed_swiglu_fuses(w, bits, m) && h_max_bits != nullptr, "packed_matmul_swiglu: not served for ", w.n(), "x", w.k(),
               " at batch ", m, " (packed_swiglu_fuses)");
  void* xfrag = ctx.act_scratch((anyprec_xfrag_bytes(w.k()) + 1) / 2);
  anyprec_gemv_i8(w.anyprec(), served_width(w, bits), x, static_cast<int>(m), h, ctx.stream(), true, xfrag, x_max, h_max_bits);
}

bool packed_group_runs(const std::vector<const DevicePackedWeight*>& ws, int64_t m) {
  if (!group_gemv_enabled() || ws.size() < 2 || ws.size() > 3 || m < 1 || m > kMaxGemvBatch) return false;
  for (const DevicePackedWeight* w : ws)
    if (w == nullptr || w->format() != FormatId::Mixed24A || w->k() != ws[0]->k() || !packed_runs_int8_gemv(*w, 0, m))
      return false;
  return true;
}

void packed_matmul_group(const std::vector<const DevicePackedWeight*>& ws, const float* x, int64_t m, const std::vector<float*>& ys,
                         GemmContext& ctx, const float* x_max) {
  LOWBIT_CHECK(packed_group_runs(ws, m) && ys.size() == ws.size(), "packed_matmul_group: not served for these ", ws.size(),
               " weights at batch ", m, " (packed_group_runs)");
  std::vector<Mixed24ADevice> d;
  for (const DevicePackedWeight* w : ws) d.push_back(w->mixed24a());
  void* xfrag = ctx.act_scratch((mixed24a_xfrag_bytes(ws[0]->k()) + 1) / 2);
  mixed24a_gemv_group(d.data(), static_cast<int>(d.size()), x, static_cast<int>(m), ys.data(), ctx.stream(), OutlierMode::Fused,
                      xfrag, x_max);
}

bool packed_mixed_serves(const DevicePackedWeight& w, int64_t m) {
  return w.format() == FormatId::AnyPrec && m >= 1 && m <= kMaxGemvBatch;
}

void packed_matmul_mixed(const DevicePackedWeight& w, int max_bits, const int32_t* row_bits, const float* x, int64_t m,
                         float* y, GemmContext& ctx) {
  LOWBIT_CHECK(packed_mixed_serves(w, m), "packed_matmul_mixed: a ", format_name(w.format()), " weight at batch ", m,
               " (any-precision at batch 1..", kMaxGemvBatch, " only)");
  anyprec_gemv_mixed(w.anyprec(), served_width(w, max_bits), row_bits, x, static_cast<int>(m), y, ctx.stream(),
                     GemvPath::Auto, ctx.act_scratch((anyprec_xfrag_bytes(w.k()) + 1) / 2));
}

void packed_matmul(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* y, GemmContext& ctx,
                   OutlierMode mode, const float* x_max) {
  LOWBIT_CHECK(m >= 1, "packed_matmul: batch ", m);
  const int b = served_width(w, bits);
  const Kernel kernel = pick_kernel(problem_of(w, bits, m), runtime_gpu());
  const int mi = static_cast<int>(std::min<int64_t>(m, INT32_MAX));
  // The tensor-core paths read pre-split activations from the context's scratch (sized before any graph capture by
  // the uncaptured step that precedes it).
  switch (kernel) {
    case Kernel::AnyPrecInt8Stream:   // outliers always fused
      anyprec_gemv_i8(w.anyprec(), b, x, mi, y, ctx.stream(), true, ctx.act_scratch((anyprec_xfrag_bytes(w.k()) + 1) / 2), x_max);
      return;
    case Kernel::AnyPrecRegLutStream:
    case Kernel::AnyPrecRegLut:
    case Kernel::AnyPrecSharedLutStream:
    case Kernel::AnyPrecSharedLut:
    case Kernel::AnyPrecCudaCores: {
      const GemvPath path = gemv_path_of(kernel);
      void* xfrag = kPreSplitInRuntime && is_tensor_core(path) ? ctx.act_scratch((anyprec_xfrag_bytes(w.k()) + 1) / 2) : nullptr;
      anyprec_gemv(w.anyprec(), b, x, mi, y, ctx.stream(), mode, path, xfrag);
      return;
    }
    case Kernel::Mixed24aDp:
    case Kernel::Mixed24aInt8Mma:
    case Kernel::Mixed24aTcStream:
    case Kernel::Mixed24aTc:
    case Kernel::Mixed24aCudaCores: {
      const GemvPath path = gemv_path_of(kernel);
      void* xfrag = kPreSplitInRuntime && mixed24a_path_takes_xfrag(path) ? ctx.act_scratch((mixed24a_xfrag_bytes(w.k()) + 1) / 2) : nullptr;
      mixed24a_gemv(w.mixed24a(), x, mi, y, ctx.stream(), mode, path, xfrag, x_max);
      return;
    }
    case Kernel::UniformGemv: return uniform_gemv(w.uniform(), x, mi, y, ctx.stream());
    case Kernel::UniformFused: return uniform_gemm(w.uniform(), x, m, y, ctx);
    case Kernel::QuikGemv: return quik_gemv(w.quik(), x, mi, y, ctx);
    case Kernel::QuikGemm: return quik_gemm(w.quik(), x, m, y, ctx);
    case Kernel::AnyPrecTwoTiles: return anyprec_gemm(w.anyprec(), b, x, m, y, ctx, GemmKernel::TwoTiles);
    case Kernel::AnyPrecWgmmaWs: return anyprec_gemm(w.anyprec(), b, x, m, y, ctx, GemmKernel::WgmmaWs);
    case Kernel::AnyPrecStaged: return anyprec_gemm(w.anyprec(), b, x, m, y, ctx, GemmKernel::Staged);
    case Kernel::Mixed24aTwoTiles:
      return mixed24a_gemv_two_tiles(w.mixed24a(), x, mi, y, ctx.stream(), ctx.act_scratch((mixed24a_xfrag_bytes(w.k()) + 1) / 2));
    case Kernel::DequantCublas: {
      __half* wh = ctx.weight_scratch(static_cast<size_t>(w.n() * w.k()));
      switch (w.format()) {
        case FormatId::AnyPrec: anyprec_dequant_f16(w.anyprec(), b, wh, ctx.stream()); break;
        case FormatId::Mixed24A: mixed24a_dequant_f16(w.mixed24a(), wh, ctx.stream()); break;
        case FormatId::Uniform: uniform_dequant_f16(w.uniform(), wh, ctx.stream()); break;
        case FormatId::Mixed24:
        case FormatId::Quik: fail("packed_matmul: no fp16 decoder for a ", format_name(w.format()), " weight");
      }
      return dense_f16_matmul(wh, w.n(), w.k(), x, m, y, ctx);
    }
    case Kernel::DenseGemv:
    case Kernel::Cublas: break;
  }
  fail("packed_matmul: kernel '", kernel_name(kernel), "' chosen for a ", format_name(w.format()), " weight");
}

namespace {
bool& producer_xmax_state() {   // from the knob on first use
  static bool on = knob_bool(Knob::ProducerXmax);
  return on;
}
bool& fold_swiglu_state() {
  static bool on = knob_bool(Knob::FoldSwiglu);
  return on;
}
bool& group_gemv_state() {
  static bool on = knob_bool(Knob::GroupGemv);
  return on;
}
}  // namespace

bool group_gemv_enabled() { return group_gemv_state(); }
void set_group_gemv(bool on) { group_gemv_state() = on; }
// The switches kernel_choice.h reads go through the knob registry itself.
bool fused_gemm_enabled() { return knob_bool(Knob::FusedGemm); }
void set_fused_gemm(bool on) { set_knob(Knob::FusedGemm, on); }
bool int8_tables_enabled() { return knob_bool(Knob::Int8Tables); }
void set_int8_tables(bool on) { set_knob(Knob::Int8Tables, on); }
bool producer_xmax_enabled() { return producer_xmax_state(); }
void set_producer_xmax(bool on) { producer_xmax_state() = on; }
bool fold_swiglu_enabled() { return fold_swiglu_state(); }
void set_fold_swiglu(bool on) { fold_swiglu_state() = on; }


}  // namespace lowbit::cuda
