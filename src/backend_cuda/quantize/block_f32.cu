// The fp32 calibration block (block_f32.h). Design: every matmul is a cuBLAS sgemm in default math (no TF32: the
// quantizers compare against the fp32 CPU path to 0.3% perplexity and their Hessians to ~1e-6); the element-wise
// steps are one small kernel each, written to repeat the CPU forward's arithmetic (rmsnorm's sum of squares in
// double, RoPE's half-split pairs, softmax with the max subtracted). Attention materialises the scores of one window,
// [heads, T, T] fp32 (512 MB at T = 2048 and 32 heads): the calibration windows are long and few, so the two
// strided-batched sgemms per query group beat a hand-written fp32 flash kernel for the effort, and the backward pass
// needs the probabilities anyway. The masked upper triangle is multiplied and then zeroed (2x the causal FLOPs of
// attention, a few % of the block's).
#include "backend_cuda/quantize/block_f32.h"

#include <cmath>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dense/dense.h"
#include "core/error.h"
#include "model/weight_convert.h"

namespace lowbit::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int dim, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  __shared__ double part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    double v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) part[0] = v;
  }
  __syncthreads();
  const float inv = static_cast<float>(1.0 / sqrt(part[0] / static_cast<double>(dim) + eps));
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

__global__ void rope_kernel(float* x, int64_t ld, int T, int heads, int hd, const float* cos_t, const float* sin_t,
                            bool inverse) {
  const int half = hd / 2;
  const int64_t total = static_cast<int64_t>(T) * heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int h = static_cast<int>((idx / half) % heads);
    const int t = static_cast<int>(idx / (static_cast<int64_t>(half) * heads));
    float* v = x + t * ld + static_cast<int64_t>(h) * hd;
    const float cs = cos_t[static_cast<int64_t>(t) * half + i];
    const float sn = inverse ? -sin_t[static_cast<int64_t>(t) * half + i] : sin_t[static_cast<int64_t>(t) * half + i];
    const float a = v[i], b = v[i + half];
    v[i] = a * cs - b * sn;
    v[i + half] = b * cs + a * sn;
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, int64_t ld, float* out, int rows, int64_t width) {
  const int64_t total = static_cast<int64_t>(rows) * width;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / width, c = idx % width;
    const float gv = g[r * ld + c];
    out[idx] = gv / (1.0f + expf(-gv)) * u[r * ld + c];
  }
}

__global__ void add_kernel(float* x, const float* d, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += d[i];
}

__global__ void bias_kernel(float* y, const float* b, int rows, int n) {
  const int64_t total = static_cast<int64_t>(rows) * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += b[i % n];
}

// In place over scores [heads * T rows, T]: row (h, t) keeps keys [lo, t] (lo = t - window + 1 with a sliding window),
// softmax over them with the max subtracted, zeros elsewhere. One block per row.
__global__ void causal_softmax_kernel(float* s, int T, int window) {
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % T);
  float* sr = s + row * T;
  const int lo = window > 0 ? max(0, t - window + 1) : 0;
  __shared__ float red[kThreads / 32];
  float mx = -INFINITY;
  for (int j = lo + threadIdx.x; j <= t; j += blockDim.x) mx = fmaxf(mx, sr[j]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) mx = fmaxf(mx, red[i]);
  __syncthreads();
  float sum = 0.0f;
  for (int j = lo + threadIdx.x; j <= t; j += blockDim.x) {
    const float e = expf(sr[j] - mx);
    sr[j] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) sum += red[i];
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < T; j += blockDim.x) sr[j] = (j >= lo && j <= t) ? sr[j] * inv : 0.0f;
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

// y [T, n] = x [T, k] · Wᵀ (W row-major [n, k]); in cuBLAS's column-major terms yᵀ = W xᵀ.
void linear(cublasHandle_t h, const float* x, int T, const float* w, int64_t n, int64_t k, float* y) {
  const float one = 1.0f, zero = 0.0f;
  cublas_check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), T, static_cast<int>(k), &one, w,
                           static_cast<int>(k), x, static_cast<int>(k), &zero, y, static_cast<int>(n)),
               "calibration linear");
}

float* carve(char*& p, size_t floats) {
  float* out = reinterpret_cast<float*>(p);
  p += (floats * sizeof(float) + 255) / 256 * 256;
  return out;
}

struct Sizes {
  size_t xn, qkv, scores, attn, gu, act, tmp, saved = 0, rope;
};

Sizes sizes(const ModelConfig& c, int T, bool save) {
  const size_t t = static_cast<size_t>(T);
  Sizes s{};
  s.xn = t * c.dim;
  s.qkv = t * (c.q_dim() + 2 * c.kv_dim());
  s.scores = static_cast<size_t>(c.n_heads) * t * t;
  s.attn = t * c.q_dim();
  s.gu = 2 * t * c.hidden_dim;
  s.act = t * c.hidden_dim;
  s.tmp = t * c.dim;
  s.rope = static_cast<size_t>(c.max_seq_len) * (c.head_dim / 2);
  if (save)   // x_in, xn1, q, k, v, probs, attn, h, xn2, g, u, act
    s.saved = 4 * t * c.dim + t * c.q_dim() * 2 + 2 * t * c.kv_dim() + s.scores + 3 * t * c.hidden_dim;
  return s;
}

}  // namespace

size_t BlockWorkspace::bytes_needed(const ModelConfig& c, int max_t, bool save) {
  const Sizes s = sizes(c, max_t, save);
  return (s.xn + s.qkv + s.scores + s.attn + s.gu + s.act + s.tmp + s.saved + 2 * s.rope) * sizeof(float) + 32 * 256;
}

BlockWorkspace::BlockWorkspace(const ModelConfig& c, int max_t, bool save) : c_(c), max_t_(max_t), save_(save) {
  LOWBIT_CHECK(max_t > 0 && max_t <= c.max_seq_len, "calibration window of ", max_t,
               " tokens exceeds the model's maximum of ", c.max_seq_len, " positions");
  const Sizes s = sizes(c, max_t, save);
  LOWBIT_CUDA_CHECK(cudaMalloc(&arena_, bytes_needed(c, max_t, save)));
  char* p = static_cast<char*>(arena_);
  xn = carve(p, s.xn);
  qkv = carve(p, s.qkv);
  scores = carve(p, s.scores);
  attn = carve(p, s.attn);
  gu = carve(p, s.gu);
  act = carve(p, s.act);
  tmp = carve(p, s.tmp);
  cos_ = carve(p, s.rope);
  sin_ = carve(p, s.rope);
  if (save) {
    const size_t t = static_cast<size_t>(max_t);
    saved_.x_in = carve(p, t * c.dim);
    saved_.xn1 = carve(p, t * c.dim);
    saved_.q = carve(p, t * c.q_dim());
    saved_.k = carve(p, t * c.kv_dim());
    saved_.v = carve(p, t * c.kv_dim());
    saved_.probs = carve(p, s.scores);
    saved_.attn = carve(p, t * c.q_dim());
    saved_.h = carve(p, t * c.dim);
    saved_.xn2 = carve(p, t * c.dim);
    saved_.g = carve(p, t * c.hidden_dim);
    saved_.u = carve(p, t * c.hidden_dim);
    saved_.act = carve(p, t * c.hidden_dim);
  }
  const RopeTables rt = rope_tables(c);
  LOWBIT_CUDA_CHECK(cudaMemcpy(cos_, rt.cos.data(), rt.cos.size() * sizeof(float), cudaMemcpyHostToDevice));
  LOWBIT_CUDA_CHECK(cudaMemcpy(sin_, rt.sin.data(), rt.sin.size() * sizeof(float), cudaMemcpyHostToDevice));
  cublas_check(cublasCreate(&cublas_), "cublasCreate");
  // Default math on purpose: TF32 would round the inputs of every product to 10 mantissa bits.
  cublas_check(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

BlockWorkspace::~BlockWorkspace() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (arena_ != nullptr) cudaFree(arena_);
}

void rmsnorm_f32(const float* x, const float* w, float* y, int rows, int dim, float eps, cudaStream_t s) {
  if (rows == 0) return;
  rmsnorm_kernel<<<rows, kThreads, 0, s>>>(x, w, y, dim, eps);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void rope_f32(float* x, int64_t ld, int T, int heads, int hd, const float* cos_t, const float* sin_t, bool inverse,
              cudaStream_t s) {
  const int64_t total = static_cast<int64_t>(T) * heads * (hd / 2);
  if (total == 0) return;
  rope_kernel<<<grid_for(total), kThreads, 0, s>>>(x, ld, T, heads, hd, cos_t, sin_t, inverse);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void swiglu_f32(const float* g, const float* u, int64_t ld, float* out, int rows, int64_t width, cudaStream_t s) {
  const int64_t total = static_cast<int64_t>(rows) * width;
  if (total == 0) return;
  swiglu_kernel<<<grid_for(total), kThreads, 0, s>>>(g, u, ld, out, rows, width);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void block_forward_f32(const BlockWeightsF32& w, float* x, int T, BlockWorkspace& ws, cudaStream_t stream,
                       const BlockCaptureFn* capture, bool need_output) {
  const ModelConfig& c = ws.config();
  LOWBIT_CHECK(T > 0 && T <= ws.max_t(), "block_forward_f32: window of ", T, " tokens, workspace holds ", ws.max_t());
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, hd = c.head_dim;
  const int heads = c.n_heads, kvh = c.n_kv_heads, group = heads / kvh;
  cublasHandle_t cb = ws.cublas();
  cublas_check(cublasSetStream(cb, stream), "cublasSetStream");
  const bool save = ws.saves();
  const BlockSaved& sv = ws.saved();
  const int64_t tt = static_cast<int64_t>(T);

  if (save) LOWBIT_CUDA_CHECK(cudaMemcpyAsync(sv.x_in, x, tt * dim * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  float* xn1 = save ? sv.xn1 : ws.xn;
  float* q = save ? sv.q : ws.qkv;
  float* k = save ? sv.k : ws.qkv + tt * qd;
  float* v = save ? sv.v : ws.qkv + tt * (qd + kvd);
  float* probs = save ? sv.probs : ws.scores;
  float* attn = save ? sv.attn : ws.attn;
  float* xn2 = save ? sv.xn2 : ws.xn;
  float* g = save ? sv.g : ws.gu;
  float* u = save ? sv.u : ws.gu + tt * hid;
  float* act = save ? sv.act : ws.act;

  rmsnorm_f32(x, w.attn_norm, xn1, T, dim, c.rms_eps, stream);
  if (capture) (*capture)(LinearSlot::Qkv, xn1, T, dim);
  linear(cb, xn1, T, w.wq, qd, dim, q);
  linear(cb, xn1, T, w.wk, kvd, dim, k);
  linear(cb, xn1, T, w.wv, kvd, dim, v);
  if (w.bq) bias_kernel<<<grid_for(tt * qd), kThreads, 0, stream>>>(q, w.bq, T, qd);
  if (w.bk) bias_kernel<<<grid_for(tt * kvd), kThreads, 0, stream>>>(k, w.bk, T, kvd);
  if (w.bv) bias_kernel<<<grid_for(tt * kvd), kThreads, 0, stream>>>(v, w.bv, T, kvd);
  rope_f32(q, qd, T, heads, hd, ws.cos_table(), ws.sin_table(), false, stream);
  rope_f32(k, kvd, T, kvh, hd, ws.cos_table(), ws.sin_table(), false, stream);

  // scores of head h = kv head j * group + r: row-major S_h [T, T] = scale · Q_h K_jᵀ, i.e. column-major
  // S_hᵀ = K_j Q_hᵀ. Batched over the kv heads for each r (Q stride group·hd, K stride hd, S stride group·T·T).
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd)), one = 1.0f, zero = 0.0f;
  const long long tt2 = static_cast<long long>(tt) * tt;
  for (int r = 0; r < group; ++r)
    cublas_check(cublasSgemmStridedBatched(cb, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, &scale, k, kvd, hd,
                                           q + static_cast<int64_t>(r) * hd, qd, static_cast<long long>(group) * hd,
                                           &zero, probs + r * tt2, T, group * tt2, kvh),
                 "calibration attention scores");
  causal_softmax_kernel<<<heads * T, kThreads, 0, stream>>>(probs, T, c.sliding_window);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  // out_h [T, hd] (row-major, ld qd) = P_h V_j: column-major out_hᵀ = V_jᵀ P_hᵀ.
  for (int r = 0; r < group; ++r)
    cublas_check(cublasSgemmStridedBatched(cb, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, &one, v, kvd, hd, probs + r * tt2,
                                           T, group * tt2, &zero, attn + static_cast<int64_t>(r) * hd, qd,
                                           static_cast<long long>(group) * hd, kvh),
                 "calibration attention values");
  if (capture) (*capture)(LinearSlot::O, attn, T, qd);
  linear(cb, attn, T, w.wo, dim, qd, ws.tmp);
  add_kernel<<<grid_for(tt * dim), kThreads, 0, stream>>>(x, ws.tmp, tt * dim);
  if (save) LOWBIT_CUDA_CHECK(cudaMemcpyAsync(sv.h, x, tt * dim * sizeof(float), cudaMemcpyDeviceToDevice, stream));

  rmsnorm_f32(x, w.ffn_norm, xn2, T, dim, c.rms_eps, stream);
  if (capture) (*capture)(LinearSlot::GateUp, xn2, T, dim);
  linear(cb, xn2, T, w.wg, hid, dim, g);
  linear(cb, xn2, T, w.wu, hid, dim, u);
  swiglu_f32(g, u, hid, act, T, hid, stream);
  if (capture) (*capture)(LinearSlot::Down, act, T, hid);
  if (!need_output) return;
  linear(cb, act, T, w.wd, dim, hid, ws.tmp);
  add_kernel<<<grid_for(tt * dim), kThreads, 0, stream>>>(x, ws.tmp, tt * dim);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
