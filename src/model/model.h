// The Llama-family model on the CPU, in fp32. Weights come from a WeightSet: fp32 tensors are used in place
// (zero copy), everything else (fp16, bf16, ggml blocks) is converted once at load time (model/weight_convert.h: the
// conversion the GPU model loads through too).
//
// Two forward paths with one contract:
//   forward()     — the fast path: OpenBLAS sgemm/sgemv for every matmul (prefill batches all tokens),
//                   OpenMP threads for the element-wise work.
//   forward_ref() — plain scalar loops, one token at a time, double accumulation: the oracle for tests.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend_cpu/linear.h"
#include "model/weight_set.h"
#include "runtime/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace lowbit {

// Which linear layers read a captured activation: q/k/v share the attention-norm output, gate/up share the
// ffn-norm output, o reads the attention output, down reads silu(gate)·up.
enum class LinearSlot { Qkv, O, GateUp, Down };
// The slot whose input each of a block's seven linears reads, in the order of Model::linear_names (q, k, v, o, gate,
// up, down).
inline constexpr LinearSlot kLinearSlot[7] = {LinearSlot::Qkv,    LinearSlot::Qkv,    LinearSlot::Qkv, LinearSlot::O,
                                             LinearSlot::GateUp, LinearSlot::GateUp, LinearSlot::Down};
// Called by layer_forward with each slot's input rows x [n, k] before the linears consume it (calibration).
using LinearInputHook = std::function<void(int layer, LinearSlot slot, const float* x, int n, int64_t k)>;

struct LayerWeights {
  const float* attn_norm = nullptr;   // [dim]
  const float* ffn_norm = nullptr;    // [dim]
  std::unique_ptr<LinearOp> q, k, v, o;        // q: [q_dim, dim], k/v: [kv_dim, dim], o: [dim, q_dim]
  std::unique_ptr<LinearOp> gate, up, down;    // gate/up: [hidden, dim], down: [dim, hidden]
  std::array<const LinearOp*, 7> linears() const {   // in slot order: q, k, v, o, gate, up, down
    return {q.get(), k.get(), v.get(), o.get(), gate.get(), up.get(), down.get()};
  }
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
  // bits: for an any-precision model, the width every quantized linear reads in this call (one of widths();
  // 0 = the widest). One loaded model serves any served width per call, with no reload; a single-precision model
  // accepts only 0.
  void forward(const int32_t* tokens, int n, KVCache& cache, float* logits, bool all_logits, int bits = 0) const;
  // Scalar oracle: same result, one token at a time.
  void forward_ref(const int32_t* tokens, int n, KVCache& cache, float* logits, bool all_logits,
                   int bits = 0) const;
  // One decode step of several sequences together (continuous batching): tokens[i] runs at position
  // caches[i]->len of its own cache, which then advances by one; logits [caches.size(), vocab]. The linears see all
  // the rows at once (one GEMM instead of a GEMV per sequence); attention reads each row's own cache. A batch of one
  // is forward() of one token, bit for bit.
  void forward_batch(const int32_t* tokens, std::span<KVCache* const> caches, float* logits, int bits = 0) const;
  // Widths every quantized linear serves (sorted); empty for a single-precision model.
  std::vector<int> widths() const;
  // Fails with a one-line message unless bits is 0 or one of widths().
  void check_bits(int bits) const;
  // Bytes of weights one decode step reads at that width: every linear (packed formats at their stored size;
  // uniform weights run as decoded fp32) and the fp32 head.
  uint64_t weight_bytes_per_token(int bits = 0) const;

  // The forward split into its stages, for calibration (src/quantize runs blocks one at a time):
  //   embed: x [n, dim] = rows of the embedding;  layer_forward: x <- block l (x) at positions pos0..,
  //   writing K/V into cache at layer l (cache.len is not advanced);  head_forward: logits [n, vocab].
  void embed(const int32_t* tokens, int n, float* x) const;
  void layer_forward(int layer, float* x, int n, int pos0, KVCache& cache, const LinearInputHook* hook,
                     int bits = 0) const;
  // Rows of x that belong to one sequence: n rows at positions pos0.. of cache.
  struct RowSpan {
    KVCache* cache;
    int pos0, n;
  };
  // layer_forward over rows of several sequences, spans in row order (their n summing to the rows of x).
  void layer_forward_spans(int layer, float* x, std::span<const RowSpan> spans, const LinearInputHook* hook,
                           int bits = 0) const;
  void head_forward(const float* x, int n, float* logits) const;

  // Replaces the linear layer of a canonical weight name ("model.layers.3.mlp.down_proj.weight"): quantizers swap
  // in the quantized layer so later blocks see quantized earlier blocks.
  void replace_linear(const std::string& weight_name, std::unique_ptr<LinearOp> op);
  // Canonical names of the linear weights of layer l, in slot order: q, k, v, o, gate, up, down.
  std::vector<std::string> linear_names(int layer) const;

  // fp32 runtime tensors (after dequantization and RoPE un-permutation), by canonical name.
  const float* tensor_f32(const std::string& name) const;
  const std::vector<int64_t>& tensor_shape(const std::string& name) const;
  std::vector<std::string> tensor_names() const;   // fp tensors in canonical order (embeddings, layers, norm, head)
  bool has_packed_weights() const { return !packed_names_.empty(); }
  // RoPE tables as the forward uses them (fp32, Hugging Face convention, llama3 scaling applied):
  // [max_seq_len][head_dim/2], entry (pos, i) = cos/sin(pos * inv_freq[i]). The backward pass reads them.
  const float* rope_cos() const { return rope_cos_.data(); }
  const float* rope_sin() const { return rope_sin_.data(); }

 private:
  Model() = default;
  void attention(int layer, const float* q, int n, int pos0, KVCache& cache, float* out) const;
  std::unique_ptr<LinearOp>& linear_slot(const std::string& weight_name);
  void rope(float* x, int row_stride, int pos0, int n, int heads) const;
  void update_widths();

  WeightSet ws_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_;
  std::map<std::string, std::pair<const float*, std::vector<int64_t>>> f32_;
  std::vector<std::string> order_;
  std::vector<std::string> packed_names_;   // linear weights built from packed formats
  const float* tok_emb_ = nullptr;    // [vocab, dim]
  const float* final_norm_ = nullptr; // [dim]
  std::unique_ptr<LinearOp> head_;    // [vocab, dim]
  std::vector<LayerWeights> layers_;
  std::vector<float> rope_cos_, rope_sin_;   // [max_seq, head_dim/2]
  uint32_t widths_ = 0;                      // intersection of the linears' served_widths() (0: none)
};

}  // namespace lowbit
