// QUIK activations quantized by the kernels that produce them (quik.h): the RMSNorm before q / k / v and gate / up, and
// SwiGLU before down. One block per token row holds the row in registers (float4s, up to kVec per thread), writes it
// in fp32 as the plain kernel does, reduces min / max over the base columns and writes the codes, the fp16 outlier
// columns and the per-token values from those registers: the separate activation kernel's second read of the row (a
// full pass over [m, k] fp32 per linear, 136-286 us at 2048 tokens of 8192-28672 columns on the H200) and its launch
// are gone, and the three q / k / v linears (two for gate / up) share one quantization.
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>

#include "backend_cuda/common/common.h"
#include "backend_cuda/ops/gpu_ops.h"
#include "backend_cuda/ops/rms.cuh"
#include "backend_cuda/ops/swiglu.cuh"
#include "backend_cuda/quik/quik.h"
#include "backend_cuda/quik/quik_act.cuh"
#include "backend_cuda/quik/quik_row_sink.cuh"
#include "core/error.h"
#include "core/knobs.h"
#include "formats/format_id.h"

namespace lowbit::cuda {
namespace {

using namespace quik_act;

constexpr int kMaxVec = 8;   // float4s per thread: rows up to 1024 x 8 x 4 = 32768 columns

// The row held as float4 v[i] at column 4 (threadIdx.x + i blockDim.x): min / max over its base columns, then every
// column quantized into s (token t).
// f(i, q) for each float4 i of the row a thread holds, at float4 column q = threadIdx.x + i blockDim.x < n4.
template <int kVec, typename F>
__device__ __forceinline__ void for_each_held(const float4 (&)[kVec], int n4, F&& f) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int q = static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x);
    if (q < n4) f(i, q);
  }
}

template <ActForm F, int kVec>
__device__ __forceinline__ void quantize_held_row(const QuikDevice& w, const OutlierMap& om, const ActScratch& s,
                                                  int64_t t, const float4 (&v)[kVec], int n4) {
  float mn = FLT_MAX, mx = -FLT_MAX;
  if constexpr (kQuantized<F>) {
    for_each_held(v, n4, [&](int i, int q) {
      const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (!om.outlier(4 * q + c)) mn = fminf(mn, e[c]), mx = fmaxf(mx, e[c]);
    });
    block_min_max(mn, mx);
  }
  float sa, lo;
  row_params<F>(w, mn, mx, sa, lo);
  for_each_held(v, n4, [&](int i, int q) {
    const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int c = 0; c < 4; ++c) put_column<F>(w, om, s, t, 4 * q + c, e[c], sa, lo);
  });
  finish_row<F>(w, s, t, sa, lo);
}

// rmsnorm_kernel's arithmetic (gpu_ops.cu: the same thread count and rms.cuh's load_residual_row, block_rms_inv and
// rms_scale, so y has the same bits), then the row quantized for w.
template <ActForm F, int kVec>
__global__ void __launch_bounds__(1024) quik_rmsnorm_act_kernel(QuikDevice w, float* x, const float* delta, const float* nw,
                                                                float* y, int dim, float eps, ActScratch s) {
  extern __shared__ uint32_t map_smem[];
  const OutlierMap om = build_outlier_map(w, map_smem);
  const int n4 = dim / 4;
  const int64_t t = blockIdx.x;
  float4* xr = reinterpret_cast<float4*>(x + t * dim);
  const float4* dr = delta != nullptr ? reinterpret_cast<const float4*>(delta + t * dim) : nullptr;
  const float4* w4 = reinterpret_cast<const float4*>(nw);
  float4 v[kVec];
  const float inv = block_rms_inv(load_residual_row(xr, dr, n4, v), dim, eps);
  float4* yr = reinterpret_cast<float4*>(y + t * dim);
  for_each_held(v, n4, [&](int i, int q) { yr[q] = v[i] = rms_scale(v[i], w4[q], inv); });
  quantize_held_row<F, kVec>(w, om, s, t, v, n4);
}

// swiglu_kernel's element (silu_mul), a row per block, then the row quantized for w.
template <ActForm F, int kVec>
__global__ void __launch_bounds__(1024) quik_swiglu_act_kernel(QuikDevice w, const float* g, const float* u, int64_t ld,
                                                               float* out, int width, ActScratch s) {
  extern __shared__ uint32_t map_smem[];
  const OutlierMap om = build_outlier_map(w, map_smem);
  const int n4 = width / 4;
  const int64_t t = blockIdx.x;
  const float4* gr = reinterpret_cast<const float4*>(g + t * ld);
  const float4* ur = reinterpret_cast<const float4*>(u + t * ld);
  float4* orow = reinterpret_cast<float4*>(out + t * width);
  float4 v[kVec];
  for_each_held(v, n4, [&](int i, int q) {
    const float4 a = gr[q], b = ur[q];
    orow[q] = v[i] = make_float4(silu_mul(a.x, b.x), silu_mul(a.y, b.y), silu_mul(a.z, b.z), silu_mul(a.w, b.w));
  });
  quantize_held_row<F, kVec>(w, om, s, t, v, n4);
}

// Threads per row as rmsnorm() picks them (one float4 each, at most 1024) and the float4s each holds.
struct RowShape {
  int threads, vec;
};
RowShape row_shape(int width) {
  const int n4 = width / 4;
  const int threads = std::min(1024, std::max(32, (n4 + 31) / 32 * 32));
  const int need = (n4 + threads - 1) / threads;
  return {threads, need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : kMaxVec};
}

template <template <ActForm, int> class Launch, typename... Args>
void dispatch(ActForm f, int vec, Args&&... args) {
  auto by_vec = [&](auto form) {
    constexpr ActForm F = decltype(form)::value;
    switch (vec) {
      case 1: return Launch<F, 1>::run(args...);
      case 2: return Launch<F, 2>::run(args...);
      case 4: return Launch<F, 4>::run(args...);
      default: return Launch<F, kMaxVec>::run(args...);
    }
  };
  by_form(f, by_vec);
}

template <ActForm F, int kVec>
struct NormLaunch {
  static void run(const QuikDevice& w, int m, RowShape rs, size_t smem, cudaStream_t st, float* x, const float* delta,
                  const float* nw, float* y, int dim, float eps, const ActScratch& s) {
    quik_rmsnorm_act_kernel<F, kVec><<<m, rs.threads, smem, st>>>(w, x, delta, nw, y, dim, eps, s);
  }
};
template <ActForm F, int kVec>
struct SwigluLaunch {
  static void run(const QuikDevice& w, int m, RowShape rs, size_t smem, cudaStream_t st, const float* g, const float* u,
                  int64_t ld, float* out, int width, const ActScratch& s) {
    quik_swiglu_act_kernel<F, kVec><<<m, rs.threads, smem, st>>>(w, g, u, ld, out, width, s);
  }
};

// The layout the linear reads at m tokens, in acts; the GEMM's padding rows (FP8) zeroed.
ActScratch prepare(const QuikDevice& w, int64_t m, void* acts, cudaStream_t st) {
  const ActForm f = form_at(w, m);
  const int64_t rows = act_rows(w, m);
  const ActScratch s = act_layout(w, rows, f, acts);
  zero_padding_rows(w, s, m, rows, f, st);
  return s;
}

bool& producer_act_state() {   // from the environment on first use
  static bool on = knob_bool(Knob::QuikProducerAct);
  return on;
}
int& attention_act_state() {   // from the environment on first use
  static int mode = static_cast<int>(knob_int(Knob::QuikAttentionAct));
  return mode;
}

}  // namespace

bool quik_producer_act_enabled() { return producer_act_state(); }
void set_quik_producer_act(bool on) { producer_act_state() = on; }
int quik_attention_act_mode() { return attention_act_state(); }
void set_quik_attention_act_mode(int mode) {
  LOWBIT_CHECK(mode >= -1 && mode <= 1, "QUIK attention quantization mode ", mode, " (-1, 0 or 1)");
  attention_act_state() = mode;
}
bool quik_attention_act_at(int64_t rows) {
  const int mode = attention_act_state();
  return mode == 1 || (mode == -1 && rows <= kQuikAttentionActRows);
}

bool quik_attention_quantizes(const QuikDevice& w, int64_t width) {
  return quik_producer_quantizes(w, width) && outlier_map_bytes(w) <= static_cast<size_t>(kSinkMapBytes);
}

QuikRowSink quik_row_sink(const QuikDevice& w, int64_t m, void* acts, size_t acts_bytes, unsigned* done, int64_t groups,
                          cudaStream_t s) {
  LOWBIT_CHECK(quik_attention_quantizes(w, w.k) && m >= 1, "quik attention sink: ", m, " rows do not quantize for a weight of ",
               w.k, " inputs");
  LOWBIT_CHECK(acts != nullptr && acts_bytes >= quik_act_scratch_bytes(w, m), "quik attention sink: ", acts_bytes,
               " bytes for the quantized rows (", quik_act_scratch_bytes(w, m), " needed)");
  LOWBIT_CHECK(done != nullptr && groups >= m, "quik attention sink: ", groups, " row-group counts for ", m, " rows");
  QuikRowSink sk;
  sk.w = w;
  sk.s = prepare(w, m, acts, s);
  sk.form = form_at(w, m);
  sk.done = done;
  sk.groups = groups;
  return sk;
}

bool quik_same_activations(const DevicePackedWeight& a, const DevicePackedWeight& b) {
  if (a.format() != FormatId::Quik || b.format() != FormatId::Quik) return false;
  const QuikDevice x = a.quik(), y = b.quik();
  return x.k == y.k && x.abits == y.abits && x.act_fp8 == y.act_fp8 && a.quik_outlier_columns() == b.quik_outlier_columns();
}

bool quik_producer_quantizes(const QuikDevice& w, int64_t width) {
  return width == w.k && width % 4 == 0 && width / 4 <= 1024 * kMaxVec && outlier_map_bytes(w) <= 48 * 1024 &&
         (w.abits == 4 || w.abits == 8 || w.abits == 16);
}

bool quik_rmsnorm_quantizes(const QuikDevice& w, int dim) {
  return quik_producer_quantizes(w, dim) && rmsnorm_writes_xmax(dim);   // rmsnorm()'s float4 kernel: the same bits
}

void quik_rmsnorm_quantize(const QuikDevice& w, float* x, const float* delta, const float* norm_w, float* y, int m, int dim,
                           float eps, void* acts, size_t acts_bytes, cudaStream_t s) {
  LOWBIT_CHECK(quik_rmsnorm_quantizes(w, dim) && m >= 1, "quik RMSNorm: ", m, " rows of ", dim,
               " columns do not quantize for a weight of ", w.k, " inputs");
  LOWBIT_CHECK(acts != nullptr && acts_bytes >= quik_act_scratch_bytes(w, m), "quik RMSNorm: ", acts_bytes,
               " bytes for the quantized rows (", quik_act_scratch_bytes(w, m), " needed)");
  const ActScratch as = prepare(w, m, acts, s);
  const RowShape rs = row_shape(dim);
  dispatch<NormLaunch>(form_at(w, m), rs.vec, w, m, rs, outlier_map_bytes(w), s, x, delta, norm_w, y, dim, eps, as);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void quik_swiglu_quantize(const QuikDevice& w, const float* g, const float* u, int64_t ld, float* out, int m, int64_t width,
                          void* acts, size_t acts_bytes, cudaStream_t s) {
  LOWBIT_CHECK(acts != nullptr && acts_bytes >= quik_act_scratch_bytes(w, m), "quik SwiGLU: ", acts_bytes,
               " bytes for the quantized rows (", quik_act_scratch_bytes(w, m), " needed)");
  LOWBIT_CHECK(quik_producer_quantizes(w, width) && m >= 1 && ld % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(g) % 16 == 0 && reinterpret_cast<uintptr_t>(u) % 16 == 0,
               "quik SwiGLU: ", m, " rows of ", width, " columns (", ld, " apart) do not quantize for a weight of ", w.k,
               " inputs");
  const ActScratch as = prepare(w, m, acts, s);
  const RowShape rs = row_shape(static_cast<int>(width));
  dispatch<SwigluLaunch>(form_at(w, m), rs.vec, w, m, rs, outlier_map_bytes(w), s, g, u, ld, out, static_cast<int>(width), as);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
