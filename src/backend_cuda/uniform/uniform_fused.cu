// The uniform GEMM above batch 8 on Hopper (uniform_fused.h), built on CUTLASS 3's mixed-input mainloop.
// Why CUTLASS: its Hopper mixed-input collective (TMA loads of the packed codes, conversion to fp16 with the group's
// scale and zero in registers, wgmma with A from registers, a persistent warp-specialized schedule) is the
// Machete-class kernel the format needs; lowbit supplies the operand layouts (derived at upload) and the dispatch.
// Tiles: 128 weight rows x 128 or 256 tokens x 64 columns, two consumer warpgroups (uniform_fused.h: UniformFusedTile).
// This file is built for sm_90a only, and only when CMake found the CUTLASS headers (LOWBIT_WITH_CUTLASS).
#include "backend_cuda/uniform/uniform_fused.h"

#include <string>

#include "backend_cuda/common/common.h"
#include "backend_cuda/common/cutlass_gemm.cuh"
#include "backend_cuda/dispatch/kernel_choice.h"
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

// TileTokens a template parameter, as in quik_fused.cu: with every type non-dependent, the host compiler rejects the
// epilogue builder's default path.
template <class ElementW, class TileTokens>
struct UniformGemm {
  using Half = cutlass::half_t;
  using TileShape = Shape<_128, TileTokens, _64>;
  using ClusterShape = Shape<_1, _1, _1>;
  // A: weights [n, k] K-major; B: tokens [m, k] K-major; D: y as the column-major [n, m]; no C operand.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutC = cutlass::layout::ColumnMajor;
  static constexpr int kAlignW = 128 / cutlass::sizeof_bits<ElementW>::value, kAlignIn = 8, kAlignOut = 4;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutC, kAlignOut, float, LayoutC, kAlignOut,
      cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;
  // The tuple (codes, scale, zero) selects the mixed-input mainloop's ConvertAndScaleWithZero: fp16(q) * s + zs.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<ElementW, Half, Half>, LayoutA, kAlignW, Half,
      LayoutB, kAlignIn, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                          cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments arguments(const UniformFusedArgs& a) {
    const int M = static_cast<int>(a.n), N = static_cast<int>(a.m), K = static_cast<int>(a.k);
    const int64_t groups = (a.k + a.group - 1) / a.group;
    const auto st = weights_tokens_strides<GemmKernel>(M, N, K);
    const typename Mainloop::StrideScale ss{_1{}, static_cast<int64_t>(M), static_cast<int64_t>(M) * groups};
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {M, N, K, 1},
                                  {static_cast<const ElementW*>(a.codes), st.a, reinterpret_cast<const Half*>(a.x), st.b,
                                   reinterpret_cast<const Half*>(a.scales_mn), ss, static_cast<int>(a.group),
                                   reinterpret_cast<const Half*>(a.zero_terms_mn)},
                                  {{}, nullptr, {}, a.y, st.d}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info = cutlass_hardware_info<GemmKernel>();
    return args;
  }

  static size_t workspace(const UniformFusedArgs& a) { return Gemm::get_workspace_size(arguments(a)); }

  static void run(const UniformFusedArgs& a, void* ws, size_t ws_bytes, cudaStream_t st) {
    cutlass_run<Gemm>(arguments(a), ws, ws_bytes, st,
                      "uniform fused GEMM w" + std::to_string(a.bits) + " " + std::to_string(a.n) + " x " +
                          std::to_string(a.k) + " g" + std::to_string(a.group) + " at batch " + std::to_string(a.m));
  }
};

template <class F>
decltype(auto) by_form(const UniformFusedArgs& a, F&& f) {
  const UniformFusedTile t = a.tile == UniformFusedTile::Auto ? uniform_fused_tile(a.m, a.n) : a.tile;
  if (a.bits == 8) {
    if (t == UniformFusedTile::T128) return f(UniformGemm<uint8_t, _128>{});
    return f(UniformGemm<uint8_t, _256>{});
  }
  if (t == UniformFusedTile::T128) return f(UniformGemm<cutlass::uint4b_t, _128>{});
  return f(UniformGemm<cutlass::uint4b_t, _256>{});
}

}  // namespace

bool uniform_fused_available() { return sm90a_available(); }

UniformFusedTile uniform_fused_tile(int64_t m, int64_t n) {
  return m >= 1024 || (m >= 512 && n >= 8192) ? UniformFusedTile::T256 : UniformFusedTile::T128;
}

size_t uniform_fused_workspace_bytes(const UniformFusedArgs& a) {
  return by_form(a, [&](auto g) { return decltype(g)::workspace(a); });
}

void uniform_fused_gemm(const UniformFusedArgs& a, void* ws, size_t ws_bytes, cudaStream_t st) {
  LOWBIT_CHECK(uniform_fused_available(), "uniform fused GEMM: needs a compute capability 9.0 GPU");
  LOWBIT_CHECK(uniform_fused_fits(a.bits, a.n, a.k, a.group, false) && a.m >= 1 && a.m <= INT32_MAX,
               "uniform fused GEMM: w", a.bits, " ", a.n, " x ", a.k, " g", a.group, " at batch ", a.m,
               " (4 or 8 bits, n a multiple of 8, k of 32, groups of a multiple of 64 columns or the whole row)");
  LOWBIT_CHECK(a.codes != nullptr && a.scales_mn != nullptr && a.zero_terms_mn != nullptr && a.x != nullptr && a.y != nullptr,
               "uniform fused GEMM: null operand");
  by_form(a, [&](auto g) { decltype(g)::run(a, ws, ws_bytes, st); });
}

}  // namespace lowbit::cuda
