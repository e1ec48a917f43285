// Backward steps of the fp32 calibration block (backward_ops.h) and their CPU twins.
//
// Design. The backward repeats the CPU backward's arithmetic (model/backward.cpp) step for step, so that the Fisher
// diagonal matches fisher_diagonal() to fp32 rounding: row reductions (rmsnorm's sum of squares and dot product,
// the softmax-backward row sum, cross-entropy's exp sum) accumulate in double, one thread block per row, warp
// shuffles then one shared-memory pass; element-wise steps are grid-stride loops. Matmuls are cuBLAS sgemms in the
// workspace handle's default math (no TF32).
//
// Attention runs on the probabilities block_forward_f32 keeps ([heads, T, T], causal zeros included) instead of
// recomputing them from a log-sum-exp as the CPU does: the calibration windows are short (T = 512: 32 heads x 1 MB),
// and the same strided-batched layout as the forward (one sgemm per position r inside a query group, batched over
// the kv heads) gives dP = dO Vᵀ, dQ = dS K, dK = Σ dSᵀ Q and dV = Σ Pᵀ dO with the group sum done by cuBLAS's
// beta = 1 on the later positions. The full T x T products (upper triangle included, multiplied by zeros) cost 2x
// the causal FLOPs of attention, a few % of the block's.
//
// Row-major <-> cuBLAS column-major: a row-major [r, c] matrix with leading dimension ld is, to cuBLAS, the
// column-major [c, r] matrix (its transpose) with the same ld. Each call below says which product it computes in
// those terms.
#include "backend_cuda/quantize/backward_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dense/dense.h"
#include "core/error.h"

namespace lowbit::cuda {

namespace {

constexpr int kThreads = 256;        // element-wise and row kernels
constexpr int kRowThreads = 256;     // one block per row: rmsnorm (dim <= 16k), softmax rows (T <= 8k)
constexpr int kVocabThreads = 512;   // one block per cross-entropy row (vocab 32k..152k: ~64..300 loads each)

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total. shm: 32 doubles.
// The leading __syncthreads makes back-to-back calls with the same shm safe.
__device__ double block_sum(double v, double* shm) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shm[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) t += shm[i];
  return t;
}

__device__ float block_max(float v, float* shm) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shm[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) t = fmaxf(t, shm[i]);
  return t;
}

// One block per row. inv as rmsnorm_kernel (block_f32.cu) computes it; dot = Σ dy·w·x in double, so that
// mean(dy∘w∘n) = dot · inv / dim.
__global__ void rmsnorm_backward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ dy, float* __restrict__ dx, int dim, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  const float* dyr = dy + r * dim;
  float* dxr = dx + r * dim;
  __shared__ double shm[32];
  double ss = 0.0, dot = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const double xv = xr[i];
    ss += xv * xv;
    dot += static_cast<double>(dyr[i]) * w[i] * xv;
  }
  ss = block_sum(ss, shm);
  dot = block_sum(dot, shm);
  const double inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dim) + eps));
  const double mean = dot * inv / static_cast<double>(dim);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const double n = xr[i] * inv;
    dxr[i] += static_cast<float>(inv * (static_cast<double>(dyr[i]) * w[i] - n * mean));
  }
}

__global__ void swiglu_backward_kernel(const float* g, const float* u, const float* dact, float* dg, float* du,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gv = g[i], uv = u[i], d = dact[i];
    const float s = 1.0f / (1.0f + expf(-gv));
    dg[i] = d * uv * s * (1.0f + gv * (1.0f - s));
    du[i] = d * gv * s;
  }
}

// One block per row of T; row r is query position t = r % T, which sees keys 0..t at most.
__global__ void softmax_backward_kernel(const float* __restrict__ probs, float* __restrict__ dp, int T) {
  const int64_t r = blockIdx.x;
  const int t = static_cast<int>(r % T);
  const float* pr = probs + r * T;
  float* dr = dp + r * T;
  __shared__ double shm[32];
  double acc = 0.0;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) acc += static_cast<double>(pr[j]) * dr[j];
  const float d = static_cast<float>(block_sum(acc, shm));
  for (int j = threadIdx.x; j < T; j += blockDim.x) dr[j] = j <= t ? pr[j] * (dr[j] - d) : 0.0f;
}

// One block per row, as the CPU head: float max, exps in float summed in double, the row's loss in double, then
// exps scaled by 1/(sum·N) and 1/N taken off the target.
__global__ void cross_entropy_kernel(float* __restrict__ logits, const int32_t* __restrict__ targets, int vocab,
                                     double n_pred, double* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  float* lr = logits + r * vocab;
  const int target = targets[r];
  __shared__ double dshm[32];
  __shared__ float fshm[32];
  const float target_logit = lr[target];   // read by every thread before any is overwritten (barriers below)
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_max(mx, fshm);
  double sum = 0.0;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float e = expf(lr[j] - mx);
    lr[j] = e;
    sum += e;
  }
  sum = block_sum(sum, dshm);
  if (threadIdx.x == 0) row_loss[r] = log(sum) + mx - target_logit;
  const float scale = static_cast<float>(1.0 / (sum * n_pred));
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) lr[j] *= scale;
  __syncthreads();
  if (threadIdx.x == 0) lr[target] -= static_cast<float>(1.0 / n_pred);
}

__global__ void square_accumulate_kernel(float* acc, const float* g, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc[i] += g[i] * g[i];
}

// 16-byte accesses for the bulk (n/4 float4s), the caller handles the tail.
__global__ void square_accumulate4_kernel(float4* acc, const float4* g, int64_t n4) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = g[i];
    float4 a = acc[i];
    a.x += v.x * v.x;
    a.y += v.y * v.y;
    a.z += v.z * v.z;
    a.w += v.w * v.w;
    acc[i] = a;
  }
}

void check_launch() { LOWBIT_CUDA_CHECK(cudaGetLastError()); }

}  // namespace

// ---------------------------------------------------------------------------------------------------- row steps

void rmsnorm_backward_f32(const float* x, const float* w, const float* dy, float* dx, int rows, int dim, float eps,
                          cudaStream_t s) {
  if (rows == 0) return;
  rmsnorm_backward_kernel<<<rows, kRowThreads, 0, s>>>(x, w, dy, dx, dim, eps);
  check_launch();
}

void rmsnorm_backward_ref(const float* x, const float* w, const float* dy, float* dx, int rows, int dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    double dot = 0.0;
    for (int i = 0; i < dim; ++i) dot += static_cast<double>(dyr[i]) * w[i] * xr[i] * inv;
    const double mean = dot / static_cast<double>(dim);
    for (int i = 0; i < dim; ++i) {
      const double n = xr[i] * inv;
      dx[r * dim + i] += static_cast<float>(inv * (static_cast<double>(dyr[i]) * w[i] - n * mean));
    }
  }
}

void swiglu_backward_f32(const float* g, const float* u, const float* dact, float* dg, float* du, int64_t n,
                         cudaStream_t s) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(g, u, dact, dg, du, n);
  check_launch();
}

void swiglu_backward_ref(const float* g, const float* u, const float* dact, float* dg, float* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gv = g[i], uv = u[i], d = dact[i];
    const float s = 1.0f / (1.0f + std::exp(-gv));
    dg[i] = d * uv * s * (1.0f + gv * (1.0f - s));
    du[i] = d * gv * s;
  }
}

void softmax_backward_f32(const float* probs, float* dp, int64_t rows, int T, cudaStream_t s) {
  if (rows == 0) return;
  LOWBIT_CHECK(rows <= 0x7fffffff, "softmax_backward_f32: ", rows, " rows exceed one launch");
  softmax_backward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(probs, dp, T);
  check_launch();
}

void softmax_backward_ref(const float* probs, float* dp, int64_t rows, int T) {
  for (int64_t r = 0; r < rows; ++r) {
    const int t = static_cast<int>(r % T);
    const float* pr = probs + r * T;
    float* dr = dp + r * T;
    double acc = 0.0;
    for (int j = 0; j <= t; ++j) acc += static_cast<double>(pr[j]) * dr[j];
    const float d = static_cast<float>(acc);
    for (int j = 0; j < T; ++j) dr[j] = j <= t ? pr[j] * (dr[j] - d) : 0.0f;
  }
}

void cross_entropy_f32(float* logits, const int32_t* targets, int rows, int vocab, int64_t n_predicted,
                       double* row_loss, cudaStream_t s) {
  if (rows == 0) return;
  cross_entropy_kernel<<<rows, kVocabThreads, 0, s>>>(logits, targets, vocab, static_cast<double>(n_predicted),
                                                      row_loss);
  check_launch();
}

void cross_entropy_ref(float* logits, const int32_t* targets, int rows, int vocab, int64_t n_predicted,
                       double* row_loss) {
  const double n_pred = static_cast<double>(n_predicted);
  for (int64_t r = 0; r < rows; ++r) {
    float* lr = logits + r * vocab;
    const int target = targets[r];
    const float target_logit = lr[target];
    float mx = -INFINITY;
    for (int j = 0; j < vocab; ++j) mx = std::max(mx, lr[j]);
    double sum = 0.0;
    for (int j = 0; j < vocab; ++j) sum += (lr[j] = std::exp(lr[j] - mx));
    row_loss[r] = std::log(sum) + mx - target_logit;
    const float scale = static_cast<float>(1.0 / (sum * n_pred));
    for (int j = 0; j < vocab; ++j) lr[j] *= scale;
    lr[target] -= static_cast<float>(1.0 / n_pred);
  }
}

void square_accumulate_f32(float* acc, const float* g, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const bool aligned = ((reinterpret_cast<uintptr_t>(acc) | reinterpret_cast<uintptr_t>(g)) & 15u) == 0;
  int64_t done = 0;
  if (aligned && n >= 4) {
    const int64_t n4 = n / 4;
    square_accumulate4_kernel<<<grid_for(n4), kThreads, 0, s>>>(reinterpret_cast<float4*>(acc),
                                                                 reinterpret_cast<const float4*>(g), n4);
    check_launch();
    done = n4 * 4;
  }
  if (done < n) {
    square_accumulate_kernel<<<grid_for(n - done), kThreads, 0, s>>>(acc + done, g + done, n - done);
    check_launch();
  }
}

void square_accumulate_ref(float* acc, const float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += g[i] * g[i];
}

// ------------------------------------------------------------------------------------------------- matmul steps

void linear_weight_grad_f32(cublasHandle_t h, const float* dy, const float* x, int rows, int64_t n, int64_t k,
                            float* dw) {
  // Row-major dW [n, k] is column-major dWᵀ [k, n] = xᵀ-as-stored [k, rows] · (dyᵀ-as-stored [n, rows])ᵀ.
  const float one = 1.0f, zero = 0.0f;
  cublas_check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(k), static_cast<int>(n), rows, &one, x,
                           static_cast<int>(k), dy, static_cast<int>(n), &zero, dw, static_cast<int>(k)),
               "fisher weight gradient");
}

void linear_weight_grad_ref(const float* dy, const float* x, int rows, int64_t n, int64_t k, float* dw) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double acc = 0.0;
      for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(dy[r * n + i]) * x[r * k + j];
      dw[i * k + j] = static_cast<float>(acc);
    }
}

void linear_input_grad_f32(cublasHandle_t h, const float* dy, const float* w, int rows, int64_t n, int64_t k,
                           float beta, float* dx) {
  // Row-major dx [rows, k] is column-major dxᵀ [k, rows] = Wᵀ-as-stored [k, n] · dyᵀ-as-stored [n, rows].
  const float one = 1.0f;
  cublas_check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(k), rows, static_cast<int>(n), &one, w,
                           static_cast<int>(k), dy, static_cast<int>(n), &beta, dx, static_cast<int>(k)),
               "fisher input gradient");
}

void linear_input_grad_ref(const float* dy, const float* w, int rows, int64_t n, int64_t k, float beta, float* dx) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(dy[r * n + i]) * w[i * k + j];
      dx[r * k + j] = static_cast<float>(acc + (beta != 0.0f ? static_cast<double>(beta) * dx[r * k + j] : 0.0));
    }
}

// ---------------------------------------------------------------------------------------------------- attention

void attention_backward_f32(cublasHandle_t h, const AttentionDims& d, const float* q, const float* k, const float* v,
                            const float* probs, const float* dout, float* dscores, float* dq, float* dk, float* dv,
                            cudaStream_t s) {
  const int T = d.T, hd = d.head_dim, kvh = d.kv_heads, group = d.heads / d.kv_heads;
  const int qd = d.heads * hd, kvd = kvh * hd;
  LOWBIT_CHECK(d.heads % d.kv_heads == 0, "attention_backward_f32: ", d.heads, " heads over ", d.kv_heads,
               " kv heads");
  cublas_check(cublasSetStream(h, s), "cublasSetStream");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd)), one = 1.0f, zero = 0.0f;
  const long long tt2 = static_cast<long long>(T) * T;
  const long long q_stride = static_cast<long long>(group) * hd, s_stride = static_cast<long long>(group) * tt2;
  // Head h = j·group + r reads kv head j. Each call: position r of every group, batched over the kv heads j.
  // dP_h [T(q), T(k)] = dO_h V_jᵀ; column-major dP_hᵀ [k, q] = (V_j-as-stored [hd, k])ᵀ · dO_h-as-stored [hd, q].
  for (int r = 0; r < group; ++r)
    cublas_check(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, &one, v, kvd, hd,
                                           dout + static_cast<int64_t>(r) * hd, qd, q_stride, &zero,
                                           dscores + r * tt2, T, s_stride, kvh),
                 "fisher attention dP");
  softmax_backward_f32(probs, dscores, static_cast<int64_t>(d.heads) * T, T, s);
  // dQ_h [T(q), hd] = scale · dS_h K_j; column-major dQ_hᵀ [hd, q] = K_j-as-stored [hd, k] · dS_h-as-stored [k, q].
  for (int r = 0; r < group; ++r)
    cublas_check(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, &scale, k, kvd, hd,
                                           dscores + r * tt2, T, s_stride, &zero, dq + static_cast<int64_t>(r) * hd,
                                           qd, q_stride, kvh),
                 "fisher attention dQ");
  // dK_j [T(k), hd] = Σ_r scale · dS_hᵀ Q_h; column-major dK_jᵀ [hd, k] = Q_h-as-stored [hd, q] ·
  // (dS_h-as-stored [k, q])ᵀ. The first position of the group writes, the others add (beta 1): one stream, in order.
  for (int r = 0; r < group; ++r)
    cublas_check(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, &scale,
                                           q + static_cast<int64_t>(r) * hd, qd, q_stride, dscores + r * tt2, T,
                                           s_stride, r == 0 ? &zero : &one, dk, kvd, hd, kvh),
                 "fisher attention dK");
  // dV_j [T(k), hd] = Σ_r P_hᵀ dO_h; column-major dV_jᵀ [hd, k] = dO_h-as-stored [hd, q] · (P_h-as-stored [k, q])ᵀ.
  for (int r = 0; r < group; ++r)
    cublas_check(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, &one,
                                           dout + static_cast<int64_t>(r) * hd, qd, q_stride, probs + r * tt2, T,
                                           s_stride, r == 0 ? &zero : &one, dv, kvd, hd, kvh),
                 "fisher attention dV");
}

void attention_backward_ref(const AttentionDims& d, const float* q, const float* k, const float* v, const float* probs,
                            const float* dout, float* dq, float* dk, float* dv) {
  const int T = d.T, hd = d.head_dim, group = d.heads / d.kv_heads;
  const int64_t qd = static_cast<int64_t>(d.heads) * hd, kvd = static_cast<int64_t>(d.kv_heads) * hd;
  const double scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::fill(dk, dk + T * kvd, 0.0f);
  std::fill(dv, dv + T * kvd, 0.0f);
  std::vector<float> ds(static_cast<size_t>(T) * T);
  for (int h = 0; h < d.heads; ++h) {
    const int j = h / group;
    const float* p = probs + static_cast<int64_t>(h) * T * T;
    for (int t = 0; t < T; ++t)
      for (int u = 0; u < T; ++u) {
        double acc = 0.0;
        for (int i = 0; i < hd; ++i) acc += static_cast<double>(dout[t * qd + h * hd + i]) * v[u * kvd + j * hd + i];
        ds[static_cast<size_t>(t) * T + u] = static_cast<float>(acc);
      }
    // The causal rows of this head as softmax_backward_ref's rows t = 0..T-1.
    softmax_backward_ref(p, ds.data(), T, T);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (int u = 0; u < T; ++u)
          acc += static_cast<double>(ds[static_cast<size_t>(t) * T + u]) * k[u * kvd + j * hd + i];
        dq[t * qd + h * hd + i] = static_cast<float>(scale * acc);
      }
    for (int u = 0; u < T; ++u)
      for (int i = 0; i < hd; ++i) {
        double ak = 0.0, av = 0.0;
        for (int t = 0; t < T; ++t) {
          ak += static_cast<double>(ds[static_cast<size_t>(t) * T + u]) * q[t * qd + h * hd + i];
          av += static_cast<double>(p[static_cast<int64_t>(t) * T + u]) * dout[t * qd + h * hd + i];
        }
        dk[u * kvd + j * hd + i] += static_cast<float>(scale * ak);
        dv[u * kvd + j * hd + i] += static_cast<float>(av);
      }
  }
}

// ---------------------------------------------------------------------------------------------------- the block

void block_backward_f32(const BlockWeightsF32& w, BlockWorkspace& ws, int T, float* dx, float* dw_scratch,
                        const std::array<float*, 7>& fisher, cudaStream_t stream) {
  const ModelConfig& c = ws.config();
  LOWBIT_CHECK(ws.saves(), "block_backward_f32: the workspace keeps no intermediates (BlockWorkspace save = false)");
  LOWBIT_CHECK(T > 0 && T <= ws.max_t(), "block_backward_f32: window of ", T, " tokens, workspace holds ", ws.max_t());
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  const int64_t tt = T;
  cublasHandle_t cb = ws.cublas();
  cublas_check(cublasSetStream(cb, stream), "cublasSetStream");
  const BlockSaved& sv = ws.saved();
  // The forward's scratch, free once it has returned with saving on (its outputs went to ws.saved()).
  float* dact = ws.act;               // [T, hid]
  float* dg = ws.gu;                  // [T, hid]
  float* du = ws.gu + tt * hid;       // [T, hid]
  float* dxn = ws.xn;                 // [T, dim]
  float* dattn = ws.attn;             // [T, qd]
  float* dq = ws.qkv;                 // [T, qd]
  float* dk = ws.qkv + tt * qd;       // [T, kvd]
  float* dv = dk + tt * kvd;          // [T, kvd]
  auto weight_grad = [&](int slot, const float* dy, const float* x, int64_t n, int64_t k) {
    linear_weight_grad_f32(cb, dy, x, T, n, k, dw_scratch);
    square_accumulate_f32(fisher[static_cast<size_t>(slot)], dw_scratch, n * k, stream);
  };

  // FFN: out = h + act Wdᵀ, act = silu(g) ∘ u, g/u = xn2 Wg/Wuᵀ, xn2 = ffn_norm(h). dx holds dLoss/dout.
  weight_grad(6, dx, sv.act, dim, hid);
  linear_input_grad_f32(cb, dx, w.wd, T, dim, hid, 0.0f, dact);
  swiglu_backward_f32(sv.g, sv.u, dact, dg, du, tt * hid, stream);
  weight_grad(4, dg, sv.xn2, hid, dim);
  weight_grad(5, du, sv.xn2, hid, dim);
  linear_input_grad_f32(cb, dg, w.wg, T, hid, dim, 0.0f, dxn);
  linear_input_grad_f32(cb, du, w.wu, T, hid, dim, 1.0f, dxn);
  rmsnorm_backward_f32(sv.h, w.ffn_norm, dxn, dx, T, dim, c.rms_eps, stream);   // dx: dLoss/dh

  // Attention: h = x_in + attn Woᵀ, attn = attention(rope(q), rope(k), v), q/k/v = xn1 W + b, xn1 = attn_norm(x_in).
  weight_grad(3, dx, sv.attn, dim, qd);
  linear_input_grad_f32(cb, dx, w.wo, T, dim, qd, 0.0f, dattn);
  attention_backward_f32(cb, AttentionDims{T, c.n_heads, c.n_kv_heads, c.head_dim}, sv.q, sv.k, sv.v, sv.probs,
                         dattn, ws.scores, dq, dk, dv, stream);
  // RoPE is a rotation per position: its backward is the rotation by -angle.
  rope_f32(dq, qd, T, c.n_heads, c.head_dim, ws.cos_table(), ws.sin_table(), true, stream);
  rope_f32(dk, kvd, T, c.n_kv_heads, c.head_dim, ws.cos_table(), ws.sin_table(), true, stream);
  weight_grad(0, dq, sv.xn1, qd, dim);
  weight_grad(1, dk, sv.xn1, kvd, dim);
  weight_grad(2, dv, sv.xn1, kvd, dim);
  linear_input_grad_f32(cb, dq, w.wq, T, qd, dim, 0.0f, dxn);
  linear_input_grad_f32(cb, dk, w.wk, T, kvd, dim, 1.0f, dxn);
  linear_input_grad_f32(cb, dv, w.wv, T, kvd, dim, 1.0f, dxn);
  rmsnorm_backward_f32(sv.x_in, w.attn_norm, dxn, dx, T, dim, c.rms_eps, stream);   // dx: dLoss/dx_in
}

}  // namespace lowbit::cuda
