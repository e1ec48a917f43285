// The fp32 transformer block on the GPU for calibration: the same arithmetic as Model::layer_forward (CPU,
// src/model/forward.cpp) over one window of T tokens at positions 0..T-1, with every matmul a cuBLAS fp32 sgemm
// (no TF32) and a hook that sees each linear slot's input rows before the linears consume them (Hessian capture).
// Quantizers stream a model through it block by block (src/backend_cuda/quantize/quantize_gpu.cu); the Fisher
// pass (fisher_gpu.h) runs it with `saved` to keep what its backward needs.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "model/config.h"
#include "model/model.h"

namespace lowbit::cuda {

// A block's weights on the device, fp32, canonical (Hugging Face) layouts: wq [q_dim, dim], wk/wv [kv_dim, dim],
// wo [dim, q_dim], wg/wu [hidden, dim], wd [dim, hidden]; biases (Qwen2 q/k/v) may be null.
struct BlockWeightsF32 {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* wq = nullptr;
  const float* wk = nullptr;
  const float* wv = nullptr;
  const float* wo = nullptr;
  const float* wg = nullptr;
  const float* wu = nullptr;
  const float* wd = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
};

// Intermediate activations of one window, kept for a backward pass (each [T, width] row-major fp32 on the device,
// allocated by BlockWorkspace when saving is on).
struct BlockSaved {
  float* x_in = nullptr;     // [T, dim] block input
  float* xn1 = nullptr;      // [T, dim] attention-norm output
  float* q = nullptr;        // [T, q_dim] after RoPE
  float* k = nullptr;        // [T, kv_dim] after RoPE
  float* v = nullptr;        // [T, kv_dim]
  float* probs = nullptr;    // [heads, T, T] softmax (causal, zeros above the diagonal)
  float* attn = nullptr;     // [T, q_dim] attention output (o_proj input)
  float* h = nullptr;        // [T, dim] x_in + o_proj(attn)
  float* xn2 = nullptr;      // [T, dim] ffn-norm output
  float* g = nullptr;        // [T, hidden] gate_proj output (pre-activation)
  float* u = nullptr;        // [T, hidden] up_proj output
  float* act = nullptr;      // [T, hidden] silu(g) * u (down_proj input)
};

// Scratch for block_forward_f32 on windows of up to max_t tokens (and, with save, the BlockSaved buffers).
class BlockWorkspace {
 public:
  BlockWorkspace(const ModelConfig& c, int max_t, bool save);
  BlockWorkspace(const BlockWorkspace&) = delete;
  BlockWorkspace& operator=(const BlockWorkspace&) = delete;
  ~BlockWorkspace();
  static size_t bytes_needed(const ModelConfig& c, int max_t, bool save);
  const ModelConfig& config() const { return c_; }
  int max_t() const { return max_t_; }
  bool saves() const { return save_; }
  const BlockSaved& saved() const { return saved_; }
  const float* cos_table() const { return cos_; }   // [max_seq_len, head_dim / 2] (model/weight_convert.h)
  const float* sin_table() const { return sin_; }
  cublasHandle_t cublas() const { return cublas_; }

  // Scratch the forward uses (also free for a backward pass between forwards).
  float* xn = nullptr;       // [max_t, dim]
  float* qkv = nullptr;      // [max_t, q_dim + 2 kv_dim]
  float* scores = nullptr;   // [heads, max_t, max_t]
  float* attn = nullptr;     // [max_t, q_dim]
  float* gu = nullptr;       // [max_t, 2 hidden]
  float* act = nullptr;      // [max_t, hidden]
  float* tmp = nullptr;      // [max_t, dim]

 private:
  ModelConfig c_;
  int max_t_ = 0;
  bool save_ = false;
  BlockSaved saved_;
  float* cos_ = nullptr;
  float* sin_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* arena_ = nullptr;
};

// Called with each linear slot's input (device [rows, k]) before the linears read it, in the order qkv, o, gateup,
// down.
using BlockCaptureFn = std::function<void(LinearSlot slot, const float* x, int rows, int64_t k)>;

// x [T, dim] (device) <- block(x) for one window at positions 0..T-1 (T <= ws.max_t()). With ws.saves() the
// intermediates of this window are left in ws.saved().
// need_output = false: a capture-only pass (its x is thrown away): stops after the down slot's capture, skipping the
// down projection (a fifth of the block's FLOPs); x is then left at the block's midpoint.
void block_forward_f32(const BlockWeightsF32& w, float* x, int T, BlockWorkspace& ws, cudaStream_t stream,
                       const BlockCaptureFn* capture = nullptr, bool need_output = true);

// The element-wise steps, exposed for the backward pass and tests.
// y = x / rms(x) * w per row (sum of squares in double, as the CPU forward).
void rmsnorm_f32(const float* x, const float* w, float* y, int rows, int dim, float eps, cudaStream_t s);
// In place: rotate rows [T, heads * hd] (row stride ld floats) at positions 0..T-1, Hugging Face half-split pairs.
// inverse: rotate by -angle (the transpose, for the backward pass).
void rope_f32(float* x, int64_t ld, int T, int heads, int hd, const float* cos_t, const float* sin_t, bool inverse,
              cudaStream_t s);
// out[t] = silu(g[t]) * u[t]; g and u rows ld floats apart, out rows `width` apart.
void swiglu_f32(const float* g, const float* u, int64_t ld, float* out, int rows, int64_t width, cudaStream_t s);

}  // namespace lowbit::cuda
