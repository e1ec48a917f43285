// lowbit::api::convert_to_hf: a GGUF, llama2.c or Hugging Face model written as a Hugging Face directory
// (config.json, model.safetensors, tokenizer.json + tokenizer_config.json) that transformers loads with logits
// identical to lowbit's. q/k rows are written in Hugging Face's RoPE order. Quantized (.lowbit) models are refused.
#pragma once
#include <string>

#include "lowbit/types.h"

namespace lowbit::api {

struct ConvertOptions {
  FloatType dtype = FloatType::F32;   // tensors as fp32 or fp16
  bool force = false;                 // write into an existing non-empty directory (its same-named files replaced)
  std::string tokenizer_path;         // llama2.c inputs: the tokenizer file ("" = beside the model)
};

struct ConvertResult {
  std::string out_dir;
  int tensors = 0;
  bool tokenizer = false;             // tokenizer.json and tokenizer_config.json written
};

// Errors: out_dir is a file, or a non-empty directory without force; the input is quantized or unreadable.
ConvertResult convert_to_hf(const std::string& in_path, const std::string& out_dir, const ConvertOptions& opts = {});

}  // namespace lowbit::api
