#include "model/config.h"

#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lowbit {

void ModelConfig::validate(const std::string& src) const {
  LOWBIT_CHECK(dim > 0 && hidden_dim > 0 && n_layers > 0 && n_heads > 0 && n_kv_heads > 0 && vocab_size > 0,
               src, ": config has a non-positive size (dim ", dim, ", hidden ", hidden_dim, ", layers ", n_layers,
               ", heads ", n_heads, ", kv heads ", n_kv_heads, ", vocab ", vocab_size, ")");
  LOWBIT_CHECK(n_heads % n_kv_heads == 0, src, ": n_heads ", n_heads, " is not a multiple of n_kv_heads ",
               n_kv_heads);
  LOWBIT_CHECK(head_dim > 0 && head_dim % 2 == 0, src, ": head_dim ", head_dim, " must be positive and even");
  LOWBIT_CHECK(max_seq_len > 0, src, ": max_position_embeddings must be positive");
  LOWBIT_CHECK(rope_theta > 0 && rms_eps > 0, src, ": rope_theta and rms eps must be positive");
  LOWBIT_CHECK(arch == "llama" || arch == "mistral" || arch == "qwen2", src, ": unsupported architecture '",
               arch, "' (supported: llama, mistral, qwen2)");
}

std::string ModelConfig::to_hf_json(const std::string& torch_dtype) const {
  nlohmann::ordered_json j;
  const bool qwen = arch == "qwen2";
  j["architectures"] = {qwen ? "Qwen2ForCausalLM" : arch == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = arch;
  j["hidden_size"] = dim;
  j["intermediate_size"] = hidden_dim;
  j["num_hidden_layers"] = n_layers;
  j["num_attention_heads"] = n_heads;
  j["num_key_value_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_seq_len;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_eps;
  j["tie_word_embeddings"] = tie_embeddings;
  j["hidden_act"] = "silu";
  if (!qwen) j["attention_bias"] = qkv_bias;
  j["mlp_bias"] = false;
  if (bos_id >= 0) j["bos_token_id"] = bos_id;
  if (eos_id >= 0) j["eos_token_id"] = eos_id;
  if (rope_scaling == RopeScaling::Llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_factor},
                         {"low_freq_factor", rope_low_freq_factor},
                         {"high_freq_factor", rope_high_freq_factor},
                         {"original_max_position_embeddings", rope_original_max_pos}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (arch == "mistral" || qwen) j["sliding_window"] = sliding_window > 0 ? nlohmann::ordered_json(sliding_window) : nullptr;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

ModelConfig config_from_hf_json(const std::string& path) {
  std::ifstream f(path);
  LOWBIT_CHECK(f.good(), path, ": cannot open");
  std::ostringstream text;
  text << f.rdbuf();
  LOWBIT_CHECK(!f.bad(), path, ": cannot read");
  return config_from_hf_json_text(text.str(), path);
}

ModelConfig config_from_hf_json_text(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
  LOWBIT_CHECK(j.is_object(), path, ": expected a JSON object");
  ModelConfig c;
  auto get_int = [&](const char* key, int def, bool required) -> int {
    if (!j.contains(key) || j[key].is_null()) {
      LOWBIT_CHECK(!required, path, ": missing required key '", key, "'");
      return def;
    }
    LOWBIT_CHECK(j[key].is_number_integer(), path, ": key '", key, "' must be an integer");
    return j[key].get<int>();
  };
  auto get_float = [&](const nlohmann::json& o, const char* key, float def) -> float {
    if (!o.contains(key) || o[key].is_null()) return def;
    LOWBIT_CHECK(o[key].is_number(), path, ": key '", key, "' must be a number");
    return o[key].get<float>();
  };
  std::string model_type = j.value("model_type", "");
  if (model_type.empty() && j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty()) {
    const std::string a = j["architectures"][0].get<std::string>();
    model_type = a == "MistralForCausalLM" ? "mistral" : a == "Qwen2ForCausalLM" ? "qwen2" : a == "LlamaForCausalLM" ? "llama" : a;
  }
  LOWBIT_CHECK(model_type == "llama" || model_type == "mistral" || model_type == "qwen2", path,
               ": unsupported model_type '", model_type, "' (supported: llama, mistral, qwen2)");
  c.arch = model_type;
  c.name = j.value("_name_or_path", "");
  c.dim = get_int("hidden_size", 0, true);
  c.hidden_dim = get_int("intermediate_size", 0, true);
  c.n_layers = get_int("num_hidden_layers", 0, true);
  c.n_heads = get_int("num_attention_heads", 0, true);
  c.n_kv_heads = get_int("num_key_value_heads", c.n_heads, false);
  c.head_dim = get_int("head_dim", c.n_heads > 0 ? c.dim / c.n_heads : 0, false);
  c.vocab_size = get_int("vocab_size", 0, true);
  c.max_seq_len = get_int("max_position_embeddings", 2048, false);
  c.rope_theta = get_float(j, "rope_theta", 10000.0f);
  c.rms_eps = get_float(j, "rms_norm_eps", 1e-6f);
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  c.qkv_bias = model_type == "qwen2" ? true : j.value("attention_bias", false);
  LOWBIT_CHECK(!j.value("mlp_bias", false), path, ": mlp_bias=true is not supported");
  const std::string act = j.value("hidden_act", "silu");
  LOWBIT_CHECK(act == "silu", path, ": unsupported hidden_act '", act, "' (only silu / SwiGLU)");
  if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    const bool use_sw = model_type == "qwen2" ? j.value("use_sliding_window", false) : true;
    if (use_sw) c.sliding_window = j["sliding_window"].get<int>();
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_id = j["bos_token_id"];
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_id = j["eos_token_id"];
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty())
    c.eos_id = j["eos_token_id"][0];
  // transformers < 5 writes rope_theta + rope_scaling; transformers 5 writes both into rope_parameters.
  const char* rope_key = j.contains("rope_parameters") && !j["rope_parameters"].is_null() ? "rope_parameters"
                         : "rope_scaling";
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    c.rope_theta = get_float(j["rope_parameters"], "rope_theta", c.rope_theta);
  if (j.contains(rope_key) && !j[rope_key].is_null()) {
    const auto& rs = j[rope_key];
    LOWBIT_CHECK(rs.is_object(), path, ": ", rope_key, " must be an object");
    const std::string type = rs.value("rope_type", rs.value("type", ""));
    if (type == "llama3") {
      c.rope_scaling = RopeScaling::Llama3;
      c.rope_factor = get_float(rs, "factor", 8.0f);
      c.rope_low_freq_factor = get_float(rs, "low_freq_factor", 1.0f);
      c.rope_high_freq_factor = get_float(rs, "high_freq_factor", 4.0f);
      c.rope_original_max_pos = rs.value("original_max_position_embeddings", 8192);
    } else if (!type.empty() && type != "default") {
      fail(path, ": unsupported rope scaling type '", type, "' (supported: default, llama3)");
    }
  }
  c.validate(path);
  return c;
}

}  // namespace lowbit
