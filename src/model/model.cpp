#include "model/model.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "formats/format_table.h"
#include "io/ggml_quants.h"

namespace lowbit {

namespace {

// Rows of q/k in interleaved-pair order (head h: row h*hd + 2i + j) back to the Hugging Face half-split order
// (row h*hd + j*hd/2 + i). Exact: a permutation of rows.
void unpermute_qk_rows(const float* src, float* dst, int64_t rows, int64_t cols, int head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / head_dim, within = r % head_dim;
    const int64_t i = within / 2, j = within % 2;
    const int64_t hf_row = h * head_dim + j * half + i;
    std::memcpy(dst + hf_row * cols, src + r * cols, static_cast<size_t>(cols) * sizeof(float));
  }
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  return load(read_weights(path, opts));
}

std::unique_ptr<Model> Model::load(WeightSet ws) {
  std::unique_ptr<Model> m(new Model());
  m->ws_ = std::move(ws);
  const WeightSet& w = m->ws_;
  const ModelConfig& c = w.config;
  c.validate(w.path);
  if (w.vocab) {
    m->tokenizer_ = make_tokenizer(*w.vocab);
    LOWBIT_CHECK(m->tokenizer_->vocab_size() <= c.vocab_size, w.path, ": tokenizer has ",
                 m->tokenizer_->vocab_size(), " tokens but the model's vocab_size is ", c.vocab_size);
  }

  // Fetches a tensor as fp32 with an exact shape check; converts (and un-permutes q/k) when needed.
  auto get = [&](const std::string& name, std::vector<int64_t> shape, bool qk_rows = false) -> const float* {
    auto it = w.tensors.find(name);
    if (it == w.tensors.end()) fail(w.path, ": missing tensor ", name);
    const TensorView& t = it->second;
    const std::string& src_name = w.source_names.count(name) ? w.source_names.at(name) : name;
    LOWBIT_CHECK(t.shape == shape, w.path, ": tensor ", src_name, " has shape ", shape_str(t.shape),
                 ", expected ", shape_str(shape));
    const int64_t numel = t.numel();
    LOWBIT_CHECK(dtype_bytes(t.dtype, static_cast<uint64_t>(numel)) == t.nbytes, w.path, ": tensor ", src_name,
                 " holds ", t.nbytes, " bytes, but ", shape_str(shape), " of ", dtype_info(t.dtype).name,
                 " needs ", dtype_bytes(t.dtype, static_cast<uint64_t>(numel)));
    const bool permute = qk_rows && w.qk_interleaved;
    const float* out = nullptr;
    const bool aligned = reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0;
    if (t.dtype == DType::F32 && aligned && !permute) {
      out = reinterpret_cast<const float*>(t.data);  // zero copy
    } else {
      auto buf = std::make_unique<std::vector<float>>(static_cast<size_t>(numel));
      const int64_t cols = shape.back();
      const int64_t rows = numel / cols;
      const int64_t row_bytes = static_cast<int64_t>(dtype_bytes(t.dtype, static_cast<uint64_t>(cols)));
      LOWBIT_CHECK(row_bytes > 0 && dtype_bytes(t.dtype, static_cast<uint64_t>(cols)) != UINT64_MAX, w.path,
                   ": tensor ", src_name, " row of ", cols, " is not a whole number of ", dtype_info(t.dtype).name,
                   " blocks");
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) dequantize_row(t.dtype, t.data + r * row_bytes, buf->data() + r * cols, cols);
      if (permute) {
        std::vector<float> tmp(*buf);
        unpermute_qk_rows(tmp.data(), buf->data(), rows, cols, c.head_dim);
      }
      out = buf->data();
      m->owned_.push_back(std::move(buf));
    }
    m->f32_[name] = {out, shape};
    m->order_.push_back(name);
    return out;
  };

  // A linear layer: packed (quantized) weights become their format's LinearOp, fp weights a DenseLinear.
  auto lin = [&](const std::string& name, int64_t n, int64_t k, const float* bias,
                 bool qk_rows) -> std::unique_ptr<LinearOp> {
    auto pit = w.packed.find(name);
    if (pit == w.packed.end()) return std::make_unique<DenseLinear>(get(name, {n, k}, qk_rows), bias, n, k);
    LOWBIT_CHECK(pit->second.shape == (std::vector<int64_t>{n, k}), w.path, ": packed weight ", name, " has shape ",
                 shape_str(pit->second.shape), ", expected ", shape_str({n, k}));
    LOWBIT_CHECK(!(qk_rows && w.qk_interleaved), w.path, ": packed q/k weights must be in Hugging Face row order");
    m->packed_names_.push_back(name);
    return make_packed_linear(pit->second, bias, w.path + ": " + name);
  };
  const int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim(), V = c.vocab_size;
  m->tok_emb_ = get("model.embed_tokens.weight", {V, dim});
  m->layers_.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = m->layers_[static_cast<size_t>(l)];
    L.attn_norm = get(p + "input_layernorm.weight", {dim});
    const float* bq = c.qkv_bias ? get(p + "self_attn.q_proj.bias", {qd}, true) : nullptr;
    const float* bk = c.qkv_bias ? get(p + "self_attn.k_proj.bias", {kvd}, true) : nullptr;
    const float* bv = c.qkv_bias ? get(p + "self_attn.v_proj.bias", {kvd}) : nullptr;
    L.q = lin(p + "self_attn.q_proj.weight", qd, dim, bq, true);
    L.k = lin(p + "self_attn.k_proj.weight", kvd, dim, bk, true);
    L.v = lin(p + "self_attn.v_proj.weight", kvd, dim, bv, false);
    L.o = lin(p + "self_attn.o_proj.weight", dim, qd, nullptr, false);
    L.ffn_norm = get(p + "post_attention_layernorm.weight", {dim});
    L.gate = lin(p + "mlp.gate_proj.weight", hid, dim, nullptr, false);
    L.up = lin(p + "mlp.up_proj.weight", hid, dim, nullptr, false);
    L.down = lin(p + "mlp.down_proj.weight", dim, hid, nullptr, false);
  }
  m->update_widths();
  m->final_norm_ = get("model.norm.weight", {dim});
  const float* head = c.tie_embeddings ? m->tok_emb_ : get("lm_head.weight", {V, dim});
  m->head_ = std::make_unique<DenseLinear>(head, nullptr, V, dim);
  // Anything left over means a different architecture or a misnamed tensor: refuse rather than ignore it.
  for (const auto& [name, t] : w.tensors) {
    if (m->f32_.count(name)) continue;
    if (std::find(m->packed_names_.begin(), m->packed_names_.end(), name) != m->packed_names_.end()) continue;
    if (name == "lm_head.weight" && c.tie_embeddings) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // old HF checkpoints store it
    fail(w.path, ": unexpected tensor ", name, " (not part of a ", c.arch, " model with this config)");
  }

  // RoPE tables, computed as Hugging Face does (fp32 inv_freq, fp32 angle), with llama3 frequency scaling.
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
  m->rope_cos_.resize(static_cast<size_t>(c.max_seq_len) * half);
  m->rope_sin_.resize(static_cast<size_t>(c.max_seq_len) * half);
  for (int p = 0; p < c.max_seq_len; ++p) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
      m->rope_cos_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      m->rope_sin_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return m;
}

const Tokenizer& Model::tokenizer() const {
  LOWBIT_CHECK(tokenizer_ != nullptr, ws_.path, ": the model has no tokenizer (for llama2.c pass --tokenizer)");
  return *tokenizer_;
}

KVCache Model::new_cache(int capacity) const {
  LOWBIT_CHECK(capacity > 0 && capacity <= config().max_seq_len, ws_.path, ": context ", capacity,
               " exceeds the model's maximum of ", config().max_seq_len, " positions");
  return KVCache(config().n_layers, capacity, config().kv_dim());
}

const float* Model::tensor_f32(const std::string& name) const {
  auto it = f32_.find(name);
  LOWBIT_CHECK(it != f32_.end(), ws_.path, ": no tensor ", name);
  return it->second.first;
}

const std::vector<int64_t>& Model::tensor_shape(const std::string& name) const {
  auto it = f32_.find(name);
  LOWBIT_CHECK(it != f32_.end(), ws_.path, ": no tensor ", name);
  return it->second.second;
}

std::vector<std::string> Model::tensor_names() const { return order_; }

std::vector<std::string> Model::linear_names(int layer) const {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  return {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
          p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight",    p + "mlp.up_proj.weight",
          p + "mlp.down_proj.weight"};
}

std::unique_ptr<LinearOp>& Model::linear_slot(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) == 0) {
    const size_t dot = name.find('.', prefix.size());
    const int l = std::stoi(name.substr(prefix.size(), dot - prefix.size()));
    if (l >= 0 && l < config().n_layers) {
      LayerWeights& L = layers_[static_cast<size_t>(l)];
      const std::string rest = name.substr(dot + 1);
      if (rest == "self_attn.q_proj.weight") return L.q;
      if (rest == "self_attn.k_proj.weight") return L.k;
      if (rest == "self_attn.v_proj.weight") return L.v;
      if (rest == "self_attn.o_proj.weight") return L.o;
      if (rest == "mlp.gate_proj.weight") return L.gate;
      if (rest == "mlp.up_proj.weight") return L.up;
      if (rest == "mlp.down_proj.weight") return L.down;
    }
  }
  fail(ws_.path, ": ", name, " is not a linear layer weight");
}

void Model::replace_linear(const std::string& name, std::unique_ptr<LinearOp> op) {
  std::unique_ptr<LinearOp>& slot = linear_slot(name);
  LOWBIT_CHECK(op && op->n() == slot->n() && op->k() == slot->k(), ws_.path, ": replacement for ", name,
               " has the wrong shape");
  slot = std::move(op);
  update_widths();
}

void Model::update_widths() {
  uint32_t common = 0;
  bool any = false;
  for (const LayerWeights& L : layers_)
    for (const LinearOp* op : L.linears()) {
      if (op == nullptr || op->served_widths() == 0) continue;
      common = any ? common & op->served_widths() : op->served_widths();
      any = true;
    }
  widths_ = common;
}

uint64_t Model::weight_bytes_per_token(int bits) const {
  check_bits(bits);
  uint64_t total = head_->weight_bytes(0);
  for (const LayerWeights& L : layers_)
    for (const LinearOp* op : L.linears())
      total += op->served_widths() != 0 ? op->weight_bytes(bits) : op->weight_bytes(0);
  return total;
}

std::vector<int> Model::widths() const {
  std::vector<int> out;
  for (int b = 0; b < 32; ++b)
    if ((widths_ >> b) & 1u) out.push_back(b);
  return out;
}

void Model::check_bits(int bits) const {
  if (bits == 0) return;
  if (widths_ == 0) fail(ws_.path, ": --bits ", bits, " needs an any-precision model (this one has one precision)");
  if (bits < 0 || bits >= 32 || ((widths_ >> bits) & 1u) == 0) {
    std::string list;
    for (int b : widths()) {
      if (!list.empty()) list += ',';
      list += std::to_string(b);
    }
    fail(ws_.path, ": --bits ", bits, " is not a width this model serves (", list, ")");
  }
}

}  // namespace lowbit
