// GGUF model reader: maps llama.cpp tensor names to canonical Hugging Face names and the "<arch>.*" metadata
// to ModelConfig. Tensors stay in the file (zero copy, possibly block-quantized); loading dequantizes them
// (model/weight_convert.h).

#include "core/error.h"
#include "io/gguf.h"
#include "model/weight_set.h"
#include "tokenizer/gguf_vocab.h"

namespace lowbit {

namespace {

// llama.cpp per-block tensor names -> Hugging Face names.
const std::pair<const char*, const char*> kBlockNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

std::string canonical_name(const std::string& path, const std::string& name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name == "rope_freqs.weight")
    fail(path, ": tensor rope_freqs.weight (per-frequency RoPE factors) is not supported yet");
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    if (dot != std::string::npos) {
      const std::string layer = name.substr(4, dot - 4);
      const std::string rest = name.substr(dot + 1);
      for (const auto& [g, hf] : kBlockNames)
        if (rest == g) return "model.layers." + layer + "." + hf;
    }
  }
  fail(path, ": unexpected tensor '", name, "' for a Llama-family model");
}

}  // namespace

WeightSet read_gguf_model(const std::string& path) {
  GgufFile g = GgufFile::open(path);
  WeightSet ws;
  ws.path = path;
  ws.format = ModelFormat::Gguf;
  ws.files.push_back(g.file());
  const std::string arch = g.get_string("general.architecture");
  LOWBIT_CHECK(arch == "llama" || arch == "qwen2" || arch == "mistral", path, ": unsupported architecture '", arch,
               "' (supported: llama, mistral, qwen2)");
  ModelConfig& c = ws.config;
  c.arch = arch == "qwen2" ? "qwen2" : "llama";
  c.name = g.get_string_or("general.name", "");
  c.dim = static_cast<int>(g.get_int(arch + ".embedding_length"));
  c.hidden_dim = static_cast<int>(g.get_int(arch + ".feed_forward_length"));
  c.n_layers = static_cast<int>(g.get_int(arch + ".block_count"));
  c.n_heads = static_cast<int>(g.get_int(arch + ".attention.head_count"));
  c.n_kv_heads = static_cast<int>(g.get_int_or(arch + ".attention.head_count_kv", c.n_heads));
  c.head_dim = static_cast<int>(g.get_int_or(arch + ".attention.key_length", c.n_heads ? c.dim / c.n_heads : 0));
  c.max_seq_len = static_cast<int>(g.get_int_or(arch + ".context_length", 2048));
  c.rope_theta = static_cast<float>(g.get_float_or(arch + ".rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(g.get_float_or(arch + ".attention.layer_norm_rms_epsilon", 1e-5));
  const std::string scaling = g.get_string_or(arch + ".rope.scaling.type", "none");
  LOWBIT_CHECK(scaling == "none", path, ": rope scaling type '", scaling, "' is not supported");
  const int64_t rope_dims = g.get_int_or(arch + ".rope.dimension_count", c.head_dim);
  LOWBIT_CHECK(rope_dims == c.head_dim, path, ": partial RoPE (", rope_dims, " of ", c.head_dim,
               " dims) is not supported");

  for (const GgufTensorInfo& t : g.tensors()) {
    const std::string name = canonical_name(path, t.name);
    ws.tensors[name] = TensorView{name, t.dtype, t.shape, t.data, t.nbytes};
    ws.source_names[name] = t.name;
  }
  c.tie_embeddings = ws.tensors.count("lm_head.weight") == 0;
  c.qkv_bias = ws.tensors.count("model.layers.0.self_attn.q_proj.bias") != 0;
  const TensorView* emb = ws.tensors.count("model.embed_tokens.weight") ? &ws.tensors["model.embed_tokens.weight"] : nullptr;
  LOWBIT_CHECK(emb != nullptr && emb->shape.size() == 2, path, ": missing tensor token_embd.weight");
  c.vocab_size = static_cast<int>(g.get_int_or(arch + ".vocab_size", emb->shape[0]));
  // convert_hf_to_gguf permutes q/k rows of "llama" models so that RoPE rotates adjacent pairs.
  ws.qk_interleaved = arch == "llama" || arch == "mistral";
  if (g.has("tokenizer.ggml.model")) {
    ws.vocab = vocab_from_gguf(g);
    c.bos_id = ws.vocab->bos_id;
    c.eos_id = ws.vocab->eos_id;
  }
  c.validate(path);
  return ws;
}

}  // namespace lowbit
