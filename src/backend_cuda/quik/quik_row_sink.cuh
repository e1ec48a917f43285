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

// Rows t0 .. t0 + cnt - 1 of x (w.k floats each, 16-byte aligned) in form f, each by a team of threads: the whole
// block (kBlock: one row at a time, the latency of one round of loads per row) or a warp (a row per warp, the warps'
// rows side by side). Per row, as quantize_held_row from registers: min / max over the base columns, then every column
// into s. Loads are issued kChunk float4s per thread at a time, all in flight together; a row that fits one chunk
// stays in registers for its second pass. The rows were written by other blocks: loads go through L2 (ld.cg), never a
// stale L1 line.
template <bool kBlock>
__device__ __forceinline__ void quantize_rows_by_team(const QuikDevice& w, ActForm f, const OutlierMap& om,
                                                      const ActScratch& s, const float* x, int64_t t0, int cnt) {
  constexpr int kChunk = 8;
  const int team = kBlock ? static_cast<int>(blockDim.x) : 32;
  const int i0 = kBlock ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % 32);
  const int first = kBlock ? 0 : static_cast<int>(threadIdx.x / 32), step = kBlock ? 1 : static_cast<int>(blockDim.x / 32);
  const int n4 = static_cast<int>(w.k / 4), span = kChunk * team;
  const bool quantized = f == ActForm::Int8 || f == ActForm::Fp8Int || f == ActForm::Fp8Byte;
  const bool held = quantized && n4 <= span;   // the first pass loaded the whole row
  for (int r = first; r < cnt; r += step) {
    const int64_t t = t0 + r;
    const float4* row = reinterpret_cast<const float4*>(x + t * w.k);
    float4 v[kChunk];
    auto load = [&](int base) {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int q = base + i0 + i * team;
        v[i] = q < n4 ? __ldcg(row + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    };
    float mn = FLT_MAX, mx = -FLT_MAX;
    if (quantized) {
      for (int base = 0; base < n4; base += span) {
        load(base);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          const int q = base + i0 + i * team;
          if (q >= n4) continue;
          const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (!om.outlier(4 * q + c)) mn = fminf(mn, e[c]), mx = fmaxf(mx, e[c]);
        }
      }
      if constexpr (kBlock) block_min_max(mn, mx);
      else warp_min_max(mn, mx);
    }
    by_form(f, [&](auto form) {
      constexpr ActForm F = decltype(form)::value;
      float sa, lo;
      row_params<F>(w, mn, mx, sa, lo);
      for (int base = 0; base < n4; base += span) {
        if (!held) load(base);
        // Not unrolled: the loop runs once per launch in decode, where its unrolled body is fetched cold (ncu, H200: one
        // decode row's attention with the sink 23.9 us rolled, 32.8 unrolled); v moves to local memory, in L1.
#pragma unroll 1
        for (int i = 0; i < kChunk; ++i) {
          const int q = base + i0 + i * team;
          if (q >= n4) continue;
          const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
          for (int c = 0; c < 4; ++c) put_column<F>(w, om, s, t, 4 * q + c, e[c], sa, lo);
        }
      }
      finish_row<F>(w, s, t, sa, lo, i0, team);
    });
    if constexpr (kBlock) __syncthreads();   // block_min_max's slots are read before the next row writes them
  }
}

}  // namespace quik_act

// The group's rows quantized by the block (all threads; smem: kSinkMapBytes the block no longer needs). Not inlined,
// so each file holds one copy of the loops and the attention kernels' variants only a call (inlined, the attention
// file compiled in 100 s instead of 43); the weight and scratch arrive as values, copied out of the kernel's parameter
// by the one block that calls: taking the parameter's address instead (a reference) made every thread of every block
// copy it to local memory at kernel entry, sink or not (2.9 MB of local stores in a 128-block prefill launch; the
// per-row prefill of 2048 Llama-2-7B tokens fell from 8,881 to 7,788 tok/s on the H200).
__device__ __noinline__ inline void quik_sink_quantize(QuikDevice w, quik_act::ActScratch s, quik_act::ActForm form,
                                                       const float* x, int64_t t0, int cnt, uint32_t* smem,
                                                       bool block_team) {
  using namespace quik_act;
  const OutlierMap om = build_outlier_map(w, smem);
  if (block_team) quantize_rows_by_team<true>(w, form, om, s, x, t0, cnt);
  else quantize_rows_by_team<false>(w, form, om, s, x, t0, cnt);
}

// Called by every thread of a block (all of them, block-uniform arguments) after it wrote its part of rows
// t0 .. t0 + cnt - 1 of x, which `parts` blocks write together: counts the block in sk.done[group], and the last of
// the parts quantizes the rows, by the whole block per row (block_team: attention's one-row groups) or a warp per row
// (prefill's query tiles).
__device__ __forceinline__ void quik_sink_part_done(const QuikRowSink& sk, int parts, int64_t group, const float* x,
                                                    int64_t t0, int cnt, uint32_t* smem, bool block_team) {
  __shared__ int last;
  // One thread's acquire-release increment after the barrier (CUTLASS's semaphore form): the barrier orders the block's
  // writes before it and the release is cumulative, so they are visible device-wide before the count moves; the last
  // part's acquire, shared through the second barrier, makes the other parts' writes visible to its threads. The
  // increment wraps to 0 at the last part, so the count is ready for the next use.
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned top = static_cast<unsigned>(parts - 1);
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;" : "=r"(old) : "l"(sk.done + group), "r"(top) : "memory");
    last = old == top;
  }
  __syncthreads();
  if (last) quik_sink_quantize(sk.w, sk.s, sk.form, x, t0, cnt, smem, block_team);
}

}  // namespace lowbit::cuda
