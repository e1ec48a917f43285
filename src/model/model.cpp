#include "model/model.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "formats/format_table.h"
#include "model/weight_convert.h"

namespace lowbit {

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  return load(read_weights(path, opts));
}

std::unique_ptr<Model> Model::load(WeightSet ws) {
  std::unique_ptr<Model> m(new Model());
  m->ws_ = std::move(ws);
  const WeightSet& w = m->ws_;
  const ModelConfig& c = w.config;
  c.validate(w.path);
  m->tokenizer_ = make_model_tokenizer(w);

  // A tensor as fp32 (weight_convert.h): kept where the file holds it as aligned fp32, else converted into a buffer
  // the model owns.
  auto get = [&](const std::string& name, std::vector<int64_t> shape, bool qk_rows = false) -> const float* {
    auto buf = std::make_unique<std::vector<float>>();
    const float* out = tensor_as_f32(w, name, shape, qk_rows, *buf);
    if (!buf->empty()) m->owned_.push_back(std::move(buf));
    m->f32_[name] = {out, shape};
    m->order_.push_back(name);
    return out;
  };

  // A linear layer: packed (quantized) weights become their format's LinearOp, fp weights a DenseLinear.
  auto lin = [&](const std::string& name, int64_t n, int64_t k, const float* bias,
                 bool qk_rows) -> std::unique_ptr<LinearOp> {
    const PackedWeight* pw = find_packed_linear(w, name, n, k, qk_rows);
    if (pw == nullptr) return std::make_unique<DenseLinear>(get(name, {n, k}, qk_rows), bias, n, k);
    m->packed_names_.push_back(name);
    return make_packed_linear(*pw, bias, w.path + ": " + name);
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
  check_no_unexpected_tensors(w, [&](const std::string& name) {
    return m->f32_.count(name) != 0 ||
           std::find(m->packed_names_.begin(), m->packed_names_.end(), name) != m->packed_names_.end();
  });
  RopeTables rope = rope_tables(c);
  m->rope_cos_ = std::move(rope.cos);
  m->rope_sin_ = std::move(rope.sin);
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

std::vector<int> Model::widths() const { return widths_in(widths_); }

void Model::check_bits(int bits) const { check_served_width(ws_.path, widths_, bits); }

}  // namespace lowbit
