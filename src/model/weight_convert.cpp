#include "model/weight_convert.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "io/ggml_quants.h"
#include "model/random_model.h"

namespace lowbit {

namespace {

// Where row r of a q/k tensor stored in interleaved-pair order (head h: row h*hd + 2i + j) belongs in the Hugging
// Face half-split order (row h*hd + j*hd/2 + i).
int64_t half_split_row(int64_t r, int head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t h = r / head_dim, within = r % head_dim;
  const int64_t i = within / 2, j = within % 2;
  return h * head_dim + j * half + i;
}

}  // namespace

const float* tensor_as_f32(const WeightSet& ws, const std::string& name, const std::vector<int64_t>& shape,
                           bool qk_rows, std::vector<float>& scratch) {
  auto it = ws.tensors.find(name);
  if (it == ws.tensors.end()) fail(ws.path, ": missing tensor ", name);
  const TensorView& t = it->second;
  const auto src = ws.source_names.find(name);
  const std::string& src_name = src != ws.source_names.end() ? src->second : name;
  LOWBIT_CHECK(t.shape == shape, ws.path, ": tensor ", src_name, " has shape ", shape_str(t.shape), ", expected ",
               shape_str(shape));
  const int64_t numel = t.numel();
  LOWBIT_CHECK(dtype_bytes(t.dtype, static_cast<uint64_t>(numel)) == t.nbytes, ws.path, ": tensor ", src_name,
               " holds ", t.nbytes, " bytes, but ", shape_str(shape), " of ", dtype_info(t.dtype).name, " needs ",
               dtype_bytes(t.dtype, static_cast<uint64_t>(numel)));
  const bool permute = qk_rows && ws.qk_interleaved;
  if (ws.generator) {
    // A synthetic source: generated rather than read (in Hugging Face row order, which its sets declare).
    LOWBIT_CHECK(t.dtype == DType::F32 && !permute, ws.path, ": synthetic tensor ", src_name, " must be F32 in "
                 "Hugging Face row order");
    scratch.resize(static_cast<size_t>(numel));
    ws.generator->fill(name, shape, scratch.data());
    return scratch.data();
  }
  const bool aligned = reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0;
  if (t.dtype == DType::F32 && aligned && !permute) return reinterpret_cast<const float*>(t.data);   // zero copy

  const int64_t cols = shape.back();
  const int64_t rows = numel / cols;
  const int64_t row_bytes = static_cast<int64_t>(dtype_bytes(t.dtype, static_cast<uint64_t>(cols)));
  LOWBIT_CHECK(row_bytes > 0 && dtype_bytes(t.dtype, static_cast<uint64_t>(cols)) != UINT64_MAX, ws.path,
               ": tensor ", src_name, " row of ", cols, " is not a whole number of ", dtype_info(t.dtype).name,
               " blocks");
  scratch.resize(static_cast<size_t>(numel));
  float* out = scratch.data();
  const int head_dim = ws.config.head_dim;
  // Each stored row is decoded straight into the row it becomes (the permutation moves whole rows: no second copy).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t dst = permute ? half_split_row(r, head_dim) : r;
    dequantize_row(t.dtype, t.data + r * row_bytes, out + dst * cols, cols);
  }
  return out;
}

const PackedWeight* find_packed_linear(const WeightSet& ws, const std::string& name, int64_t n, int64_t k,
                                       bool qk_rows) {
  auto it = ws.packed.find(name);
  if (it == ws.packed.end()) return nullptr;
  LOWBIT_CHECK(it->second.shape == (std::vector<int64_t>{n, k}), ws.path, ": packed weight ", name, " has shape ",
               shape_str(it->second.shape), ", expected ", shape_str({n, k}));
  LOWBIT_CHECK(!(qk_rows && ws.qk_interleaved), ws.path, ": packed q/k weights must be in Hugging Face row order");
  return &it->second;
}

void check_no_unexpected_tensors(const WeightSet& ws, const std::function<bool(const std::string&)>& used) {
  for (const auto& [name, t] : ws.tensors) {
    if (used(name)) continue;
    if (name == "lm_head.weight" && ws.config.tie_embeddings) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;   // old HF checkpoints store it
    fail(ws.path, ": unexpected tensor ", name, " (not part of a ", ws.config.arch, " model with this config)");
  }
}

std::unique_ptr<Tokenizer> make_model_tokenizer(const WeightSet& ws) {
  if (!ws.vocab) return nullptr;
  std::unique_ptr<Tokenizer> tok = make_tokenizer(*ws.vocab);
  LOWBIT_CHECK(tok->vocab_size() <= ws.config.vocab_size, ws.path, ": tokenizer has ", tok->vocab_size(),
               " tokens but the model's vocab_size is ", ws.config.vocab_size);
  return tok;
}

RopeTables rope_tables(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    float f = 1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
    if (c.rope_scaling == RopeScaling::Llama3) {
      const double low_wavelen = c.rope_original_max_pos / c.rope_low_freq_factor;
      const double high_wavelen = c.rope_original_max_pos / c.rope_high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / c.rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (c.rope_original_max_pos / wavelen - c.rope_low_freq_factor) /
                              (c.rope_high_freq_factor - c.rope_low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / c.rope_factor + smooth * f);
      }
    }
    inv_freq[static_cast<size_t>(i)] = f;
  }
  RopeTables t;
  t.cos.resize(static_cast<size_t>(c.max_seq_len) * half);
  t.sin.resize(static_cast<size_t>(c.max_seq_len) * half);
  for (int p = 0; p < c.max_seq_len; ++p) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
      t.cos[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      t.sin[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return t;
}

std::vector<int> widths_in(uint32_t widths) {
  std::vector<int> out;
  for (int b = 0; b < 32; ++b)
    if ((widths >> b) & 1u) out.push_back(b);
  return out;
}

void check_served_width(const std::string& path, uint32_t widths, int bits) {
  if (bits == 0) return;
  if (widths == 0) fail(path, ": --bits ", bits, " needs an any-precision model (this one has one precision)");
  if (bits < 0 || bits >= 32 || ((widths >> bits) & 1u) == 0) {
    std::string list;
    for (int b : widths_in(widths)) {
      if (!list.empty()) list += ',';
      list += std::to_string(b);
    }
    fail(path, ": --bits ", bits, " is not a width this model serves (", list, ")");
  }
}

}  // namespace lowbit
