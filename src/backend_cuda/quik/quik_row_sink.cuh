// The device half of QuikRowSink (quik.h): the attention kernels call quik_sink_part_done once a block has written its
// share of a group of rows, and the group's last block quantizes the group's rows for the o projection.
#pragma once
#include <cfloat>
#include <cstdint>

#include "backend_cuda/quik/quik.h"
#include "backend_cuda/quik/quik_act.cuh"

namespace lowbit::cuda {

// Shared memory the attention kernels lend the outlier map (quik_attention_quantizes checks a weight's fits).
inline constexpr int kSinkMapBytes = 4096;

namespace quik_act {

// Rows t0 .. t0 + cnt - 1 of x (w.k floats each, 16-byte aligned), one warp per row: min / max over the base columns,
// then every column into s, as quantize_held_row does from registers. The rows were written by other blocks: loads
// go through L2 (ld.cg), never a stale L1 line.
template <ActForm F>
__device__ void quantize_rows_by_warp(const QuikDevice& w, const OutlierMap& om, const ActScratch& s, const float* x,
                                      int64_t t0, int cnt) {
  const int lane = static_cast<int>(threadIdx.x % 32), warps = static_cast<int>(blockDim.x / 32);
  const int n4 = static_cast<int>(w.k / 4);
  for (int r = static_cast<int>(threadIdx.x / 32); r < cnt; r += warps) {
    const int64_t t = t0 + r;
    const float4* row = reinterpret_cast<const float4*>(x + t * w.k);
    float mn = FLT_MAX, mx = -FLT_MAX;
    if constexpr (kQuantized<F>) {
      for (int q = lane; q < n4; q += 32) {
        const float4 v = __ldcg(row + q);
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (!om.outlier(4 * q + c)) mn = fminf(mn, e[c]), mx = fmaxf(mx, e[c]);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      }
    }
    float sa, lo;
    row_params<F>(w, mn, mx, sa, lo);
    for (int q = lane; q < n4; q += 32) {
      const float4 v = __ldcg(row + q);
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) put_column<F>(w, om, s, t, 4 * q + c, e[c], sa, lo);
    }
    finish_row<F>(w, s, t, sa, lo, lane, 32);
  }
}

}  // namespace quik_act

// Called by every thread of a block (all of them, block-uniform arguments) after it wrote its part of rows
// t0 .. t0 + cnt - 1 of x, which `parts` blocks write together: counts the block in sk.done[group], and the last of
// the parts quantizes the rows (smem: kSinkMapBytes the block no longer needs). Not inlined: one copy per file
// instead of one in each attention kernel's variants, and only the last block of a group runs past the count.
__device__ __noinline__ inline void quik_sink_part_done(const QuikRowSink& sk, int parts, int64_t group, const float* x,
                                                        int64_t t0, int cnt, uint32_t* smem) {
  using namespace quik_act;
  __shared__ int last;
  __threadfence();   // release: this thread's writes to x, device-wide before the count
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned top = static_cast<unsigned>(parts - 1);
    last = atomicInc(sk.done + group, top) == top;   // wraps to 0 at the last part: the count is ready for the next use
  }
  __syncthreads();
  if (!last) return;
  __threadfence();   // acquire: the other parts' writes
  const OutlierMap om = build_outlier_map(sk.w, smem);
  switch (sk.form) {
    case ActForm::Int8: return quantize_rows_by_warp<ActForm::Int8>(sk.w, om, sk.s, x, t0, cnt);
    case ActForm::Fp8Int: return quantize_rows_by_warp<ActForm::Fp8Int>(sk.w, om, sk.s, x, t0, cnt);
    case ActForm::Fp8Byte: return quantize_rows_by_warp<ActForm::Fp8Byte>(sk.w, om, sk.s, x, t0, cnt);
    case ActForm::F32: return quantize_rows_by_warp<ActForm::F32>(sk.w, om, sk.s, x, t0, cnt);
    case ActForm::F16: return quantize_rows_by_warp<ActForm::F16>(sk.w, om, sk.s, x, t0, cnt);
  }
}

}  // namespace lowbit::cuda
