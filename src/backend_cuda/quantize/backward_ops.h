// Backward steps of the fp32 calibration block (block_f32.h) on the GPU, for the Fisher pass (fisher_gpu.h): the
// arithmetic of the CPU backward (model/backward.cpp) on the intermediates block_forward_f32 keeps with saving on.
// Every element-wise or row step has a CPU twin of the same arguments (host pointers, no stream or handle): the
// oracle of tests/test_fisher_gpu.cpp. The matmul steps are cuBLAS fp32 sgemms in the handle's math mode (the
// workspace's: default math, no TF32) on the handle's stream.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "backend_cuda/quantize/block_f32.h"

namespace lowbit::cuda {

// y = w ∘ n, n = x · inv, inv = 1/sqrt(mean(x²) + eps) per row (rmsnorm_f32, inv recomputed from x the same way):
// dx [rows, dim] += inv · (dy∘w − n · mean(dy∘w∘n)), the gradient at x for dy [rows, dim] at y. Accumulates because
// the norm sits on a residual branch: dx comes in holding the gradient the residual passes straight through.
void rmsnorm_backward_f32(const float* x, const float* w, const float* dy, float* dx, int rows, int dim, float eps,
                          cudaStream_t s);
void rmsnorm_backward_ref(const float* x, const float* w, const float* dy, float* dx, int rows, int dim, float eps);

// act = silu(g) · u over n elements (swiglu_f32, contiguous): dg = dact · u · σ · (1 + g (1 − σ)),
// du = dact · g · σ, σ = sigmoid(g). du may alias dact (read before written, element by element).
void swiglu_backward_f32(const float* g, const float* u, const float* dact, float* dg, float* du, int64_t n,
                         cudaStream_t s);
void swiglu_backward_ref(const float* g, const float* u, const float* dact, float* dg, float* du, int64_t n);

// Softmax rows P [rows, T] of causal attention (row r is query position r % T: keys above it are zero, and so are
// those a sliding window hides): in place dP -> dS = P ∘ (dP − Σ_j P_j dP_j), exactly zero where P is zero.
void softmax_backward_f32(const float* probs, float* dp, int64_t rows, int T, cudaStream_t s);
void softmax_backward_ref(const float* probs, float* dp, int64_t rows, int T);

// Next-token cross-entropy of one window's logit rows [rows, vocab], in place: logits -> dLoss/dlogits for
// Loss = (1/n_predicted) Σ rows' losses, i.e. (softmax − onehot(target)) / n_predicted; row_loss[r] = logsumexp −
// logit[target] in double. targets [rows]: ids in [0, vocab) (checked by the caller).
void cross_entropy_f32(float* logits, const int32_t* targets, int rows, int vocab, int64_t n_predicted,
                       double* row_loss, cudaStream_t s);
void cross_entropy_ref(float* logits, const int32_t* targets, int rows, int vocab, int64_t n_predicted,
                       double* row_loss);

// acc[i] += g[i]² over n elements: one window's contribution to the Fisher diagonal.
void square_accumulate_f32(float* acc, const float* g, int64_t n, cudaStream_t s);
void square_accumulate_ref(float* acc, const float* g, int64_t n);

// y = x Wᵀ: dW [n, k] = dyᵀ x for dy [rows, n], x [rows, k].
void linear_weight_grad_f32(cublasHandle_t h, const float* dy, const float* x, int rows, int64_t n, int64_t k,
                            float* dw);
void linear_weight_grad_ref(const float* dy, const float* x, int rows, int64_t n, int64_t k, float* dw);
// dx [rows, k] = dy W + beta · dx, W [n, k] row-major (beta 1 sums the q/k/v or gate/up contributions).
void linear_input_grad_f32(cublasHandle_t h, const float* dy, const float* w, int rows, int64_t n, int64_t k,
                           float beta, float* dx);
void linear_input_grad_ref(const float* dy, const float* w, int rows, int64_t n, int64_t k, float beta, float* dx);

struct AttentionDims {
  int T = 0;          // positions 0..T-1 of one window
  int heads = 0;      // query heads; head h reads kv head h / (heads / kv_heads)
  int kv_heads = 0;
  int head_dim = 0;
};
// Backward of block_forward_f32's attention, out_h = P_h V_j, P_h = softmax(Q_h K_jᵀ / sqrt(hd)) (causal), for
// q [T, heads·hd] and k, v [T, kv_heads·hd] (q, k after RoPE), probs [heads, T, T], dout [T, heads·hd]:
// dq = dS K / sqrt(hd), dk = Σ_group dSᵀ Q / sqrt(hd), dv = Σ_group Pᵀ dout (gradients at the post-RoPE q, k).
// dscores: scratch [heads, T, T].
void attention_backward_f32(cublasHandle_t h, const AttentionDims& d, const float* q, const float* k, const float* v,
                            const float* probs, const float* dout, float* dscores, float* dq, float* dk, float* dv,
                            cudaStream_t s);
void attention_backward_ref(const AttentionDims& d, const float* q, const float* k, const float* v, const float* probs,
                            const float* dout, float* dq, float* dk, float* dv);

// The backward of one block over one window, after block_forward_f32 of that window with ws.saves() (its
// intermediates in ws.saved(); the scratch buffers of ws hold the backward's own). dx [T, dim] on the device: in,
// dLoss/d(block output); out, dLoss/d(block input). For each linear i in slot order q, k, v, o, gate, up, down, its
// weight gradient is formed in dw_scratch (at least the largest n·k floats) and its square added into fisher[i]
// ([n, k] row-major). Everything on `stream`; nothing synchronises.
void block_backward_f32(const BlockWeightsF32& w, BlockWorkspace& ws, int T, float* dx, float* dw_scratch,
                        const std::array<float*, 7>& fisher, cudaStream_t stream);

}  // namespace lowbit::cuda
