// Shared by the API's implementation files only (never installed): mappings between the public types and the
// library's own.
#pragma once
#include <string>

#include "lowbit/types.h"
#include "model/weight_set.h"

namespace lowbit::api::detail {

ModelFormat public_format(lowbit::ModelFormat f);
// The public description of a model: its config, the format and path it was read from, and for .lowbit files the
// quantization method JSON the file stores.
ModelInfo model_info(const ModelConfig& c, lowbit::ModelFormat format, const std::string& path);
// Refuses a tokenizer file given for a model that carries its own (only llama2.c checkpoints read one), rather than
// ignoring it.
void check_tokenizer_option(lowbit::ModelFormat format, const std::string& path, const std::string& tokenizer_path);
// Applies set_cpu_threads' count to the calling thread (OpenMP keeps it per thread); every entry point that runs a
// forward calls it first.
void apply_cpu_threads();

}  // namespace lowbit::api::detail
