// Llama-family model configuration. One struct describes Llama 2/3, Mistral, Qwen2 and SmolLM; anything the
// forward pass cannot honour is refused at load time (validate()) with a message naming the option.
#pragma once
#include <cstdint>
#include <string>

namespace lowbit {

enum class RopeScaling { None, Llama3 };

struct ModelConfig {
  std::string arch = "llama";      // llama | mistral | qwen2 (SmolLM uses llama)
  std::string name;                // general.name / _name_or_path, informational
  int dim = 0;                     // hidden size
  int hidden_dim = 0;              // FFN intermediate size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;              // GQA: n_heads % n_kv_heads == 0
  int head_dim = 0;                // usually dim / n_heads, but explicit in some configs
  int vocab_size = 0;
  int max_seq_len = 2048;          // max_position_embeddings
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tie_embeddings = false;     // output head shares the token embedding
  bool qkv_bias = false;           // Qwen2
  // rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}
  RopeScaling rope_scaling = RopeScaling::None;
  float rope_factor = 1.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int rope_original_max_pos = 8192;
  int sliding_window = 0;          // Mistral: 0 = full attention (windows >= context are equivalent)
  int32_t bos_id = -1, eos_id = -1;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Throws lowbit::Error("<source>: <problem>") for inconsistent or unsupported settings.
  void validate(const std::string& source) const;
  std::string to_hf_json(const std::string& torch_dtype) const;  // config.json for `lowbit convert`
};

// Parses a Hugging Face config.json. Unsupported architectures/options are refused with a clear message.
ModelConfig config_from_hf_json(const std::string& config_json_path);
// The same, from the JSON text itself (e.g. the config object a .lowbit file carries); errors name `source`.
ModelConfig config_from_hf_json_text(const std::string& text, const std::string& source);

}  // namespace lowbit
