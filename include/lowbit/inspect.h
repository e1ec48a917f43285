// lowbit::api::inspect: what a model file holds, read without converting or running anything — the architecture,
// the tokenizer, every tensor as stored, and for .lowbit files every packed weight with the exact bits it occupies
// and what each any-precision width reads.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/types.h"

namespace lowbit::api {

struct InspectOptions {
  std::string tokenizer_path;   // llama2.c checkpoints: the tokenizer file ("" = beside the model)
};

struct TokenizerInfo {
  bool present = false;
  std::string kind;             // "SentencePiece BPE" | "byte-level BPE"
  std::string pretokenizer;     // byte-level BPE: the pre-tokenizer's name ("smollm", "llama3", ...)
  int tokens = 0;
  int32_t bos_id = -1, eos_id = -1;
  bool chat_template = false;
};

// An unquantized tensor as stored.
struct TensorInfo {
  std::string name;             // canonical Hugging Face name ("model.layers.3.mlp.down_proj.weight")
  std::string dtype;            // "F32", "F16", "BF16", "Q4_1", ...
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// A quantized linear weight of a .lowbit file.
struct PackedTensorInfo {
  std::string name;
  std::string format;           // "uniform" | "anyprec" | "mixed24" | "mixed24a" | "quik"
  std::vector<int64_t> shape;   // logical [n_out, k_in]
  uint64_t stored_bits = 0;     // every bit the file holds for it (codes, scales, zeros, LUTs, indices, outliers)
  std::vector<std::pair<std::string, int64_t>> params;   // the format's integer parameters, e.g. bits, group_size
};

// Parameters and bytes per tensor dtype (packed weights excluded).
struct DTypeTotal {
  std::string dtype;
  int64_t params = 0;
  uint64_t bytes = 0;
};

// What a forward at one any-precision width reads.
struct WidthRead {
  int bits = 0;
  double bits_per_weight = 0;   // over the quantized weights: planes 0..bits-1, the width's LUT, outliers
  double quantized_bytes = 0;   // of the quantized weights (other packed formats at their stored size)
  double model_bytes = 0;       // quantized_bytes plus every unquantized tensor
};

struct FileInfo {
  ModelInfo model;
  TokenizerInfo tokenizer;
  std::vector<TensorInfo> tensors;          // in name order
  std::vector<PackedTensorInfo> packed;     // in name order (empty unless a .lowbit file)
  std::vector<DTypeTotal> dtype_totals;     // in dtype-name order
  int64_t params = 0;                       // every parameter, packed weights counted at their logical shape
  uint64_t dense_bytes = 0;                 // bytes of the unquantized tensors
  int64_t packed_params = 0;
  double packed_bits = 0;                   // stored bits of the packed weights
  // Any-precision files: one row per width every any-precision weight serves, ascending; and the file beside a
  // set of separately quantized models, one per width, each storing exactly what its width reads.
  std::vector<WidthRead> widths;
  double parent_bytes = 0, separate_models_bytes = 0;
  double total_bits() const { return 8.0 * static_cast<double>(dense_bytes) + packed_bits; }
};

// Errors: missing or unreadable file, not a model, malformed tensors (each one line naming the file).
FileInfo inspect(const std::string& path, const InspectOptions& opts = {});
// "[576, 1536]".
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace lowbit::api
