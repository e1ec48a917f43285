// Format detection and the llama2.c / Hugging Face readers. The GGUF reader is in read_gguf_model.cpp, the synthetic
// "random:<preset>" sources in random_model.cpp.
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/lowbit_file.h"
#include "io/safetensors.h"
#include "model/random_model.h"
#include "model/weight_set.h"

namespace lowbit {

namespace fs = std::filesystem;

const char* model_format_name(ModelFormat f) {
  switch (f) {
    case ModelFormat::HuggingFace: return "huggingface";
    case ModelFormat::Gguf: return "gguf";
    case ModelFormat::Llama2c: return "llama2.c";
    case ModelFormat::Lowbit: return "lowbit";
    case ModelFormat::Random: return "random";
  }
  return "?";
}

namespace {

// LoadOptions::quik_abits: rewrites the activation parameters of every quik weight (validated again on load).
void override_quik_abits(WeightSet& ws, const std::string& abits) {
  LOWBIT_CHECK(abits == "4" || abits == "8" || abits == "16" || abits == "fp8", "--abits must be 4, 8, 16 or fp8, got '",
               abits, "'");
  int quik = 0;
  for (auto& [name, w] : ws.packed) {
    if (w.format != FormatId::Quik) continue;
    ++quik;
    const bool fp8 = abits == "fp8";
    LOWBIT_CHECK(!fp8 || w.params.at("wbits") == 4, ws.path, ": ", name, " has 8-bit weights; FP8 activations need W4");
    w.params["abits"] = fp8 ? 8 : std::stoi(abits);
    w.params["act_fp8"] = fp8 ? 1 : 0;
  }
  LOWBIT_CHECK(quik > 0, ws.path, ": --abits applies to QUIK models only (this one has no quik weights)");
}

}  // namespace

WeightSet read_weights(const std::string& path, const LoadOptions& opts) {
  if (!opts.quik_abits.empty()) {
    LoadOptions plain = opts;
    plain.quik_abits.clear();
    WeightSet ws = read_weights(path, plain);
    override_quik_abits(ws, opts.quik_abits);
    return ws;
  }
  if (is_random_source(path)) return read_random_model(path);   // synthetic: no file behind it
  std::error_code ec;
  LOWBIT_CHECK(fs::exists(path, ec), path, ": no such file or directory");
  if (fs::is_directory(path, ec)) return read_hf_dir(path);
  // .lowbit container: a safetensors file whose metadata carries "lowbit" (whatever its name); a file named
  // .lowbit always goes to read_lowbit, so a damaged one gets its error rather than a format guess.
  if (fs::path(path).extension() == ".lowbit" || is_lowbit_file(path)) return read_lowbit(path);
  auto file = MappedFile::open(path);
  LOWBIT_CHECK(file->size() >= 4, path, ": file too small (", file->size(), " bytes) to be a model");
  if (std::memcmp(file->data(), "GGUF", 4) == 0) return read_gguf_model(path);
  if (path.size() >= 12 && path.substr(path.size() - 12) == ".safetensors")
    fail(path, ": a bare .safetensors file has no config; pass the Hugging Face directory that holds it");
  // llama2.c checkpoints have no magic; read_llama2c validates the header against the file size.
  std::string tok = opts.tokenizer_path;
  if (tok.empty()) {
    const fs::path dir = fs::path(path).parent_path();
    for (const char* cand : {"tokenizer.bin", "tok512.bin", "tok4096.bin"}) {
      if (fs::exists(dir / cand, ec)) {
        tok = (dir / cand).string();
        break;
      }
    }
  }
  return read_llama2c(path, tok);
}

// ---------------------------------------------------------------------------------------------------------
// llama2.c legacy checkpoint: 7 x int32 header, then fp32 tensors (see shared/models/stories260K/PROVENANCE.md).
WeightSet read_llama2c(const std::string& path, const std::string& tokenizer_path) {
  WeightSet ws;
  ws.path = path;
  ws.format = ModelFormat::Llama2c;
  auto file = MappedFile::open(path);
  ws.files.push_back(file);
  LOWBIT_CHECK(file->size() >= 28, path, ": not a model file (unknown format: no GGUF magic, too short for a "
               "llama2.c header)");
  int32_t h[7];
  std::memcpy(h, file->data(), sizeof(h));
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], seq = h[6];
  const bool shared = h[5] > 0;
  const int64_t vocab = shared ? h[5] : -static_cast<int64_t>(h[5]);
  const bool plausible = dim > 0 && dim <= 65536 && hidden > 0 && hidden <= 262144 && layers > 0 &&
                         layers <= 1024 && heads > 0 && heads <= dim && kv_heads > 0 && kv_heads <= heads &&
                         vocab > 0 && vocab <= 1048576 && seq > 0 && seq <= 1048576 && dim % heads == 0 &&
                         heads % kv_heads == 0;
  LOWBIT_CHECK(plausible, path, ": not a model file (no GGUF magic, and the llama2.c header is implausible: dim ",
               dim, ", hidden ", hidden, ", layers ", layers, ", heads ", heads, ", kv_heads ", kv_heads,
               ", vocab ", h[5], ", seq_len ", seq, ")");
  const int64_t hs = dim / heads, kv_dim = kv_heads * hs;
  struct Part { std::string name; std::vector<int64_t> shape; bool per_layer; };
  const std::vector<Part> parts = {
      {"model.embed_tokens.weight", {vocab, dim}, false},
      {"input_layernorm.weight", {dim}, true},
      {"self_attn.q_proj.weight", {dim, dim}, true},
      {"self_attn.k_proj.weight", {kv_dim, dim}, true},
      {"self_attn.v_proj.weight", {kv_dim, dim}, true},
      {"self_attn.o_proj.weight", {dim, dim}, true},
      {"post_attention_layernorm.weight", {dim}, true},
      {"mlp.gate_proj.weight", {hidden, dim}, true},
      {"mlp.down_proj.weight", {dim, hidden}, true},
      {"mlp.up_proj.weight", {hidden, dim}, true},
      {"model.norm.weight", {dim}, false},
  };
  uint64_t off = 28;
  for (const Part& p : parts) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * 4;
    const int64_t count = p.per_layer ? layers : 1;
    LOWBIT_CHECK(file->in_bounds(off, bytes * count), path, ": truncated llama2.c checkpoint: tensor ", p.name,
                 " needs bytes [", off, ", ", off + bytes * count, ") but the file has ", file->size());
    for (int64_t l = 0; l < count; ++l) {
      TensorView t;
      t.name = p.per_layer ? "model.layers." + std::to_string(l) + "." + p.name : p.name;
      t.dtype = DType::F32;
      t.shape = p.shape;
      t.data = file->data() + off + bytes * l;
      t.nbytes = bytes;
      ws.source_names[t.name] = t.name;
      ws.tensors[t.name] = t;
    }
    off += bytes * count;
  }
  // freq_cis_real / freq_cis_imag [seq, hs/2] each: unused (RoPE is recomputed), but must be present.
  const uint64_t freq_bytes = static_cast<uint64_t>(seq) * (hs / 2) * 4 * 2;
  LOWBIT_CHECK(file->in_bounds(off, freq_bytes), path, ": truncated llama2.c checkpoint (freq_cis tables)");
  off += freq_bytes;
  if (!shared) {
    const uint64_t bytes = static_cast<uint64_t>(vocab) * dim * 4;
    LOWBIT_CHECK(file->in_bounds(off, bytes), path, ": truncated llama2.c checkpoint (classifier weights)");
    TensorView t{"lm_head.weight", DType::F32, {vocab, dim}, file->data() + off, bytes};
    ws.tensors[t.name] = t;
    off += bytes;
  }
  LOWBIT_CHECK(off == file->size(), path, ": llama2.c checkpoint size mismatch: header implies ", off,
               " bytes, file has ", file->size());

  ModelConfig& c = ws.config;
  c.arch = "llama";
  c.name = fs::path(path).stem().string();
  c.dim = static_cast<int>(dim);
  c.hidden_dim = static_cast<int>(hidden);
  c.n_layers = static_cast<int>(layers);
  c.n_heads = static_cast<int>(heads);
  c.n_kv_heads = static_cast<int>(kv_heads);
  c.head_dim = static_cast<int>(hs);
  c.vocab_size = static_cast<int>(vocab);
  c.max_seq_len = static_cast<int>(seq);
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.tie_embeddings = shared;
  c.bos_id = 1;
  c.eos_id = 2;
  c.validate(path);
  ws.qk_interleaved = true;  // llama2.c rotates adjacent pairs
  if (!tokenizer_path.empty()) ws.vocab = read_llama2c_tokenizer(tokenizer_path, c.vocab_size);
  return ws;
}

// ---------------------------------------------------------------------------------------------------------
// Hugging Face directory: config.json + model.safetensors (or sharded, with model.safetensors.index.json).
WeightSet read_hf_dir(const std::string& dir) {
  WeightSet ws;
  ws.path = dir;
  ws.format = ModelFormat::HuggingFace;
  const fs::path d(dir);
  std::error_code ec;
  LOWBIT_CHECK(fs::exists(d / "config.json", ec), dir, ": not a Hugging Face model directory (no config.json)");
  ws.config = config_from_hf_json((d / "config.json").string());

  std::vector<std::string> shards;
  if (fs::exists(d / "model.safetensors.index.json", ec)) {
    const std::string idx = (d / "model.safetensors.index.json").string();
    std::ifstream f(idx);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      fail(idx, ": invalid JSON: ", e.what());
    }
    LOWBIT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), idx,
                 ": missing object 'weight_map'");
    for (auto& [name, shard] : j["weight_map"].items()) {
      LOWBIT_CHECK(shard.is_string(), idx, ": weight_map entry for ", name, " is not a file name");
      const std::string s = shard.get<std::string>();
      LOWBIT_CHECK(s.find('/') == std::string::npos && s.find("..") == std::string::npos, idx,
                   ": shard name '", s, "' must be a plain file name in the directory");
      if (std::find(shards.begin(), shards.end(), s) == shards.end()) shards.push_back(s);
    }
  } else if (fs::exists(d / "model.safetensors", ec)) {
    shards.push_back("model.safetensors");
  } else {
    fail(dir, ": no model.safetensors or model.safetensors.index.json");
  }
  for (const std::string& s : shards) {
    SafetensorsFile st = SafetensorsFile::open((d / s).string());
    ws.files.push_back(st.file());
    for (const auto& [name, view] : st.tensors()) {
      LOWBIT_CHECK(!ws.tensors.count(name), (d / s).string(), ": tensor ", name, " also appears in another shard");
      LOWBIT_CHECK(view.dtype == DType::F32 || view.dtype == DType::F16 || view.dtype == DType::BF16,
                   (d / s).string(), ": tensor ", name, " has dtype ", dtype_info(view.dtype).name,
                   " (supported: F32, F16, BF16)");
      ws.tensors[name] = view;
      ws.source_names[name] = s + ":" + name;
    }
  }
  if (fs::exists(d / "tokenizer.json", ec)) {
    const std::string cfg = fs::exists(d / "tokenizer_config.json", ec) ? (d / "tokenizer_config.json").string() : "";
    ws.vocab = read_tokenizer_json((d / "tokenizer.json").string(), cfg);
  } else if (fs::exists(d / "tokenizer.model", ec)) {
    ws.vocab = read_sentencepiece_model((d / "tokenizer.model").string());
  }
  if (ws.vocab) {
    if (ws.config.bos_id < 0) ws.config.bos_id = ws.vocab->bos_id;
    if (ws.config.eos_id < 0) ws.config.eos_id = ws.vocab->eos_id;
    if (ws.vocab->eos_id < 0) ws.vocab->eos_id = ws.config.eos_id;
    if (ws.vocab->bos_id < 0) ws.vocab->bos_id = ws.config.bos_id;
  }
  return ws;
}

}  // namespace lowbit
