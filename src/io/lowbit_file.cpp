// The .lowbit container writer and reader (see lowbit_file.h; schema in docs/formats/lowbit-container.md).
//
// The JSON lives in one safetensors metadata string, so the safetensors layer only sees a string; this file
// parses it, rejecting duplicate keys at every depth (nlohmann::json would silently keep the last one) and any
// key the schema does not define (a misspelt key must not silently drop data).
#include "io/lowbit_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/format_table.h"
#include "tokenizer/vocab_json.h"

namespace lowbit {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr char kDenseFormat[] = "dense";
// safetensors refuses headers above 100 MB (its reference implementation's limit, io/safetensors.cpp); the lowbit
// JSON is most of the header, so a larger one is refused at write time rather than producing an unreadable file.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
constexpr uint64_t kMaxMetadataBytes = 96ull << 20;  // leaves room for the tensor entries
// Dense tensors are the fp tensors Model::load reads (as the Hugging Face reader accepts them).
constexpr DType kDenseDTypes[] = {DType::F32, DType::F16, DType::BF16};

bool is_dense_dtype(DType t) { return std::find(std::begin(kDenseDTypes), std::end(kDenseDTypes), t) != std::end(kDenseDTypes); }

const char* torch_dtype_name(DType t) {
  return t == DType::F16 ? "float16" : t == DType::BF16 ? "bfloat16" : "float32";
}

// Parses `text`, failing on bad JSON or a key repeated within one object.
ordered_json parse_strict(const std::string& text, const std::string& where) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const ordered_json::parser_callback_t check = [&](int, ordered_json::parse_event_t event, ordered_json& parsed) {
    switch (event) {
      case ordered_json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case ordered_json::parse_event_t::object_end: open_objects.pop_back(); break;
      case ordered_json::parse_event_t::key:
        if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  ordered_json j;
  try {
    j = ordered_json::parse(text, check);
  } catch (const ordered_json::exception& e) {
    fail(where, " is not valid JSON: ", e.what());
  }
  LOWBIT_CHECK(duplicate.empty(), where, " has the key \"", duplicate, "\" twice in one object");
  return j;
}

// Fails unless `j` is an object with exactly `keys`.
void expect_keys(const ordered_json& j, std::initializer_list<const char*> keys, const std::string& where) {
  LOWBIT_CHECK(j.is_object(), where, " must be a JSON object, got ", j.type_name());
  const std::set<std::string> want(keys.begin(), keys.end());
  for (const auto& [key, value] : j.items()) LOWBIT_CHECK(want.count(key), where, " has an unknown key \"", key, "\"");
  for (const std::string& key : want) LOWBIT_CHECK(j.contains(key), where, " has no \"", key, "\"");
}

const std::string& string_at(const ordered_json& j, const char* key, const std::string& where) {
  LOWBIT_CHECK(j[key].is_string(), where, ".", key, " must be a string");
  return j[key].get_ref<const std::string&>();
}

// Each field of ModelConfig; the name of the first one that differs, or nullptr.
const char* config_difference(const ModelConfig& a, const ModelConfig& b) {
  if (a.arch != b.arch) return "arch";
  if (a.name != b.name) return "name";
  if (a.dim != b.dim) return "dim";
  if (a.hidden_dim != b.hidden_dim) return "hidden_dim";
  if (a.n_layers != b.n_layers) return "n_layers";
  if (a.n_heads != b.n_heads) return "n_heads";
  if (a.n_kv_heads != b.n_kv_heads) return "n_kv_heads";
  if (a.head_dim != b.head_dim) return "head_dim";
  if (a.vocab_size != b.vocab_size) return "vocab_size";
  if (a.max_seq_len != b.max_seq_len) return "max_seq_len";
  if (a.rope_theta != b.rope_theta) return "rope_theta";
  if (a.rms_eps != b.rms_eps) return "rms_eps";
  if (a.tie_embeddings != b.tie_embeddings) return "tie_embeddings";
  if (a.qkv_bias != b.qkv_bias) return "qkv_bias";
  if (a.rope_scaling != b.rope_scaling) return "rope_scaling";
  if (a.rope_scaling == RopeScaling::Llama3) {  // the factors mean nothing without scaling
    if (a.rope_factor != b.rope_factor) return "rope_factor";
    if (a.rope_low_freq_factor != b.rope_low_freq_factor) return "rope_low_freq_factor";
    if (a.rope_high_freq_factor != b.rope_high_freq_factor) return "rope_high_freq_factor";
    if (a.rope_original_max_pos != b.rope_original_max_pos) return "rope_original_max_pos";
  }
  if (a.sliding_window != b.sliding_window) return "sliding_window";
  if (a.bos_id != b.bos_id) return "bos_id";
  if (a.eos_id != b.eos_id) return "eos_id";
  return nullptr;
}

// The Hugging Face config.json object for `c`, plus the keys to_hf_json leaves out that the reader needs for an
// exact round trip (the model name; Qwen2's use_sliding_window switch).
ordered_json config_object(const ModelConfig& c, const std::string& torch_dtype) {
  ordered_json j = ordered_json::parse(c.to_hf_json(torch_dtype));
  if (!c.name.empty()) j["_name_or_path"] = c.name;
  if (c.arch == "qwen2" && c.sliding_window > 0) j["use_sliding_window"] = true;
  return j;
}

uint64_t numel_of(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The "bits" object: what the packed weights cost, and what the whole data section costs per parameter.
// file_bits_per_param counts the tensor data (dense + packed) only — the header cannot contain its own size.
struct BitCounts {
  int64_t quantized_weights = 0;
  uint64_t quantized_bits = 0;
  uint64_t params = 0;       // dense numel + packed n*k
  uint64_t data_bytes = 0;   // every tensor byte in the file

  double avg_bits_per_weight() const {
    return quantized_weights > 0 ? static_cast<double>(quantized_bits) / static_cast<double>(quantized_weights) : 0.0;
  }
  double file_bits_per_param() const {
    return params > 0 ? 8.0 * static_cast<double>(data_bytes) / static_cast<double>(params) : 0.0;
  }
  ordered_json to_json() const {
    return {{"quantized_weights", quantized_weights},
            {"quantized_bits", quantized_bits},
            {"avg_bits_per_weight", avg_bits_per_weight()},
            {"file_bits_per_param", file_bits_per_param()}};
  }
};

// The lowbit metadata of an open safetensors file: present, well-formed, a supported version, the exact key set.
ordered_json lowbit_metadata(const SafetensorsFile& st) {
  const std::string& path = st.path();
  const auto it = st.metadata().find(kLowbitMetadataKey);
  LOWBIT_CHECK(it != st.metadata().end(), path, ": not a .lowbit file: the safetensors metadata has no \"",
               kLowbitMetadataKey, "\" key");
  ordered_json j = parse_strict(it->second, path + ": lowbit metadata");
  LOWBIT_CHECK(j.is_object(), path, ": lowbit metadata must be a JSON object, got ", j.type_name());
  LOWBIT_CHECK(j.contains("format_version"), path, ": lowbit metadata has no format_version");
  const ordered_json& version = j["format_version"];
  LOWBIT_CHECK(version.is_number_integer() && version.get<int64_t>() == kLowbitFormatVersion, path,
               ": unsupported lowbit format_version ", version.dump(), " (this build reads version ",
               kLowbitFormatVersion, ")");
  expect_keys(j, {"format_version", "source", "config", "tokenizer", "method", "tensors", "bits"},
              path + ": lowbit metadata");
  expect_keys(j["source"], {"path", "format"}, path + ": lowbit metadata source");
  string_at(j["source"], "path", path + ": lowbit metadata source");
  string_at(j["source"], "format", path + ": lowbit metadata source");
  LOWBIT_CHECK(j["method"].is_object(), path, ": lowbit metadata method must be a JSON object");
  LOWBIT_CHECK(j["tensors"].is_object(), path, ": lowbit metadata tensors must be a JSON object");
  LOWBIT_CHECK(j["config"].is_object(), path, ": lowbit metadata config must be a JSON object");
  return j;
}

bool close_enough(double stored, double computed) {
  return std::abs(stored - computed) <= 1e-12 * std::max(1.0, std::abs(computed));
}

}  // namespace

LowbitSummary write_lowbit(const std::string& path, const LowbitWriteSpec& spec) {
  // ---- validate the whole spec before a byte is written ----
  spec.config.validate(path + ": config");
  const ordered_json method = parse_strict(spec.method_json, path + ": method JSON");
  LOWBIT_CHECK(method.is_object(), path, ": method JSON must be an object, got ", method.type_name());

  BitCounts bits;
  std::set<std::string> names;
  ordered_json tensors = ordered_json::object();
  std::vector<SafetensorsWriteTensor> out;
  for (const SafetensorsWriteTensor& t : spec.dense) {
    LOWBIT_CHECK(!t.name.empty(), path, ": a dense tensor has an empty name");
    LOWBIT_CHECK(names.insert(t.name).second, path, ": tensor ", t.name, " is given twice");
    LOWBIT_CHECK(is_dense_dtype(t.dtype), path, ": dense tensor ", t.name, " has dtype ", dtype_info(t.dtype).name,
                 " (dense tensors are F32, F16 or BF16)");
    for (int64_t d : t.shape) LOWBIT_CHECK(d >= 0, path, ": dense tensor ", t.name, " has shape ", shape_str(t.shape));
    const uint64_t numel = numel_of(t.shape);
    LOWBIT_CHECK(numel == 0 || t.data != nullptr, path, ": dense tensor ", t.name, " has no data");
    tensors[t.name] = {{"format", kDenseFormat}, {"dtype", dtype_info(t.dtype).name}};
    bits.params += numel;
    bits.data_bytes += dtype_bytes(t.dtype, numel);
    out.push_back(t);
  }
  for (const auto& [name, w] : spec.packed) {
    const std::string where = path + ": tensor " + name;
    LOWBIT_CHECK(!name.empty(), path, ": a packed weight has an empty name");
    LOWBIT_CHECK(names.insert(name).second, path, ": tensor ", name, " is given both dense and packed");
    validate_packed(w, where);
    const uint64_t stored = packed_stored_bits(w, where);
    bits.quantized_weights += w.shape[0] * w.shape[1];
    bits.quantized_bits += stored;
    bits.params += static_cast<uint64_t>(w.shape[0] * w.shape[1]);
    ordered_json parts = ordered_json::object();
    for (const auto& [part, view] : w.parts) {
      const std::string stored_name = name + "." + part;
      parts[part] = stored_name;
      out.push_back({stored_name, view.dtype, view.shape, view.data});
      bits.data_bytes += view.nbytes;
    }
    ordered_json params = ordered_json::object();
    for (const auto& [key, value] : w.params) params[key] = value;
    tensors[name] = {{"format", std::string(format_name(w.format))}, {"shape", w.shape}, {"params", params}, {"parts", parts}};
  }
  // A part's stored name ("<weight>.<part>") must not collide with a dense tensor's name.
  std::set<std::string> stored_names;
  for (const SafetensorsWriteTensor& t : out)
    LOWBIT_CHECK(stored_names.insert(t.name).second, path, ": two tensors would be stored as ", t.name);

  // config.json's torch_dtype (informational): the dtype holding most of the dense bytes.
  std::map<DType, uint64_t> dense_bytes;
  for (const SafetensorsWriteTensor& t : spec.dense) dense_bytes[t.dtype] += dtype_bytes(t.dtype, numel_of(t.shape));
  DType main_dtype = DType::F32;
  uint64_t most = 0;
  for (const auto& [dtype, n] : dense_bytes) {
    if (n > most) main_dtype = dtype, most = n;
  }
  const std::string torch_dtype = torch_dtype_name(main_dtype);
  const ordered_json config = config_object(spec.config, torch_dtype);
  const char* lost = config_difference(spec.config, config_from_hf_json_text(config.dump(), path + ": config"));
  LOWBIT_CHECK(lost == nullptr, path, ": config field ", lost == nullptr ? "" : lost,
               " does not survive the Hugging Face config.json form; refusing to write a file that would load "
               "differently");

  ordered_json meta;
  meta["format_version"] = kLowbitFormatVersion;
  meta["source"] = {{"path", spec.source_path}, {"format", spec.source_format}};
  meta["config"] = config;
  meta["tokenizer"] = spec.vocab ? vocab_to_json(*spec.vocab) : ordered_json(nullptr);
  meta["method"] = method;
  meta["tensors"] = tensors;
  meta["bits"] = bits.to_json();
  std::string text;
  try {
    text = meta.dump();
  } catch (const ordered_json::exception& e) {  // e.g. a source path or model name that is not UTF-8
    fail(path, ": cannot encode the lowbit metadata as JSON: ", e.what());
  }
  LOWBIT_CHECK(text.size() <= kMaxMetadataBytes, path, ": lowbit metadata is ", text.size(),
               " bytes, above the ", kMaxMetadataBytes, "-byte limit safetensors readers enforce on the header");

  write_safetensors(path, out, {{kLowbitMetadataKey, text}});

  LowbitSummary summary;
  summary.quantized_weights = bits.quantized_weights;
  summary.quantized_bits = static_cast<double>(bits.quantized_bits);
  summary.avg_bits_per_weight = bits.avg_bits_per_weight();
  std::error_code ec;
  summary.file_bytes = std::filesystem::file_size(path, ec);
  LOWBIT_CHECK(!ec, path, ": written, but cannot stat it: ", ec.message());
  return summary;
}

WeightSet read_lowbit(const std::string& path) {
  const SafetensorsFile st = SafetensorsFile::open(path);
  const ordered_json meta = lowbit_metadata(st);

  WeightSet ws;
  ws.path = path;
  ws.format = ModelFormat::Lowbit;
  ws.files.push_back(st.file());
  ws.config = config_from_hf_json_text(meta["config"].dump(), path + ": config");
  if (!meta["tokenizer"].is_null()) ws.vocab = vocab_from_json(meta["tokenizer"], path);

  BitCounts bits;
  std::set<std::string> referenced;
  auto use = [&](const std::string& stored_name, const std::string& by) -> const TensorView& {
    const TensorView* v = st.find(stored_name);
    LOWBIT_CHECK(v != nullptr, path, ": ", by, " refers to tensor ", stored_name, ", which the file does not hold");
    LOWBIT_CHECK(referenced.insert(stored_name).second, path, ": tensor ", stored_name, " is referenced twice");
    return *v;
  };
  for (const auto& [name, entry] : meta["tensors"].items()) {
    const std::string where = path + ": tensor " + name;
    LOWBIT_CHECK(entry.is_object() && entry.contains("format") && entry["format"].is_string(), where,
                 ": entry must be an object with a \"format\" string");
    const std::string& format = entry["format"].get_ref<const std::string&>();
    if (format == kDenseFormat) {
      expect_keys(entry, {"format", "dtype"}, where + ": entry");
      const TensorView& v = use(name, "dense tensor " + name);
      const std::string& dtype = string_at(entry, "dtype", where);
      LOWBIT_CHECK(dtype == dtype_info(v.dtype).name, where, ": metadata says dtype ", dtype, ", the file holds ",
                   dtype_info(v.dtype).name);
      LOWBIT_CHECK(is_dense_dtype(v.dtype), where, ": dense dtype ", dtype, " is not F32, F16 or BF16");
      ws.tensors[name] = v;
      ws.source_names[name] = name;
      bits.params += static_cast<uint64_t>(v.numel());
      bits.data_bytes += v.nbytes;
      continue;
    }
    const FormatId id = packed_format_named(format, where).id;  // unknown format names fail here, loudly
    expect_keys(entry, {"format", "shape", "params", "parts"}, where + ": entry");
    PackedWeight w;
    w.format = id;
    LOWBIT_CHECK(entry["shape"].is_array(), where, ": shape must be an array");
    for (const ordered_json& d : entry["shape"]) {
      LOWBIT_CHECK(d.is_number_integer(), where, ": shape must hold integers, got ", entry["shape"].dump());
      w.shape.push_back(d.get<int64_t>());
    }
    LOWBIT_CHECK(entry["params"].is_object(), where, ": params must be an object");
    for (const auto& [key, value] : entry["params"].items()) {
      LOWBIT_CHECK(value.is_number_integer(), where, ": parameter ", key, " must be an integer, got ", value.dump());
      w.params[key] = value.get<int64_t>();
    }
    LOWBIT_CHECK(entry["parts"].is_object(), where, ": parts must be an object");
    for (const auto& [part, stored] : entry["parts"].items()) {
      LOWBIT_CHECK(stored.is_string(), where, ": part ", part, " must name a tensor");
      w.parts[part] = use(stored.get<std::string>(), "part " + part + " of " + name);
      bits.data_bytes += w.parts[part].nbytes;
    }
    validate_packed(w, where);  // params, part dtypes/shapes, zero points, group indices, padding, scales
    bits.quantized_weights += w.shape[0] * w.shape[1];
    bits.quantized_bits += packed_stored_bits(w, where);
    bits.params += static_cast<uint64_t>(w.shape[0] * w.shape[1]);
    ws.source_names[name] = name;
    ws.packed[name] = std::move(w);
  }
  for (const auto& [name, view] : st.tensors())
    LOWBIT_CHECK(referenced.count(name), path, ": tensor ", name, " is in the file but not referenced by the lowbit "
                 "metadata");

  const ordered_json& stored = meta["bits"];
  expect_keys(stored, {"quantized_weights", "quantized_bits", "avg_bits_per_weight", "file_bits_per_param"},
              path + ": lowbit metadata bits");
  const bool consistent = stored["quantized_weights"].is_number_integer() &&
                          stored["quantized_weights"].get<int64_t>() == bits.quantized_weights &&
                          stored["quantized_bits"].is_number_integer() &&
                          stored["quantized_bits"].get<uint64_t>() == bits.quantized_bits &&
                          stored["avg_bits_per_weight"].is_number() &&
                          close_enough(stored["avg_bits_per_weight"].get<double>(), bits.avg_bits_per_weight()) &&
                          stored["file_bits_per_param"].is_number() &&
                          close_enough(stored["file_bits_per_param"].get<double>(), bits.file_bits_per_param());
  LOWBIT_CHECK(consistent, path, ": lowbit metadata bits ", stored.dump(), " do not match the tensors (",
               bits.to_json().dump(), ")");
  return ws;
}

bool is_lowbit_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || size < 8) return false;
  std::ifstream f(path, std::ios::binary);
  uint64_t header_len = 0;
  if (!f.read(reinterpret_cast<char*>(&header_len), 8)) return false;
  if (header_len > size - 8 || header_len > kMaxSafetensorsHeaderBytes) return false;
  std::string header(header_len, '\0');
  if (!f.read(header.data(), static_cast<std::streamsize>(header_len))) return false;
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("__metadata__") && j["__metadata__"].is_object() &&
         j["__metadata__"].contains(kLowbitMetadataKey);
}

std::string lowbit_method_json(const std::string& path) {
  return lowbit_metadata(SafetensorsFile::open(path))["method"].dump();
}

}  // namespace lowbit
