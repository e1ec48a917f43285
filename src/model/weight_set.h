// WeightSet: what a model file holds, before any conversion — the config, the tokenizer vocabulary and every
// tensor as stored (dtype, shape, pointer into the mapped file). Tensor names are canonical Hugging Face names
// ("model.layers.3.self_attn.q_proj.weight"), whatever the source format. `lowbit inspect` prints a WeightSet;
// Model::load turns one into fp32 runtime weights, the GPU model into device weights one tensor at a time (both through
// model/weight_convert.h). A synthetic source ("random:<preset>", model/random_model.h) has a generator instead of
// files: its views carry dtype and shape but no data, and tensor_as_f32 generates a tensor when it is read.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "core/tensor.h"
#include "formats/format_id.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace lowbit {

class TensorGenerator;   // model/random_model.h

enum class ModelFormat { HuggingFace, Gguf, Llama2c, Lowbit, Random };
const char* model_format_name(ModelFormat f);

// A linear weight stored in a packed (quantized) format: its format, logical shape, integer parameters, and the
// tensors ("parts") that hold it. src/formats/ validates the parts and builds the runtime LinearOp.
struct PackedWeight {
  FormatId format = FormatId::Uniform;      // its row in the format table (src/formats/format_table.h)
  std::vector<int64_t> shape;               // logical [n_out, k_in]
  std::map<std::string, int64_t> params;    // e.g. bits, group_size, symmetric, act_order
  std::map<std::string, TensorView> parts;  // e.g. qweight, scales, zeros, g_idx
};

struct WeightSet {
  std::string path;                        // what the user passed
  ModelFormat format = ModelFormat::HuggingFace;
  ModelConfig config;
  std::optional<VocabData> vocab;          // absent when the source has no tokenizer we can read
  std::map<std::string, TensorView> tensors;           // plain (fp) tensors
  std::map<std::string, PackedWeight> packed;          // quantized linear weights (.lowbit files)
  std::map<std::string, std::string> source_names;  // canonical name -> name in the file (for messages)
  // q_proj/k_proj rows are stored in the interleaved-pair RoPE order (GGUF "llama", llama2.c);
  // loading (model/weight_convert.h) permutes them back to the Hugging Face half-split order so one RoPE serves all
  // formats.
  bool qk_interleaved = false;
  std::vector<std::shared_ptr<MappedFile>> files;   // keep the mappings alive
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned;  // buffers some views point into
  // Set for synthetic sources only: every view then has data == nullptr (nbytes is what its fp32 values take), and
  // its values exist only as tensor_as_f32 generates them, one tensor at a time, so a 70B source costs no memory
  // until a tensor is read. Code reading TensorView::data must go through tensor_as_f32 or refuse such a set.
  std::shared_ptr<const TensorGenerator> generator;
};

struct LoadOptions {
  std::string tokenizer_path;   // llama2.c: tokenizer.bin (default: tokenizer.bin / tok512.bin beside the model)
  // QUIK models: the activation width every quik linear runs at, instead of the one stored with it: "4", "8",
  // "16" (activations not quantized) or "fp8" (FP8-E4M3, W4 only). Empty: as stored. Refused for other models.
  std::string quik_abits;
};

// Detects the format ("random:<preset>" = synthetic, directory = Hugging Face, "GGUF" magic, llama2.c header) and
// reads it.
WeightSet read_weights(const std::string& path, const LoadOptions& opts = {});
WeightSet read_hf_dir(const std::string& dir);
WeightSet read_gguf_model(const std::string& path);
WeightSet read_llama2c(const std::string& path, const std::string& tokenizer_path);

}  // namespace lowbit
