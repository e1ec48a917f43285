// Where QUIK's per-token activation quantization puts its output (host-visible: the forward and the tests size and
// hand these buffers to the kernels that produce activations; quik_act.cuh has the device arithmetic).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dispatch/device_weight.h"

namespace lowbit::cuda::quik_act {

// What the activation step writes for the base columns.
enum class ActForm {
  Int8,      // abits 4 / 8: signed codes (GEMV and GEMM)
  Fp8Int,    // FP8, for the GEMV: int32 e4m3 value x 512 (the reference's integers)
  Fp8Byte,   // FP8, for the GEMM: e4m3 bytes
  F32,       // A16, for the GEMV
  F16,       // A16, for the GEMM
};

constexpr size_t act_elem_bytes(ActForm f) {
  return f == ActForm::Fp8Int || f == ActForm::F32 ? 4 : f == ActForm::F16 ? 2 : 1;
}

struct RowAct {
  float sa, mn;
};

inline size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// The activation scratch: values [m, kbp] of the form's element, then (sa, mn) [m], then the fused GEMM's per-token
// vectors sa [m] and a2 = H sa + mn [m], then fp16 outlier activations [m, no]. tsa holds the scales of `act` again
// because CUTLASS's row broadcast reads stride-1 vectors, while the GEMV and the library epilogue read each token's sa
// and mn together (one 8-byte load); the copy is 4 bytes per token.
struct ActScratch {
  void* xq;
  RowAct* act;
  float* tsa;
  float* ta2;
  __half* xo;
};
inline size_t act_bytes(const QuikDevice& w, int64_t m, ActForm f) {
  return align16(static_cast<size_t>(m * w.kbp) * act_elem_bytes(f)) + align16(static_cast<size_t>(m) * sizeof(RowAct)) +
         2 * align16(static_cast<size_t>(m) * sizeof(float)) + static_cast<size_t>(m * w.no) * sizeof(__half);
}
inline ActScratch act_layout(const QuikDevice& w, int64_t m, ActForm f, void* base) {
  uint8_t* p = static_cast<uint8_t*>(base);
  ActScratch s;
  s.xq = p;
  p += align16(static_cast<size_t>(m * w.kbp) * act_elem_bytes(f));
  s.act = reinterpret_cast<RowAct*>(p);
  p += align16(static_cast<size_t>(m) * sizeof(RowAct));
  s.tsa = reinterpret_cast<float*>(p);
  p += align16(static_cast<size_t>(m) * sizeof(float));
  s.ta2 = reinterpret_cast<float*>(p);
  p += align16(static_cast<size_t>(m) * sizeof(float));
  s.xo = reinterpret_cast<__half*>(p);
  return s;
}

inline ActForm gemv_form(const QuikDevice& w) {
  return w.abits == 16 ? ActForm::F32 : w.act_fp8 ? ActForm::Fp8Int : ActForm::Int8;
}
inline ActForm gemm_form(const QuikDevice& w) {
  return w.abits == 16 ? ActForm::F16 : w.act_fp8 ? ActForm::Fp8Byte : ActForm::Int8;
}
// The form the linear reads at m tokens: the GEMV's at 1..8, the GEMM's above.
inline ActForm form_at(const QuikDevice& w, int64_t m) { return m <= 8 ? gemv_form(w) : gemm_form(w); }
// Rows of activations the GEMM form reads for m tokens (any m: tests run it below batch 9 too): cuBLASLt's FP8 GEMM
// wants them in multiples of 16.
inline int64_t gemm_rows(const QuikDevice& w, int64_t m) { return gemm_form(w) == ActForm::Fp8Byte ? (m + 15) / 16 * 16 : m; }
// Rows quik_matmul's form reads for m tokens.
inline int64_t act_rows(const QuikDevice& w, int64_t m) { return m <= 8 ? m : gemm_rows(w, m); }
// The rows past m of a layout for `rows` tokens zeroed (the GEMM's padding: zero codes / values add nothing).
inline void zero_padding_rows(const QuikDevice& w, const ActScratch& s, int64_t m, int64_t rows, ActForm f, cudaStream_t st) {
  if (rows > m)
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(s.xq) + m * w.kbp * act_elem_bytes(f), 0,
                                      static_cast<size_t>((rows - m) * w.kbp) * act_elem_bytes(f), st));
}

}  // namespace lowbit::cuda::quik_act
