// From a model file's tensors as stored (WeightSet) to what the forward passes read, written once for both models:
// the CPU Model keeps every converted tensor (Model::load), the GPU model converts one tensor at a time into a
// scratch buffer and uploads it (backend_cuda/model/gpu_model.h), so a file reaches the GPU without an fp32 copy of
// the whole model in host memory. Both read the same names with the same checks and get the same fp32 bits.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/weight_set.h"
#include "tokenizer/tokenizer.h"

namespace lowbit {

// Tensor `name` of ws as fp32 with exactly `shape`. Returns a pointer into the file when the tensor is stored as
// aligned fp32 and needs no permutation (zero copy), otherwise into `scratch` (resized to the tensor's element
// count; its capacity is reused across calls; a synthetic source's tensors, ws.generator, are always generated
// there). Conversion: F32/F16/BF16 and the ggml block types row by row (io/ggml_quants.h, bit-exact with ggml). qk_rows: a q/k projection weight or bias, whose rows are moved from the
// interleaved-pair RoPE order (GGUF "llama", llama2.c: ws.qk_interleaved) to the Hugging Face half-split order, so
// that one RoPE serves every format (exact: a permutation of rows).
// Throws "<path>: missing tensor <name>", a shape or byte-count mismatch naming the tensor as the file spells it.
const float* tensor_as_f32(const WeightSet& ws, const std::string& name, const std::vector<int64_t>& shape,
                           bool qk_rows, std::vector<float>& scratch);

// The packed weight stored for the linear layer `name`, or null when it is a plain tensor (read by tensor_as_f32).
// Checks its logical shape [n, k] and that packed q/k rows are in Hugging Face order (quantizers write them so).
const PackedWeight* find_packed_linear(const WeightSet& ws, const std::string& name, int64_t n, int64_t k,
                                       bool qk_rows);

// Refuses a plain tensor the model does not read (another architecture, a misnamed tensor) rather than ignoring
// it; used(name) says which tensors the loader read. A tied lm_head and old checkpoints' rotary_emb.inv_freq are
// expected extras.
void check_no_unexpected_tensors(const WeightSet& ws, const std::function<bool(const std::string&)>& used);

// The tokenizer of ws's vocabulary, or null when the file carries none; refuses a vocabulary larger than the
// model's vocab_size.
std::unique_ptr<Tokenizer> make_model_tokenizer(const WeightSet& ws);

// RoPE tables as the forward passes use them, computed as Hugging Face does (fp32 inv_freq, fp32 angle) with the
// llama3 frequency scaling: [max_seq_len][head_dim/2], entry (pos, i) = cos/sin(pos * inv_freq[i]).
struct RopeTables {
  std::vector<float> cos, sin;
};
RopeTables rope_tables(const ModelConfig& c);

// The any-precision widths a model serves as a bit set (bit b = width b; 0: a single-precision model) made into a
// sorted list, and the one check of a requested width against it: bits 0 (the widest) always passes, anything else
// must be served, else "<path>: --bits <b> ..." in one line.
std::vector<int> widths_in(uint32_t widths);
void check_served_width(const std::string& path, uint32_t widths, int bits);

}  // namespace lowbit
