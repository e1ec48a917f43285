// The .lowbit model container: one safetensors file (any safetensors tool reads it) whose __metadata__ key
// "lowbit" holds versioned JSON describing the model — source, Hugging Face config, tokenizer, quantization
// method, and for every tensor whether it is dense or packed (format, logical shape, params, part tensors).
// Schema and an example: docs/formats/lowbit-container.md.
//
// A quantizer writes it (write_lowbit); the runtime only reads it (read_lowbit). The reader validates everything
// once, at open: the safetensors layout, the JSON, the config, the tokenizer, every packed weight against the
// format table (formats/format_table.h), and that every tensor in the file is referenced exactly once.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/weight_set.h"
#include "tokenizer/tokenizer.h"

namespace lowbit {

inline constexpr int kLowbitFormatVersion = 1;  // bump when a reader of the old version would misread the file
inline constexpr char kLowbitMetadataKey[] = "lowbit";

struct LowbitWriteSpec {
  std::string source_path, source_format;          // what was quantized (informational)
  ModelConfig config;
  std::optional<VocabData> vocab;
  std::string method_json;                         // a JSON object as text, e.g. {"name":"gptq","bits":4,...}
  std::vector<SafetensorsWriteTensor> dense;       // unquantized tensors (embeddings, norms, head, biases), F32/F16/BF16
  std::map<std::string, PackedWeight> packed;      // quantized linear weights by canonical name
};

struct LowbitSummary {
  int64_t quantized_weights = 0;    // sum of n*k over packed weights
  double quantized_bits = 0;        // exact stored bits of the packed weights (formats/format_table.h)
  double avg_bits_per_weight = 0;   // quantized_bits / quantized_weights (0 when nothing is packed)
  uint64_t file_bytes = 0;          // size of the written file
};

// Validates the spec (config, method JSON, dense dtypes, every packed weight, no name used twice) and writes
// atomically (temp file + rename): on any failure no file appears and an existing file at `path` is untouched.
LowbitSummary write_lowbit(const std::string& path, const LowbitWriteSpec& spec);
// format = ModelFormat::Lowbit; tensors (dense), packed, config, vocab. Errors: lowbit::Error("<path>: <problem>").
WeightSet read_lowbit(const std::string& path);
// True when `path` is a safetensors file whose metadata has the "lowbit" key (cheap: reads only the header; any
// failure to read it means false).
bool is_lowbit_file(const std::string& path);
// The "method" object of a .lowbit file as JSON text (for `lowbit inspect`).
std::string lowbit_method_json(const std::string& path);

}  // namespace lowbit
