// Small types shared by the public headers: where a model runs, what file format it came from, and its architecture.
#pragma once
#include <cstdint>
#include <string>

namespace lowbit::api {

// Where the forward pass runs.
enum class Device {
  Auto,   // the GPU when one is present and runs this model (QUIK weights run on the CPU), else the CPU
  Cpu,    // the CPU (fp32 activations, OpenBLAS)
  Cuda,   // the GPU; an Error when there is none, lowbit was built without CUDA, or the model can't run there
};

// The file format a model was read from.
enum class ModelFormat {
  HuggingFace,   // a directory with config.json + *.safetensors (+ tokenizer.json)
  Gguf,          // a .gguf file (llama.cpp)
  Llama2c,       // a llama2.c checkpoint (.bin) with a tokenizer.bin beside it
  Lowbit,        // a .lowbit file written by lowbit::api::quantize
  Random,        // a synthetic "random:<preset>[?layers=N&seed=S]" source (llama2-7b, llama3-8b, llama2-70b,
                 // smollm2-135m, tiny): seeded weights generated when read, no tokenizer; for timing at real shapes
};
// "huggingface", "gguf", "llama2.c", "lowbit", "random".
const char* format_name(ModelFormat f);

// Floating-point storage for unquantized tensors.
enum class FloatType { F32, F16 };

// A Llama-family model's architecture (Llama 2/3, Mistral, Qwen2, SmolLM).
struct ModelInfo {
  std::string path;               // as given to open()
  ModelFormat format = ModelFormat::HuggingFace;
  std::string arch;               // "llama" | "mistral" | "qwen2"
  std::string name;               // the file's own name for the model ("" when it has none)
  int dim = 0;                    // hidden size
  int hidden_dim = 0;             // FFN intermediate size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;             // grouped-query attention: n_heads % n_kv_heads == 0
  int head_dim = 0;
  int vocab_size = 0;
  int max_seq_len = 0;            // positions the model was trained for (the longest context it runs)
  float rope_theta = 0;
  bool llama3_rope_scaling = false;
  float rms_eps = 0;
  bool tie_embeddings = false;    // the output head shares the token embedding
  bool qkv_bias = false;          // Qwen2
  int32_t bos_id = -1, eos_id = -1;   // -1: none
  // .lowbit files: how they were quantized, as the JSON the file stores ({"name":"anyprec","seed_bits":3,...});
  // "" for unquantized models.
  std::string quantization;
};

}  // namespace lowbit::api
