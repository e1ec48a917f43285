// The Llama-family model on the CPU, in fp32. Weights come from a WeightSet: fp32 tensors are used in place
// (zero copy), everything else (fp16, bf16, ggml blocks) is converted once at load time.
//
// Two forward paths with one contract:
//   forward()     — the fast path: OpenBLAS sgemm/sgemv for every matmul (prefill batches all tokens),
//                   OpenMP threads for the element-wise work.
//   forward_ref() — plain scalar loops, one token at a time, double accumulation: the oracle for tests.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend_cpu/linear.h"
#include "model/weight_set.h"
#include "runtime/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace lowbit {

struct LayerWeights {
  const float* attn_norm = nullptr;   // [dim]
  const float* ffn_norm = nullptr;    // [dim]
  std::unique_ptr<LinearOp> q, k, v, o;        // q: [q_dim, dim], k/v: [kv_dim, dim], o: [dim, q_dim]
  std::unique_ptr<LinearOp> gate, up, down;    // gate/up: [hidden, dim], down: [dim, hidden]
};

class Model {
 public:
  // Converts and validates: every required tensor present with the exact expected shape.
  static std::unique_ptr<Model> load(WeightSet ws);
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opts = {});

  const ModelConfig& config() const { return ws_.config; }
  const WeightSet& weights() const { return ws_; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  const Tokenizer& tokenizer() const;   // throws when the model file carries no tokenizer

  KVCache new_cache(int capacity) const;

  // Runs tokens[0..n) at positions cache.len.. and appends their K/V. Writes logits [n, vocab] when
  // all_logits, else only the last position's [vocab]. logits may be nullptr (prefill only).
  void forward(const int32_t* tokens, int n, KVCache& cache, float* logits, bool all_logits) const;
  // Scalar oracle: same result, one token at a time.
  void forward_ref(const int32_t* tokens, int n, KVCache& cache, float* logits, bool all_logits) const;

  // fp32 runtime tensors (after dequantization and RoPE un-permutation), by canonical name.
  const float* tensor_f32(const std::string& name) const;
  const std::vector<int64_t>& tensor_shape(const std::string& name) const;
  std::vector<std::string> tensor_names() const;   // in canonical order (embeddings, layers, norm, head)

 private:
  Model() = default;
  void attention(int layer, const float* q, int n, int pos0, KVCache& cache, float* out) const;
  void rope(float* x, int row_stride, int pos0, int n, int heads) const;

  WeightSet ws_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_;
  std::map<std::string, std::pair<const float*, std::vector<int64_t>>> f32_;
  std::vector<std::string> order_;
  const float* tok_emb_ = nullptr;    // [vocab, dim]
  const float* final_norm_ = nullptr; // [dim]
  std::unique_ptr<LinearOp> head_;    // [vocab, dim]
  std::vector<LayerWeights> layers_;
  std::vector<float> rope_cos_, rope_sin_;   // [max_seq, head_dim/2]
};

}  // namespace lowbit
