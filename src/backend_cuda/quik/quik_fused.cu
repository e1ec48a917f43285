// QUIK's fused Hopper GEMM (quik_fused.h), built on CUTLASS 3: a warp-specialized, persistent TMA + wgmma mainloop
// (cooperative schedule, two consumer warpgroups) and QUIK's epilogue as an epilogue visitor tree, applied to the
// accumulators in registers before the TMA store of y:
//   D = a2[t] * wred[r] + sw[r] * (acc * sa[t])
// sa / a2 are row broadcasts of the GEMM (one value per token, its N mode), sw / wred column broadcasts (one per output
// row, its M mode); a null pointer gives the node's default (1 for the scales, 0 for the zero-point term). The
// accumulators convert to fp32 in the first node; integer sums below 2^24 convert exactly (the tests run the kernel
// with unit scales to read them back bit for bit).
// Why CUTLASS: its Hopper mainloop (TMA multicast over a cluster of two, wgmma, the persistent tile scheduler) is the
// fast int8 / FP8 GEMM, and the visitor tree expresses QUIK's epilogue without a kernel of our own. The one thing it
// cannot take is QUIK's per-token activation quantization: that stays a kernel before it (quik_gemm.cu).
// This file is built for sm_90a only, and only when CMake found the CUTLASS headers (LOWBIT_WITH_CUTLASS).
#include "backend_cuda/quik/quik_fused.h"

#include <string>

#include "backend_cuda/common/common.h"
#include "backend_cuda/common/cutlass_gemm.cuh"
#include "core/error.h"

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace lowbit::cuda {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

template <class ElementW, class ElementIn, class Accumulator, class TileTokens>
struct FusedGemm {
  using TileShape = Shape<_128, TileTokens, _128>;   // 128 weight rows x 128 or 256 tokens x 128 k
  using ClusterShape = Shape<_2, _1, _1>;      // two CTAs along the weight rows share each token tile by multicast
  static constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;

  // One value per token (N) or per weight row (M); alignment 1: any m, and the vectors need no padding.
  using PerToken = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>, 1>;
  using PerRowHalf = fusion::Sm90ColBroadcast<0, TileShape, cutlass::half_t, float, Stride<_1, _0, int64_t>, 1>;
  using PerRow = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>, 1>;
  using AccTimesSa = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, RN>,   // acc * sa
                                     fusion::Sm90AccFetch, PerToken>;
  using TimesSw = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, RN>,   // * sw
                                  AccTimesSa, PerRowHalf>;
  using Epilogue = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, RN>,   // a2 wred +
                                   PerToken, PerRow, TimesSw>;

  // A: weights [n, k] K-major; B: tokens [m, k] K-major; D: y as the column-major [n, m]; no C operand.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutC = cutlass::layout::ColumnMajor;
  static constexpr int kAlignW = 128 / cutlass::sizeof_bits<ElementW>::value, kAlignIn = 16, kAlignOut = 4;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, float, void, LayoutC, kAlignOut, float, LayoutC,
      kAlignOut, cutlass::epilogue::TmaWarpSpecializedCooperative, Epilogue>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementW, LayoutA, kAlignW, ElementIn, LayoutB, kAlignIn,
      Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const QuikFusedArgs& a) {
    const int M = static_cast<int>(a.n), N = static_cast<int>(a.m), K = static_cast<int>(a.k);
    const auto st = weights_tokens_strides<Kernel>(M, N, K);
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {M, N, K, 1},
                                  {static_cast<const ElementW*>(a.w), st.a, static_cast<const ElementIn*>(a.x), st.b},
                                  {{}, nullptr, {}, a.y, st.d}};
    // Each node's arguments: its children's in order, then its own op's (a2, wred, (acc sa) sw, fma).
    args.epilogue.thread = {{a.a2, 0.0f, {}},
                            {a.wred, 0.0f, {}},
                            {{{}, {a.sa, 1.0f, {}}, {}}, {reinterpret_cast<const cutlass::half_t*>(a.sw), cutlass::half_t(1.0f), {}}, {}},
                            {}};
    args.hw_info = cutlass_hardware_info<Kernel>();
    return args;
  }

  static size_t workspace(const QuikFusedArgs& a) { return Gemm::get_workspace_size(arguments(a)); }

  static void run(const QuikFusedArgs& a, void* ws, size_t ws_bytes, cudaStream_t st) {
    cutlass_run<Gemm>(arguments(a), ws, ws_bytes, st,
                      "quik fused GEMM " + std::to_string(a.n) + " x " + std::to_string(a.k) + " at batch " + std::to_string(a.m));
  }
};

// 4-bit codes are CUTLASS's int4b_t as stored (two's complement, column 2j in the low nibble of byte j): the mixed-input
// mainloop loads them packed and widens them in registers (A from registers, wgmma RS), so no wider copy is written.
using W8A8Gemm = FusedGemm<int8_t, int8_t, int32_t, _256>;
using W4A8Gemm = FusedGemm<cutlass::int4b_t, int8_t, int32_t, _256>;
// FP8 keeps the plain FP8 mainloop over e4m3 codes widened per call: it promotes the tensor cores' partial sums to fp32
// every few k-blocks, which the mixed-input mainloop does not (its W4-FP8 sums drifted past the tests' budget at k 4096).
// The promoted sums double the accumulator registers: at 256 tokens per tile they spilled (904 bytes), so 128.
using W4Fp8Gemm = FusedGemm<cutlass::float_e4m3_t, cutlass::float_e4m3_t, float, _128>;

template <class F>
decltype(auto) by_kind(QuikFusedKind kind, F&& f) {
  switch (kind) {
    case QuikFusedKind::W8A8: return f(W8A8Gemm{});
    case QuikFusedKind::W4A8: return f(W4A8Gemm{});
    default: return f(W4Fp8Gemm{});
  }
}

}  // namespace

bool quik_fused_available() { return sm90a_available(); }

bool quik_fused_fits(int64_t n, int64_t k) { return n > 0 && n % 4 == 0 && k > 0 && k % 32 == 0 && n <= INT32_MAX && k <= INT32_MAX; }

size_t quik_fused_workspace_bytes(const QuikFusedArgs& a) {
  return by_kind(a.kind, [&](auto g) { return decltype(g)::workspace(a); });
}

void quik_fused_gemm(const QuikFusedArgs& a, void* ws, size_t ws_bytes, cudaStream_t st) {
  LOWBIT_CHECK(quik_fused_available(), "quik fused GEMM: needs a compute capability 9.0 GPU");
  LOWBIT_CHECK(quik_fused_fits(a.n, a.k) && a.m >= 1 && a.m <= INT32_MAX, "quik fused GEMM: ", a.n, " x ", a.k,
               " at batch ", a.m, " (n a multiple of 4, k of 32)");
  LOWBIT_CHECK(a.y != nullptr && a.w != nullptr && a.x != nullptr, "quik fused GEMM: null operand");
  by_kind(a.kind, [&](auto g) { decltype(g)::run(a, ws, ws_bytes, st); });
}

}  // namespace lowbit::cuda
