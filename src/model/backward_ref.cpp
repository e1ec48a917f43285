// loss_reference(): the scalar double-precision oracle of the loss in backward.h. Plain loops in the order the math
// is written (no BLAS, no threads, no kept activations), reading every weight as double, optionally replaced by an
// override, so tests can take central differences of the loss without touching the model's (read-only) weights.
// Only the RoPE tables are shared with the fast path (Model::rope_cos/rope_sin): they are part of the model.
#include <cmath>

#include "core/error.h"
#include "model/backward.h"

namespace lowbit {

namespace {

// y[n] = W[n, k] · x[k] (+ b[n] when b != nullptr)
void matvec(const double* w, const double* b, const double* x, double* y, int n, int k) {
  for (int i = 0; i < n; ++i) {
    double acc = b ? b[i] : 0.0;
    for (int j = 0; j < k; ++j) acc += w[static_cast<int64_t>(i) * k + j] * x[j];
    y[i] = acc;
  }
}

void rmsnorm(const double* x, const double* w, double* y, int dim, double eps) {
  double ss = 0.0;
  for (int i = 0; i < dim; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / dim + eps);
  for (int i = 0; i < dim; ++i) y[i] = w[i] * x[i] * inv;
}

}  // namespace

double loss_reference(const Model& model, const std::vector<int32_t>& tokens,
                      const std::map<std::string, std::vector<double>>* overrides) {
  const ModelConfig& c = model.config();
  const int T = static_cast<int>(tokens.size());
  LOWBIT_CHECK(T >= 2 && T <= c.max_seq_len, "loss_reference: need 2..", c.max_seq_len, " tokens, got ", T);
  for (int32_t id : tokens)
    LOWBIT_CHECK(id >= 0 && id < c.vocab_size, "loss_reference: token id ", id, " out of range");
  if (overrides) {
    for (const auto& [name, values] : *overrides) {
      LOWBIT_CHECK(!(name == "lm_head.weight" && c.tie_embeddings),
                   "loss_reference: lm_head.weight is tied to the embedding; override model.embed_tokens.weight");
      int64_t numel = 1;
      for (int64_t d : model.tensor_shape(name)) numel *= d;   // throws for an unknown name
      LOWBIT_CHECK(static_cast<int64_t>(values.size()) == numel, "loss_reference: override ", name, " has ",
                   values.size(), " values, the tensor ", numel);
    }
  }
  std::map<std::string, std::vector<double>> widened;   // model weights converted to double on first use
  auto weight = [&](const std::string& name) -> const double* {
    if (overrides) {
      auto it = overrides->find(name);
      if (it != overrides->end()) return it->second.data();
    }
    auto it = widened.find(name);
    if (it == widened.end()) {
      int64_t numel = 1;
      for (int64_t d : model.tensor_shape(name)) numel *= d;
      const float* f = model.tensor_f32(name);
      it = widened.emplace(name, std::vector<double>(f, f + numel)).first;
    }
    return it->second.data();
  };

  const int D = c.dim, hd = c.head_dim, half = hd / 2, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  const int V = c.vocab_size, group = c.n_heads / c.n_kv_heads;
  const double eps = c.rms_eps;
  const double* emb = weight("model.embed_tokens.weight");
  std::vector<double> x(static_cast<size_t>(T) * D);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < D; ++i) x[static_cast<size_t>(t * D + i)] = emb[static_cast<int64_t>(tokens[t]) * D + i];

  std::vector<double> xn(static_cast<size_t>(D)), q(static_cast<size_t>(T) * qd), k(static_cast<size_t>(T) * kvd),
      v(k.size()), att(static_cast<size_t>(qd)), tmp(static_cast<size_t>(D)), g(static_cast<size_t>(hid)),
      u(g.size()), s(static_cast<size_t>(T));
  auto rotate = [&](double* vec, int pos) {
    for (int i = 0; i < half; ++i) {
      const double cs = model.rope_cos()[static_cast<int64_t>(pos) * half + i];
      const double sn = model.rope_sin()[static_cast<int64_t>(pos) * half + i];
      const double a = vec[i], b = vec[i + half];
      vec[i] = a * cs - b * sn;
      vec[i + half] = b * cs + a * sn;
    }
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const double* bq = c.qkv_bias ? weight(p + "self_attn.q_proj.bias") : nullptr;
    const double* bk = c.qkv_bias ? weight(p + "self_attn.k_proj.bias") : nullptr;
    const double* bv = c.qkv_bias ? weight(p + "self_attn.v_proj.bias") : nullptr;
    for (int t = 0; t < T; ++t) {
      rmsnorm(&x[static_cast<size_t>(t * D)], weight(p + "input_layernorm.weight"), xn.data(), D, eps);
      double* qt = &q[static_cast<size_t>(t) * qd];
      double* kt = &k[static_cast<size_t>(t) * kvd];
      matvec(weight(p + "self_attn.q_proj.weight"), bq, xn.data(), qt, qd, D);
      matvec(weight(p + "self_attn.k_proj.weight"), bk, xn.data(), kt, kvd, D);
      matvec(weight(p + "self_attn.v_proj.weight"), bv, xn.data(), &v[static_cast<size_t>(t) * kvd], kvd, D);
      for (int h = 0; h < c.n_heads; ++h) rotate(qt + h * hd, t);
      for (int h = 0; h < c.n_kv_heads; ++h) rotate(kt + h * hd, t);
    }
    for (int t = 0; t < T; ++t) {   // every query sees keys [first, t]; all of layer l's k/v exist already
      const int first = c.sliding_window > 0 ? std::max(0, t - c.sliding_window + 1) : 0;
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        double mx = -INFINITY;
        for (int j = first; j <= t; ++j) {
          double dot = 0.0;
          for (int i = 0; i < hd; ++i) dot += q[static_cast<size_t>(t * qd + h * hd + i)] * k[static_cast<size_t>(j * kvd + kvh * hd + i)];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int j = first; j <= t; ++j) sum += (s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx));
        for (int i = 0; i < hd; ++i) {
          double acc = 0.0;
          for (int j = first; j <= t; ++j) acc += s[static_cast<size_t>(j)] * v[static_cast<size_t>(j * kvd + kvh * hd + i)];
          att[static_cast<size_t>(h * hd + i)] = acc / sum;
        }
      }
      double* xt = &x[static_cast<size_t>(t * D)];
      matvec(weight(p + "self_attn.o_proj.weight"), nullptr, att.data(), tmp.data(), D, qd);
      for (int i = 0; i < D; ++i) xt[i] += tmp[static_cast<size_t>(i)];
    }
    for (int t = 0; t < T; ++t) {   // the FFN after every position's attention (attention reads x_in, not x_mid)
      double* xt = &x[static_cast<size_t>(t * D)];
      rmsnorm(xt, weight(p + "post_attention_layernorm.weight"), xn.data(), D, eps);
      matvec(weight(p + "mlp.gate_proj.weight"), nullptr, xn.data(), g.data(), hid, D);
      matvec(weight(p + "mlp.up_proj.weight"), nullptr, xn.data(), u.data(), hid, D);
      for (int i = 0; i < hid; ++i) {
        const double gi = g[static_cast<size_t>(i)];
        g[static_cast<size_t>(i)] = gi / (1.0 + std::exp(-gi)) * u[static_cast<size_t>(i)];
      }
      matvec(weight(p + "mlp.down_proj.weight"), nullptr, g.data(), tmp.data(), D, hid);
      for (int i = 0; i < D; ++i) xt[i] += tmp[static_cast<size_t>(i)];
    }
  }
  const double* head = weight(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  std::vector<double> logits(static_cast<size_t>(V));
  double loss = 0.0;
  for (int t = 0; t + 1 < T; ++t) {
    rmsnorm(&x[static_cast<size_t>(t * D)], weight("model.norm.weight"), xn.data(), D, eps);
    matvec(head, nullptr, xn.data(), logits.data(), V, D);
    double mx = -INFINITY;
    for (double z : logits) mx = std::max(mx, z);
    double sum = 0.0;
    for (double z : logits) sum += std::exp(z - mx);
    loss += std::log(sum) + mx - logits[static_cast<size_t>(tokens[static_cast<size_t>(t + 1)])];
  }
  return loss / (T - 1);
}

}  // namespace lowbit
