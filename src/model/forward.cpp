// CPU forward passes. See model.h for the contract shared by forward() and forward_ref().
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/model.h"

namespace lowbit {

namespace {

// Element-wise loops fork threads only above this many elements: below it the fork/join costs more than the work
// (stories260K has dim 64; a decode step of SmolLM2 touches 576..1536 elements per op).
constexpr int64_t kMinParallelElems = 1 << 16;
// Attention rows (query position x head of a group) per block: the score block [rows, keys] stays in L2.
constexpr int kAttnBlockRows = 256;

// y = x / rms(x) * w, accumulated in double (HF computes the variance in fp32; double keeps us closer to exact).
void rmsnorm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// exp for x <= 0 in plain arithmetic so the softmax loop vectorizes (libm's expf is a call per element):
// 2^(x·log2 e) split into 2^n · 2^f, f in [-0.5, 0.5], degree-6 polynomial; relative error < 2e-7 on [-87, 0],
// flushes to 0 below -87 (where expf is below fp32's normal range anyway).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f;
  const float n = std::nearbyint(t);
  const float f = t - n;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += static_cast<int32_t>(n) << 23;
  std::memcpy(&p, &bits, 4);
  return p;
}

// In-place softmax of s[lo..last] (inclusive); every other entry of s[0..span) becomes 0.
void softmax_masked(float* s, int span, int lo, int last) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = lo; j <= last; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = lo; j <= last; ++j) {
    s[j] = exp_nonpositive(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  std::fill(s, s + lo, 0.0f);
#pragma omp simd
  for (int j = lo; j <= last; ++j) s[j] *= inv;
  std::fill(s + last + 1, s + span, 0.0f);
}

}  // namespace

// Rotates rows x[n][heads][head_dim] in the Hugging Face half-split convention, row t at position pos0 + t.
void Model::rope(float* x, int row_stride, int pos0, int n, int heads) const {
  const int hd = config().head_dim, half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static) if (static_cast<int64_t>(n) * heads * hd >= kMinParallelElems)
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < heads; ++h) {
      float* v = x + static_cast<int64_t>(t) * row_stride + h * hd;
      const float* cs = rope_cos_.data() + static_cast<size_t>(pos0 + t) * half;
      const float* sn = rope_sin_.data() + static_cast<size_t>(pos0 + t) * half;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

// Causal GQA attention of n new queries (positions pos0 ..) against the cache, one KV head at a time:
// the `group` query heads that share a KV head are gathered into one matrix Qg [n*group, hd] (row t*group + g),
// so K and V are streamed once per KV head instead of once per query head (3x less traffic on SmolLM2). Rows are
// processed in blocks of query positions; a block only multiplies against the keys it can see (causal), which
// halves the prefill FLOPs and keeps the score block [rows, keys] in cache.
//   scores = Qg Kᵀ / sqrt(hd) (sgemm) -> masked softmax per row -> out = P V (sgemm) -> scatter to out[t][h].
void Model::attention(int layer, const float* q, int n, int pos0, KVCache& cache, float* out) const {
  const ModelConfig& c = config();
  const int hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int block_t = std::max(1, kAttnBlockRows / group);   // query positions per block
  const int window = c.sliding_window;
  // kbase / vbase: the rows of positions base_pos .. pos0 + n - 1. A paged cache's rows are gathered into one
  // contiguous copy first (the same reads the products make), so the GEMMs below run on either layout.
  const int base_pos = window > 0 ? std::max(0, pos0 - window + 1) : 0;
  std::vector<float> kg, vg;
  const float* kbase;
  const float* vbase;
  if (cache.paged()) {
    const size_t rows_all = static_cast<size_t>(pos0 + n - base_pos);
    kg.resize(rows_all * kvd);
    vg.resize(rows_all * kvd);
    for (int j = base_pos; j < pos0 + n; ++j) {
      std::copy_n(cache.k_at(layer, j), kvd, kg.data() + static_cast<size_t>(j - base_pos) * kvd);
      std::copy_n(cache.v_at(layer, j), kvd, vg.data() + static_cast<size_t>(j - base_pos) * kvd);
    }
    kbase = kg.data();
    vbase = vg.data();
  } else {
    kbase = cache.k_at(layer, base_pos);
    vbase = cache.v_at(layer, base_pos);
  }
  std::vector<float> qg(static_cast<size_t>(std::min(n, block_t)) * group * hd);
  std::vector<float> og(qg.size());
  std::vector<float> scores(static_cast<size_t>(std::min(n, block_t)) * group * (pos0 + n));
  for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
    for (int t0 = 0; t0 < n; t0 += block_t) {
      const int t1 = std::min(n, t0 + block_t);
      const int rows = (t1 - t0) * group;
      const int keys = pos0 + t1;                 // the last query of the block sees keys [0, keys)
      const int first_key = window > 0 ? std::max(0, pos0 + t0 - window + 1) : 0;
      const int span = keys - first_key;
      for (int t = t0; t < t1; ++t)
        std::copy_n(q + static_cast<int64_t>(t) * qd + kvh * group * hd, group * hd,
                    qg.data() + static_cast<size_t>(t - t0) * group * hd);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, span, hd, scale, qg.data(), hd,
                  kbase + static_cast<int64_t>(first_key - base_pos) * kvd + kvh * hd, kvd, 0.0f, scores.data(), span);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(rows) * span >= kMinParallelElems)
      for (int r = 0; r < rows; ++r) {
        float* s = scores.data() + static_cast<size_t>(r) * span;
        const int last = pos0 + t0 + r / group - first_key;   // inclusive, relative to first_key
        const int lo = window > 0 ? std::max(0, last - window + 1) : 0;
        softmax_masked(s, span, lo, last);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, span, 1.0f, scores.data(), span,
                  vbase + static_cast<int64_t>(first_key - base_pos) * kvd + kvh * hd, kvd, 0.0f, og.data(), hd);
      for (int t = t0; t < t1; ++t)
        std::copy_n(og.data() + static_cast<size_t>(t - t0) * group * hd, group * hd,
                    out + static_cast<int64_t>(t) * qd + kvh * group * hd);
    }
  }
}

void Model::embed(const int32_t* tokens, int n, float* x) const {
  const ModelConfig& c = config();
  for (int t = 0; t < n; ++t) {
    LOWBIT_CHECK(tokens[t] >= 0 && tokens[t] < c.vocab_size, "forward: token id ", tokens[t], " out of range [0, ",
                 c.vocab_size, ")");
    std::copy_n(tok_emb_ + static_cast<int64_t>(tokens[t]) * c.dim, c.dim, x + static_cast<int64_t>(t) * c.dim);
  }
}

void Model::layer_forward(int l, float* x, int n, int pos0, KVCache& cache, const LinearInputHook* hook,
                          int bits) const {
  const RowSpan one{&cache, pos0, n};
  layer_forward_spans(l, x, std::span<const RowSpan>(&one, 1), hook, bits);
}

void Model::layer_forward_spans(int l, float* x, std::span<const RowSpan> spans, const LinearInputHook* hook,
                                int bits) const {
  const ModelConfig& c = config();
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  int n = 0;
  for (const RowSpan& sp : spans) n += sp.n;
  std::vector<float> xn(static_cast<size_t>(n * dim)), q(static_cast<size_t>(n * qd)), att(q.size()),
      k(static_cast<size_t>(n * kvd)), v(k.size()), g(static_cast<size_t>(n * hid)), u(g.size());
  const LayerWeights& L = layers_[static_cast<size_t>(l)];
  rmsnorm_rows(x, L.attn_norm, xn.data(), n, dim, c.rms_eps);
  if (hook) (*hook)(l, LinearSlot::Qkv, xn.data(), n, dim);
  L.q->forward(xn.data(), n, q.data(), bits);
  L.k->forward(xn.data(), n, k.data(), bits);
  L.v->forward(xn.data(), n, v.data(), bits);
  for (int64_t r0 = 0; const RowSpan& sp : spans) {
    float* qs = q.data() + r0 * qd;
    float* ks = k.data() + r0 * kvd;
    rope(qs, static_cast<int>(qd), sp.pos0, sp.n, c.n_heads);
    rope(ks, static_cast<int>(kvd), sp.pos0, sp.n, c.n_kv_heads);
    for (int t = 0; t < sp.n; ++t) {
      std::copy_n(ks + t * kvd, kvd, sp.cache->k_at(l, sp.pos0 + t));
      std::copy_n(v.data() + (r0 + t) * kvd, kvd, sp.cache->v_at(l, sp.pos0 + t));
    }
    attention(l, qs, sp.n, sp.pos0, *sp.cache, att.data() + r0 * qd);
    r0 += sp.n;
  }
  if (hook) (*hook)(l, LinearSlot::O, att.data(), n, qd);
  L.o->forward(att.data(), n, xn.data(), bits);
#pragma omp parallel for schedule(static) if (n * dim >= kMinParallelElems)
  for (int64_t i = 0; i < n * dim; ++i) x[i] += xn[static_cast<size_t>(i)];
  rmsnorm_rows(x, L.ffn_norm, xn.data(), n, dim, c.rms_eps);
  if (hook) (*hook)(l, LinearSlot::GateUp, xn.data(), n, dim);
  L.gate->forward(xn.data(), n, g.data(), bits);
  L.up->forward(xn.data(), n, u.data(), bits);
#pragma omp parallel for schedule(static) if (n * hid >= kMinParallelElems)
  for (int64_t i = 0; i < n * hid; ++i) g[static_cast<size_t>(i)] = silu(g[static_cast<size_t>(i)]) * u[static_cast<size_t>(i)];
  if (hook) (*hook)(l, LinearSlot::Down, g.data(), n, hid);
  L.down->forward(g.data(), n, xn.data(), bits);
#pragma omp parallel for schedule(static) if (n * dim >= kMinParallelElems)
  for (int64_t i = 0; i < n * dim; ++i) x[i] += xn[static_cast<size_t>(i)];
}

void Model::head_forward(const float* x, int n, float* logits) const {
  const int64_t dim = config().dim;
  std::vector<float> xn(static_cast<size_t>(n * dim));
  rmsnorm_rows(x, final_norm_, xn.data(), n, dim, config().rms_eps);
  head_->forward(xn.data(), n, logits);
}

void Model::forward(const int32_t* tokens, int n, KVCache& cache, float* logits, bool all_logits, int bits) const {
  const ModelConfig& c = config();
  LOWBIT_CHECK(n > 0, "forward: no tokens");
  check_bits(bits);
  LOWBIT_CHECK(cache.len + n <= cache.capacity, "forward: ", cache.len + n, " positions exceed the KV cache of ",
               cache.capacity);
  const int64_t dim = c.dim;
  std::vector<float> x(static_cast<size_t>(n * dim));
  embed(tokens, n, x.data());
  const int pos0 = cache.len;
  for (int l = 0; l < c.n_layers; ++l) layer_forward(l, x.data(), n, pos0, cache, nullptr, bits);
  cache.len = pos0 + n;
  if (logits == nullptr) return;
  if (all_logits) head_forward(x.data(), n, logits);
  else head_forward(x.data() + (n - 1) * dim, 1, logits);
}

void Model::forward_batch(const int32_t* tokens, std::span<KVCache* const> caches, float* logits, int bits) const {
  const ModelConfig& c = config();
  const int n = static_cast<int>(caches.size());
  LOWBIT_CHECK(n > 0, "forward_batch: no sequences");
  check_bits(bits);
  std::vector<RowSpan> spans;
  spans.reserve(caches.size());
  for (KVCache* cache : caches) {
    LOWBIT_CHECK(cache->len + 1 <= cache->capacity, "forward_batch: a sequence's KV cache of ", cache->capacity,
                 " positions is full");
    for (const RowSpan& sp : spans) LOWBIT_CHECK(sp.cache != cache, "forward_batch: a sequence appears twice");
    spans.push_back({cache, cache->len, 1});
  }
  std::vector<float> x(static_cast<size_t>(n * c.dim));
  embed(tokens, n, x.data());
  for (int l = 0; l < c.n_layers; ++l) layer_forward_spans(l, x.data(), spans, nullptr, bits);
  for (KVCache* cache : caches) ++cache->len;
  head_forward(x.data(), n, logits);
}

// The oracle: llama2.c-style single-token loop, no BLAS, no threads, double accumulators.
void Model::forward_ref(const int32_t* tokens, int n, KVCache& cache, float* logits, bool all_logits,
                        int bits) const {
  const ModelConfig& c = config();
  check_bits(bits);
  LOWBIT_CHECK(cache.len + n <= cache.capacity, "forward_ref: KV cache full");
  const int dim = c.dim, hd = c.head_dim, half = hd / 2, qd = c.q_dim(), hid = c.hidden_dim;
  const int group = c.n_heads / c.n_kv_heads, V = c.vocab_size;
  std::vector<float> x(dim), xn(dim), q(qd), att(qd), g(hid), u(hid), tmp(dim);
  std::vector<double> s;
  auto rmsnorm = [&](const float* in, const float* w, float* out) {
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(in[i]) * in[i];
    const double inv = 1.0 / std::sqrt(ss / dim + c.rms_eps);
    for (int i = 0; i < dim; ++i) out[i] = static_cast<float>(w[i] * (in[i] * inv));
  };
  auto rotate = [&](float* vec, int pos) {
    for (int i = 0; i < half; ++i) {
      const double cs = rope_cos_[static_cast<size_t>(pos) * half + i], sn = rope_sin_[static_cast<size_t>(pos) * half + i];
      const double a = vec[i], b = vec[i + half];
      vec[i] = static_cast<float>(a * cs - b * sn);
      vec[i + half] = static_cast<float>(b * cs + a * sn);
    }
  };
  for (int t = 0; t < n; ++t) {
    const int tok = tokens[t];
    LOWBIT_CHECK(tok >= 0 && tok < V, "forward_ref: token id ", tok, " out of range");
    const int pos = cache.len;
    std::copy_n(tok_emb_ + static_cast<int64_t>(tok) * dim, dim, x.data());
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = layers_[static_cast<size_t>(l)];
      rmsnorm(x.data(), L.attn_norm, xn.data());
      float* kc = cache.k_at(l, pos);
      float* vc = cache.v_at(l, pos);
      L.q->forward_ref(xn.data(), 1, q.data(), bits);
      L.k->forward_ref(xn.data(), 1, kc, bits);
      L.v->forward_ref(xn.data(), 1, vc, bits);
      for (int h = 0; h < c.n_heads; ++h) rotate(q.data() + h * hd, pos);
      for (int h = 0; h < c.n_kv_heads; ++h) rotate(kc + h * hd, pos);
      const int first = c.sliding_window > 0 ? std::max(0, pos - c.sliding_window + 1) : 0;
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        s.assign(static_cast<size_t>(pos + 1), 0.0);
        double mx = -INFINITY;
        for (int j = first; j <= pos; ++j) {
          double dot = 0.0;
          const float* kj = cache.k_at(l, j) + kvh * hd;
          for (int i = 0; i < hd; ++i) dot += static_cast<double>(q[static_cast<size_t>(h * hd + i)]) * kj[i];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int j = first; j <= pos; ++j) sum += (s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx));
        for (int i = 0; i < hd; ++i) {
          double acc = 0.0;
          for (int j = first; j <= pos; ++j) acc += s[static_cast<size_t>(j)] * cache.v_at(l, j)[kvh * hd + i];
          att[static_cast<size_t>(h * hd + i)] = static_cast<float>(acc / sum);
        }
      }
      L.o->forward_ref(att.data(), 1, tmp.data(), bits);
      for (int i = 0; i < dim; ++i) x[static_cast<size_t>(i)] += tmp[static_cast<size_t>(i)];
      rmsnorm(x.data(), L.ffn_norm, xn.data());
      L.gate->forward_ref(xn.data(), 1, g.data(), bits);
      L.up->forward_ref(xn.data(), 1, u.data(), bits);
      for (int i = 0; i < hid; ++i) g[static_cast<size_t>(i)] = silu(g[static_cast<size_t>(i)]) * u[static_cast<size_t>(i)];
      L.down->forward_ref(g.data(), 1, tmp.data(), bits);
      for (int i = 0; i < dim; ++i) x[static_cast<size_t>(i)] += tmp[static_cast<size_t>(i)];
    }
    cache.len = pos + 1;
    if (logits != nullptr && (all_logits || t == n - 1)) {
      rmsnorm(x.data(), final_norm_, xn.data());
      head_->forward_ref(xn.data(), 1, logits + (all_logits ? static_cast<int64_t>(t) * V : 0));
    }
  }
}

}  // namespace lowbit
