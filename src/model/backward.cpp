// Backward pass of the fp32 CPU model: loss_and_gradients() and fisher_diagonal(). See backward.h for the contract.
//
// Design. One forward over the whole sequence (positions 0..T-1, no KV cache) keeps, per layer, what the backward
// cannot cheaply recompute: the residual stream entering each norm (x_in, x_mid) with its inverse RMS, q and k
// after RoPE, v, the log-sum-exp of every attention row, the attention output, and the gate/up pre-activations
// (SmolLM2-135M at T = 512: ~12 MB per layer, ~350 MB in all). The normalized activations and silu(gate)·up are
// recomputed from those (element-wise, cheap). Attention probabilities are not kept ([heads, T, T] per layer would
// be 280 MB at T = 512): the backward recomputes each score block with one sgemm and P = exp(S - lse), the
// FlashAttention recipe, which also gives rowsum(dP∘P) as dO·O.
//
// Matmuls are OpenBLAS sgemm with the token rows batched: y = x Wᵀ forward, dx = dy W and dW = dyᵀ x backward.
// Attention runs one query head per OpenMP thread (OpenBLAS's OpenMP build runs an sgemm called inside a parallel
// region on the calling thread alone), in causal blocks of query rows that only touch the keys they can see; a
// head's dK/dV go to its own buffer and are summed per KV head afterwards, so no two threads write the same memory.
// The head (logits [T, vocab]) is processed in row chunks, so the [T, vocab] logits gradient never exists in full.
// Cost: about 3x the forward's FLOPs, nearly all in sgemm (SmolLM2 at T = 512: ~420 GFLOP, 4.5 s of CPU time).
//
// Gradients leave through a GradSink, one tensor at a time: loss_and_gradients stores them, fisher_diagonal squares
// them into its running sum straight away (one scratch buffer instead of a second full copy of the weights).
#include "model/backward.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace lowbit {

namespace {

// Element-wise loops fork threads only above this many elements (the fork/join costs more below it).
constexpr int64_t kMinParallelElems = 1 << 16;
// Query rows per attention block: a score block [64, T] stays in L2 at T = 2048 (512 KB).
constexpr int kAttnBlockRows = 64;
// Logit rows per head chunk: [128, 49152] fp32 = 24 MB for SmolLM2, instead of [T, vocab] at once.
constexpr int kHeadChunkRows = 128;

// Where gradients go. open() hands out a buffer for numel floats (contents undefined: writers that accumulate zero
// it first); close() says the gradient is complete.
class GradSink {
 public:
  virtual ~GradSink() = default;
  virtual float* open(const std::string& name, int64_t numel) = 0;
  virtual void close(const std::string& name) = 0;
};

class StoreSink : public GradSink {
 public:
  explicit StoreSink(std::map<std::string, std::vector<float>>& out) : out_(out) {}
  float* open(const std::string& name, int64_t numel) override {
    std::vector<float>& g = out_[name];
    g.resize(static_cast<size_t>(numel));
    return g.data();
  }
  void close(const std::string&) override {}

 private:
  std::map<std::string, std::vector<float>>& out_;
};

// Adds g² into diag[name]; only one gradient is open at a time (the linear-weights-only backward opens them in turn).
class SquareSumSink : public GradSink {
 public:
  explicit SquareSumSink(std::map<std::string, std::vector<float>>& diag) : diag_(diag) {}
  float* open(const std::string& name, int64_t numel) override {
    LOWBIT_CHECK(open_.empty(), "fisher_diagonal: gradient ", name, " opened while ", open_, " is open");
    open_ = name;
    scratch_.resize(static_cast<size_t>(numel));
    return scratch_.data();
  }
  void close(const std::string& name) override {
    std::vector<float>& d = diag_[name];
    if (d.empty()) d.assign(scratch_.size(), 0.0f);
    LOWBIT_CHECK(d.size() == scratch_.size(), "fisher_diagonal: ", name, " changed size");
    const int64_t n = static_cast<int64_t>(d.size());
    float* dp = d.data();
    const float* g = scratch_.data();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElems)
    for (int64_t i = 0; i < n; ++i) dp[i] += g[i] * g[i];
    open_.clear();
  }

 private:
  std::map<std::string, std::vector<float>>& diag_;
  std::vector<float> scratch_;
  std::string open_;
};

struct LayerParams {
  std::string prefix;                                   // "model.layers.<l>."
  const float* attn_norm = nullptr;                     // [dim]
  const float* ffn_norm = nullptr;                      // [dim]
  const float *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;   // [qd, dim], [kvd, dim] x2, [dim, qd]
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;                  // [qd], [kvd], [kvd] or nullptr
  const float *wg = nullptr, *wu = nullptr, *wd = nullptr;                  // [hid, dim] x2, [dim, hid]
};

// What the forward keeps of one layer for the backward (T rows each).
struct LayerActs {
  std::vector<float> x_in, inv_rms_attn;   // residual entering the attention norm [T, dim], 1/rms [T]
  std::vector<float> q, k, v;              // after RoPE (q, k) [T, qd], [T, kvd], [T, kvd]
  std::vector<float> lse;                  // log-sum-exp of each attention row [T, n_heads]
  std::vector<float> att;                  // attention output, o_proj's input [T, qd]
  std::vector<float> x_mid, inv_rms_ffn;   // residual entering the ffn norm [T, dim], 1/rms [T]
  std::vector<float> gate, up;             // pre-activations [T, hid]
};

std::vector<float> zeros(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); }

// y[m, n] = x[m, k] · W[n, k]ᵀ + beta · y
void matmul_xwt(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, float beta = 0.0f) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, x, static_cast<int>(k), w, static_cast<int>(k), beta, y, static_cast<int>(n));
}
// dx[m, k] = dy[m, n] · W[n, k] + beta · dx
void matmul_dy_w(const float* dy, const float* w, float* dx, int64_t m, int64_t n, int64_t k, float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(k),
              static_cast<int>(n), 1.0f, dy, static_cast<int>(n), w, static_cast<int>(k), beta, dx,
              static_cast<int>(k));
}
// dW[n, k] = dy[m, n]ᵀ · x[m, k] + beta · dW
void matmul_dyt_x(const float* dy, const float* x, float* dw, int64_t m, int64_t n, int64_t k, float beta) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(k),
              static_cast<int>(m), 1.0f, dy, static_cast<int>(n), x, static_cast<int>(k), beta, dw,
              static_cast<int>(k));
}

// y = w · x / rms(x) row by row, exactly as forward.cpp computes it (double sum of squares, fp32 1/rms).
void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    if (inv_rms) inv_rms[r] = inv;
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = w[i] * (xr[i] * inv);
  }
}

// The normalized rows again, from the kept input and 1/rms (no reduction: bit-identical to the forward).
void rmsnorm_recompute(const float* x, const float* w, const float* inv_rms, float* y, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelElems)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = w[i] * (x[r * dim + i] * inv_rms[r]);
}

// y = w ∘ n, n = x·inv: dx += inv·(dn - n·mean(dn∘n)) with dn = dy ∘ w;  dw = Σ_rows dy ∘ n (when dw != nullptr).
void rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx, float* dw,
                      int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    const double inv = inv_rms[r];
    double dot = 0.0;
    for (int64_t i = 0; i < dim; ++i) dot += static_cast<double>(dyr[i]) * w[i] * xr[i] * inv;
    const double mean = dot / static_cast<double>(dim);
    for (int64_t i = 0; i < dim; ++i) {
      const double n = xr[i] * inv;
      dx[r * dim + i] += static_cast<float>(inv * (static_cast<double>(dyr[i]) * w[i] - n * mean));
    }
  }
  if (dw == nullptr) return;
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelElems)
  for (int64_t i = 0; i < dim; ++i) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(dy[r * dim + i]) * x[r * dim + i] * inv_rms[r];
    dw[i] = static_cast<float>(acc);
  }
}

// Rotates x[T][heads][hd] (row stride ld, row t at position t) in the Hugging Face half-split convention.
// transpose = true applies Rᵀ (rotation by -angle): the backward of the rotation.
void rope_rows(const Model& model, float* x, int64_t ld, int T, int heads, bool transpose) {
  const int hd = model.config().head_dim, half = hd / 2;
  const float* cos_table = model.rope_cos();
  const float* sin_table = model.rope_sin();
  const float sign = transpose ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static) if (static_cast<int64_t>(T) * heads * hd >= kMinParallelElems)
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < heads; ++h) {
      float* v = x + t * ld + h * hd;
      const float* cs = cos_table + static_cast<int64_t>(t) * half;
      const float* sn = sin_table + static_cast<int64_t>(t) * half;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half], s = sign * sn[i];
        v[i] = a * cs[i] - b * s;
        v[i + half] = b * cs[i] + a * s;
      }
    }
  }
}

// Keys [lo, t] are visible to query t (causal, optionally a sliding window).
inline int first_visible(int t, int window) { return window > 0 ? std::max(0, t - window + 1) : 0; }

// Causal GQA attention over positions 0..T-1: att[t, h] = softmax(q_h kᵀ / sqrt(hd)) v, lse[t, h] its log-sum-exp.
void attention_forward(const ModelConfig& c, int T, const float* q, const float* k, const float* v, float* att,
                       float* lse) {
  const int hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), H = c.n_heads, group = c.n_heads / c.n_kv_heads;
  const int window = c.sliding_window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(kAttnBlockRows) * T);
#pragma omp for schedule(dynamic)
    for (int h = 0; h < H; ++h) {
      const float* kh = k + (h / group) * hd;
      const float* vh = v + (h / group) * hd;
      for (int t0 = 0; t0 < T; t0 += kAttnBlockRows) {
        const int t1 = std::min(T, t0 + kAttnBlockRows), rows = t1 - t0;
        const int first = first_visible(t0, window), span = t1 - first;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, span, hd, scale, q + t0 * qd + h * hd, qd,
                    kh + first * kvd, kvd, 0.0f, s.data(), span);
        for (int r = 0; r < rows; ++r) {
          const int t = t0 + r, lo = first_visible(t, window) - first, last = t - first;
          float* sr = s.data() + static_cast<int64_t>(r) * span;
          float mx = -INFINITY;
          for (int j = lo; j <= last; ++j) mx = std::max(mx, sr[j]);
          double sum = 0.0;
          for (int j = lo; j <= last; ++j) sum += (sr[j] = std::exp(sr[j] - mx));
          const float inv = static_cast<float>(1.0 / sum);
          std::fill(sr, sr + lo, 0.0f);
          for (int j = lo; j <= last; ++j) sr[j] *= inv;
          std::fill(sr + last + 1, sr + span, 0.0f);
          lse[t * H + h] = mx + static_cast<float>(std::log(sum));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, span, 1.0f, s.data(), span,
                    vh + first * kvd, kvd, 0.0f, att + t0 * qd + h * hd, qd);
      }
    }
  }
}

// Backward of attention_forward: with P = exp(S - lse), dP = dO vᵀ, dS = P ∘ (dP - rowsum(dO ∘ O)):
// dq = dS k / sqrt(hd), dk = dSᵀ q / sqrt(hd), dv = Pᵀ dO, summed over the query heads of each KV head.
void attention_backward(const ModelConfig& c, int T, const LayerActs& a, const float* datt, float* dq, float* dk,
                        float* dv) {
  const int hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), H = c.n_heads, group = c.n_heads / c.n_kv_heads;
  const int window = c.sliding_window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Per query head dK, dV [H][T][hd]: written by one thread each, reduced per KV head below.
  std::vector<float> dk_head = zeros(static_cast<int64_t>(H) * T * hd), dv_head = zeros(static_cast<int64_t>(H) * T * hd);
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(kAttnBlockRows) * T), dp(p.size()), rowdot(static_cast<size_t>(T));
#pragma omp for schedule(dynamic)
    for (int h = 0; h < H; ++h) {
      const float* qh = a.q.data() + h * hd;
      const float* kh = a.k.data() + (h / group) * hd;
      const float* vh = a.v.data() + (h / group) * hd;
      const float* oh = a.att.data() + h * hd;
      const float* doh = datt + h * hd;
      float* dkh = dk_head.data() + static_cast<int64_t>(h) * T * hd;
      float* dvh = dv_head.data() + static_cast<int64_t>(h) * T * hd;
      for (int t = 0; t < T; ++t) {
        double acc = 0.0;
        for (int i = 0; i < hd; ++i) acc += static_cast<double>(doh[t * qd + i]) * oh[t * qd + i];
        rowdot[static_cast<size_t>(t)] = static_cast<float>(acc);
      }
      for (int t0 = 0; t0 < T; t0 += kAttnBlockRows) {
        const int t1 = std::min(T, t0 + kAttnBlockRows), rows = t1 - t0;
        const int first = first_visible(t0, window), span = t1 - first;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, span, hd, scale, qh + t0 * qd, qd,
                    kh + first * kvd, kvd, 0.0f, p.data(), span);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, span, hd, 1.0f, doh + t0 * qd, qd,
                    vh + first * kvd, kvd, 0.0f, dp.data(), span);
        for (int r = 0; r < rows; ++r) {
          const int t = t0 + r, lo = first_visible(t, window) - first, last = t - first;
          float* pr = p.data() + static_cast<int64_t>(r) * span;
          float* dsr = dp.data() + static_cast<int64_t>(r) * span;   // dP in, dS out
          const float l = a.lse[static_cast<size_t>(t * H + h)], d = rowdot[static_cast<size_t>(t)];
          for (int j = 0; j < span; ++j) {
            const bool visible = j >= lo && j <= last;
            pr[j] = visible ? std::exp(pr[j] - l) : 0.0f;
            dsr[j] = visible ? pr[j] * (dsr[j] - d) : 0.0f;
          }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, span, scale, dp.data(), span,
                    kh + first * kvd, kvd, 0.0f, dq + t0 * qd + h * hd, qd);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, span, hd, rows, scale, dp.data(), span, qh + t0 * qd,
                    qd, 1.0f, dkh + first * hd, hd);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, span, hd, rows, 1.0f, p.data(), span, doh + t0 * qd,
                    qd, 1.0f, dvh + first * hd, hd);
      }
    }
  }
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(T) * kvd >= kMinParallelElems)
  for (int t = 0; t < T; ++t) {
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      for (int i = 0; i < hd; ++i) {
        float sk = 0.0f, sv = 0.0f;
        for (int g = 0; g < group; ++g) {
          const int64_t idx = (static_cast<int64_t>(kvh * group + g) * T + t) * hd + i;
          sk += dk_head[static_cast<size_t>(idx)];
          sv += dv_head[static_cast<size_t>(idx)];
        }
        dk[t * kvd + kvh * hd + i] = sk;
        dv[t * kvd + kvh * hd + i] = sv;
      }
    }
  }
}

std::vector<LayerParams> layer_params(const Model& model) {
  const ModelConfig& c = model.config();
  std::vector<LayerParams> layers(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    LayerParams& L = layers[static_cast<size_t>(l)];
    L.prefix = "model.layers." + std::to_string(l) + ".";
    const std::string& p = L.prefix;
    L.attn_norm = model.tensor_f32(p + "input_layernorm.weight");
    L.ffn_norm = model.tensor_f32(p + "post_attention_layernorm.weight");
    L.wq = model.tensor_f32(p + "self_attn.q_proj.weight");
    L.wk = model.tensor_f32(p + "self_attn.k_proj.weight");
    L.wv = model.tensor_f32(p + "self_attn.v_proj.weight");
    L.wo = model.tensor_f32(p + "self_attn.o_proj.weight");
    if (c.qkv_bias) {
      L.bq = model.tensor_f32(p + "self_attn.q_proj.bias");
      L.bk = model.tensor_f32(p + "self_attn.k_proj.bias");
      L.bv = model.tensor_f32(p + "self_attn.v_proj.bias");
    }
    L.wg = model.tensor_f32(p + "mlp.gate_proj.weight");
    L.wu = model.tensor_f32(p + "mlp.up_proj.weight");
    L.wd = model.tensor_f32(p + "mlp.down_proj.weight");
  }
  return layers;
}

void add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  if (b == nullptr) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += b[i];
}

// db[n] = Σ_rows dy[rows, n]
void bias_grad(const float* dy, float* db, int64_t rows, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; ++r) acc += dy[r * n + i];
    db[i] = static_cast<float>(acc);
  }
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// dW = dyᵀ x into the sink's buffer for `name`.
void emit_weight_grad(GradSink& sink, const std::string& name, const float* dy, const float* x, int64_t rows,
                      int64_t out, int64_t in) {
  float* dw = sink.open(name, out * in);
  matmul_dyt_x(dy, x, dw, rows, out, in, 0.0f);
  sink.close(name);
}

// The whole computation; returns the loss. Gradients go to sink (only linear weights when linear_only).
double forward_backward(const Model& model, const std::vector<int32_t>& tokens, bool linear_only, GradSink& sink) {
  const ModelConfig& c = model.config();
  const int T = static_cast<int>(tokens.size());
  LOWBIT_CHECK(T >= 2, "loss_and_gradients: need at least 2 tokens (one prediction), got ", T);
  LOWBIT_CHECK(T <= c.max_seq_len, "loss_and_gradients: ", T, " tokens exceed the model's maximum of ",
               c.max_seq_len, " positions");
  for (int32_t id : tokens)
    LOWBIT_CHECK(id >= 0 && id < c.vocab_size, "loss_and_gradients: token id ", id, " out of range [0, ",
                 c.vocab_size, ")");
  const int64_t D = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, V = c.vocab_size;
  const int64_t TD = T * D;
  const std::vector<LayerParams> layers = layer_params(model);
  const float* emb = model.tensor_f32("model.embed_tokens.weight");
  const float* final_norm = model.tensor_f32("model.norm.weight");
  const std::string head_name = c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  const float* head = model.tensor_f32(head_name);

  // ---- forward, keeping activations ----
  std::vector<LayerActs> acts(static_cast<size_t>(c.n_layers));
  std::vector<float> x = zeros(TD), xn = zeros(TD), h = zeros(T * hid);
  for (int t = 0; t < T; ++t) std::copy_n(emb + tokens[static_cast<size_t>(t)] * D, D, x.data() + t * D);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerParams& L = layers[static_cast<size_t>(l)];
    LayerActs& a = acts[static_cast<size_t>(l)];
    a.x_in = x;
    a.inv_rms_attn = zeros(T);
    rmsnorm_forward(x.data(), L.attn_norm, xn.data(), a.inv_rms_attn.data(), T, D, c.rms_eps);
    a.q = zeros(T * qd), a.k = zeros(T * kvd), a.v = zeros(T * kvd);
    matmul_xwt(xn.data(), L.wq, a.q.data(), T, qd, D);
    matmul_xwt(xn.data(), L.wk, a.k.data(), T, kvd, D);
    matmul_xwt(xn.data(), L.wv, a.v.data(), T, kvd, D);
    add_bias(a.q.data(), L.bq, T, qd);
    add_bias(a.k.data(), L.bk, T, kvd);
    add_bias(a.v.data(), L.bv, T, kvd);
    rope_rows(model, a.q.data(), qd, T, c.n_heads, false);
    rope_rows(model, a.k.data(), kvd, T, c.n_kv_heads, false);
    a.att = zeros(T * qd), a.lse = zeros(static_cast<int64_t>(T) * c.n_heads);
    attention_forward(c, T, a.q.data(), a.k.data(), a.v.data(), a.att.data(), a.lse.data());
    matmul_xwt(a.att.data(), L.wo, x.data(), T, D, qd, 1.0f);   // x += att Woᵀ
    a.x_mid = x;
    a.inv_rms_ffn = zeros(T);
    rmsnorm_forward(x.data(), L.ffn_norm, xn.data(), a.inv_rms_ffn.data(), T, D, c.rms_eps);
    a.gate = zeros(T * hid), a.up = zeros(T * hid);
    matmul_xwt(xn.data(), L.wg, a.gate.data(), T, hid, D);
    matmul_xwt(xn.data(), L.wu, a.up.data(), T, hid, D);
    const float* g = a.gate.data();
    const float* u = a.up.data();
#pragma omp parallel for schedule(static) if (T * hid >= kMinParallelElems)
    for (int64_t i = 0; i < T * hid; ++i) h[static_cast<size_t>(i)] = g[i] * sigmoid(g[i]) * u[i];
    matmul_xwt(h.data(), L.wd, x.data(), T, D, hid, 1.0f);      // x += h Wdᵀ
  }
  std::vector<float> inv_rms_final = zeros(T);
  rmsnorm_forward(x.data(), final_norm, xn.data(), inv_rms_final.data(), T, D, c.rms_eps);

  // ---- head and loss, in row chunks: logits -> dlogits = (softmax - onehot) / N -> dxn, dHead ----
  const int64_t N = T - 1;   // predicted positions; the last row predicts nothing and gets no gradient
  std::vector<float> dxn = zeros(TD);
  float* dhead = nullptr;
  if (!linear_only) {
    dhead = sink.open(head_name, V * D);
    std::fill(dhead, dhead + V * D, 0.0f);
  }
  std::vector<double> row_loss(static_cast<size_t>(N));
  std::vector<float> logits(static_cast<size_t>(std::min<int64_t>(N, kHeadChunkRows) * V));
  for (int64_t r0 = 0; r0 < N; r0 += kHeadChunkRows) {
    const int64_t rows = std::min<int64_t>(kHeadChunkRows, N - r0);
    matmul_xwt(xn.data() + r0 * D, head, logits.data(), rows, V, D);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* lr = logits.data() + r * V;
      const int32_t target = tokens[static_cast<size_t>(r0 + r + 1)];
      const float target_logit = lr[target];
      float mx = -INFINITY;
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, lr[j]);
      double sum = 0.0;
      for (int64_t j = 0; j < V; ++j) sum += (lr[j] = std::exp(lr[j] - mx));
      row_loss[static_cast<size_t>(r0 + r)] = std::log(sum) + mx - target_logit;
      const float scale = static_cast<float>(1.0 / (sum * static_cast<double>(N)));
      for (int64_t j = 0; j < V; ++j) lr[j] *= scale;
      lr[target] -= static_cast<float>(1.0 / static_cast<double>(N));
    }
    matmul_dy_w(logits.data(), head, dxn.data() + r0 * D, rows, V, D, 0.0f);
    if (dhead) matmul_dyt_x(logits.data(), xn.data() + r0 * D, dhead, rows, V, D, 1.0f);
  }
  double loss = 0.0;
  for (double v : row_loss) loss += v;
  loss /= static_cast<double>(N);
  if (dhead && !c.tie_embeddings) sink.close(head_name);

  // dx: gradient of the loss with respect to the residual stream, walked back layer by layer.
  std::vector<float> dx = zeros(TD);
  {
    float* dw = linear_only ? nullptr : sink.open("model.norm.weight", D);
    rmsnorm_backward(x.data(), final_norm, inv_rms_final.data(), dxn.data(), dx.data(), dw, T, D);
    if (dw) sink.close("model.norm.weight");
  }
  std::vector<float> dh = zeros(T * hid), datt = zeros(T * qd), dq = zeros(T * qd), dk = zeros(T * kvd),
                     dv = zeros(T * kvd);
  for (int l = c.n_layers - 1; l >= 0; --l) {
    const LayerParams& L = layers[static_cast<size_t>(l)];
    LayerActs& a = acts[static_cast<size_t>(l)];
    const std::string& p = L.prefix;
    // FFN: x_out = x_mid + down(silu(gate) ∘ up), gate/up = W · ffn_norm(x_mid).
    const float* g = a.gate.data();
    const float* u = a.up.data();
#pragma omp parallel for schedule(static) if (T * hid >= kMinParallelElems)
    for (int64_t i = 0; i < T * hid; ++i) h[static_cast<size_t>(i)] = g[i] * sigmoid(g[i]) * u[i];
    emit_weight_grad(sink, p + "mlp.down_proj.weight", dx.data(), h.data(), T, D, hid);
    matmul_dy_w(dx.data(), L.wd, dh.data(), T, D, hid, 0.0f);
    float* dgate = h.data();    // h is no longer needed: dgate overwrites it, dup overwrites dh
#pragma omp parallel for schedule(static) if (T * hid >= kMinParallelElems)
    for (int64_t i = 0; i < T * hid; ++i) {
      const float s = sigmoid(g[i]), dhi = dh[static_cast<size_t>(i)];
      dgate[i] = dhi * u[i] * s * (1.0f + g[i] * (1.0f - s));
      dh[static_cast<size_t>(i)] = dhi * g[i] * s;
    }
    const float* dup = dh.data();
    rmsnorm_recompute(a.x_mid.data(), L.ffn_norm, a.inv_rms_ffn.data(), xn.data(), T, D);
    emit_weight_grad(sink, p + "mlp.gate_proj.weight", dgate, xn.data(), T, hid, D);
    emit_weight_grad(sink, p + "mlp.up_proj.weight", dup, xn.data(), T, hid, D);
    matmul_dy_w(dgate, L.wg, dxn.data(), T, hid, D, 0.0f);
    matmul_dy_w(dup, L.wu, dxn.data(), T, hid, D, 1.0f);
    {
      float* dw = linear_only ? nullptr : sink.open(p + "post_attention_layernorm.weight", D);
      rmsnorm_backward(a.x_mid.data(), L.ffn_norm, a.inv_rms_ffn.data(), dxn.data(), dx.data(), dw, T, D);
      if (dw) sink.close(p + "post_attention_layernorm.weight");
    }
    // Attention: x_mid = x_in + o(attn(rope(q), rope(k), v)), q/k/v = W · attn_norm(x_in) + b.
    emit_weight_grad(sink, p + "self_attn.o_proj.weight", dx.data(), a.att.data(), T, D, qd);
    matmul_dy_w(dx.data(), L.wo, datt.data(), T, D, qd, 0.0f);
    attention_backward(c, T, a, datt.data(), dq.data(), dk.data(), dv.data());
    rope_rows(model, dq.data(), qd, T, c.n_heads, true);
    rope_rows(model, dk.data(), kvd, T, c.n_kv_heads, true);
    rmsnorm_recompute(a.x_in.data(), L.attn_norm, a.inv_rms_attn.data(), xn.data(), T, D);
    emit_weight_grad(sink, p + "self_attn.q_proj.weight", dq.data(), xn.data(), T, qd, D);
    emit_weight_grad(sink, p + "self_attn.k_proj.weight", dk.data(), xn.data(), T, kvd, D);
    emit_weight_grad(sink, p + "self_attn.v_proj.weight", dv.data(), xn.data(), T, kvd, D);
    if (c.qkv_bias && !linear_only) {
      const std::pair<const char*, std::pair<const float*, int64_t>> biases[] = {
          {"self_attn.q_proj.bias", {dq.data(), qd}}, {"self_attn.k_proj.bias", {dk.data(), kvd}},
          {"self_attn.v_proj.bias", {dv.data(), kvd}}};
      for (const auto& [suffix, grad] : biases) {
        bias_grad(grad.first, sink.open(p + suffix, grad.second), T, grad.second);
        sink.close(p + suffix);
      }
    }
    matmul_dy_w(dq.data(), L.wq, dxn.data(), T, qd, D, 0.0f);
    matmul_dy_w(dk.data(), L.wk, dxn.data(), T, kvd, D, 1.0f);
    matmul_dy_w(dv.data(), L.wv, dxn.data(), T, kvd, D, 1.0f);
    {
      float* dw = linear_only ? nullptr : sink.open(p + "input_layernorm.weight", D);
      rmsnorm_backward(a.x_in.data(), L.attn_norm, a.inv_rms_attn.data(), dxn.data(), dx.data(), dw, T, D);
      if (dw) sink.close(p + "input_layernorm.weight");
    }
    a = LayerActs();   // free this layer's activations as soon as they are used
  }

  // Embedding: scatter-add the rows (tokens repeat, so serially); tied models add to the head's gradient.
  if (!linear_only) {
    const std::string emb_name = "model.embed_tokens.weight";
    float* demb = c.tie_embeddings ? dhead : sink.open(emb_name, V * D);
    if (!c.tie_embeddings) std::fill(demb, demb + V * D, 0.0f);
    for (int t = 0; t < T; ++t) {
      float* row = demb + tokens[static_cast<size_t>(t)] * D;
      for (int64_t i = 0; i < D; ++i) row[i] += dx[static_cast<size_t>(t * D + i)];
    }
    sink.close(emb_name);
  }
  return loss;
}

}  // namespace

std::vector<std::string> linear_weight_names(const ModelConfig& config) {
  std::vector<std::string> names;
  for (int l = 0; l < config.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* s : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      names.push_back(p + s + ".weight");
  }
  return names;
}

Gradients loss_and_gradients(const Model& model, const std::vector<int32_t>& tokens, bool linear_weights_only) {
  Gradients out;
  StoreSink sink(out.grad);
  out.loss = forward_backward(model, tokens, linear_weights_only, sink);
  out.predicted = static_cast<int64_t>(tokens.size()) - 1;
  return out;
}

FisherDiag fisher_diagonal(const Model& model, const std::vector<std::vector<int32_t>>& sequences,
                           const std::function<void(int done, int total)>& progress) {
  LOWBIT_CHECK(!sequences.empty(), "fisher_diagonal: no sequences");
  FisherDiag out;
  SquareSumSink sink(out.diag);
  double loss_sum = 0.0;
  const int total = static_cast<int>(sequences.size());
  for (int s = 0; s < total; ++s) {
    loss_sum += forward_backward(model, sequences[static_cast<size_t>(s)], true, sink);
    out.sequences = s + 1;
    if (progress) progress(s + 1, total);
  }
  out.mean_loss = loss_sum / total;
  return out;
}

}  // namespace lowbit
