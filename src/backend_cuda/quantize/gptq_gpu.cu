// GPTQ, RTN and QUIK on the GPU (gptq_gpu.h): the CPU quantizers of src/quantize with every step on the device.
//
// Factor (gptq_factor_gpu). The host reads H's diagonal (k values) to find the dead columns, the processing order
// (std::stable_sort by decreasing H_ii, as the CPU) and λ = percdamp · mean(diag) (summed in processing order, as the
// CPU); a kernel writes A = H[perm, perm] + λI into an fp64 work matrix; cuSOLVER then runs what gptq.cpp's
// inverse_upper_cholesky runs through LAPACK, on the same row-major storage: column-major 'L' on row-major data is
// row-major 'U', so potrf('L') leaves R with A = RᵀR in the row-major upper triangle, potri('L') puts A⁻¹ there, and
// potrf('L') again gives U with A⁻¹ = UᵀU (potrf reads only the triangle potri wrote, so the CPU's symmetrising copy
// changes nothing here). A failed factorisation raises λ tenfold, at most six times, as the CPU does.
//
// Solve (gptq_block_kernel). Rows of W are independent inside a block of 128 columns (the error of row r only feeds
// row r's later columns), so one warp owns one row: lane l holds the block's columns l, l+32, l+64, l+96 in registers
// and the CTA (8 warps, 8 rows) shares U's [cnt x cnt] diagonal block in shared memory (64 KB, hence the opt-in).
// Per column j, in order: the warp's group parameters when a group starts at j (the group may run past the block: its
// current values are the registers, spilled to a per-warp shared row buffer, then W's global columns, which the
// previous blocks' updates already reached); the owner lane's value is broadcast; every lane computes the same code
// and error e = (w - ŵ) / U_jj (the division in fp64 with the fp64 diagonal, as the CPU); each lane updates its own
// later columns, w_c -= e · U_jc, the same rounded operations in the same order as the CPU's loop, so inside a block
// the GPU and a portable CPU build agree bit for bit given equal inputs (gptq_gpu_kernels.cuh says what a native
// build fuses). Then W[:, i2:] -= Err · U[i1:i2, i2:] is one cuBLAS sgemm
// (default math mode: fp32, no TF32); its summation order differs from OpenBLAS, the only source of differences
// between the twins (a code whose value sits within rounding of a decision boundary may flip, and its row's later
// codes follow the changed error feedback).
// Per-row work is serial by nature (128 dependent steps per block); the warp's lanes add parallelism across the
// block's columns only in the updates, and the MSE-clipping grid search puts one candidate shrink on each lane
// (gptq_gpu_kernels.cuh).
// QUIK runs the same kernel in SolveMode::Quik: per-row symmetric scale (from the base columns before any update)
// instead of group parameters, signed codes at the processing index, the solve over the base columns only while the
// trailing updates reach the outlier columns too.
//
// RTN (uniform_groups_kernel): one warp per (row, group), the same warp_group_params, then the codes.
// The Hessian-weighted error: D = W - Ŵ in fp64 by row blocks, DH = D·H by cublasDgemm, Σ D ⊙ DH by cublasDdot.
#include "backend_cuda/quantize/gptq_gpu.h"

#include <cublas_v2.h>
#include <cusolverDn.h>

#include <algorithm>
#include <climits>
#include <numeric>
#include <optional>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dense/dense.h"
#include "backend_cuda/quantize/gptq_gpu_kernels.cuh"
#include "core/error.h"

namespace lowbit::cuda {

using namespace gptq_twin;

namespace {

constexpr int kBlock = 128;        // columns per solve block: 4 per lane
constexpr int kSolveWarps = 8;     // rows per CTA sharing one copy of U's diagonal block
constexpr int kSolveThreads = kSolveWarps * 32;
// s_udiag [kBlock] fp64, s_perm [kBlock] int64, s_u [kBlock][kBlock] fp32, s_rows [kSolveWarps][kBlock] fp32.
constexpr size_t kSolveSmem = kBlock * sizeof(double) + kBlock * sizeof(int64_t) + kBlock * kBlock * sizeof(float) +
                              kSolveWarps * kBlock * sizeof(float);
static_assert(kSolveSmem <= 227 * 1024, "the solve kernel's shared memory must fit one Hopper SM");

// ---------------------------------------------------------------------------------------------------------------
// Plumbing

void cusolver_check(cusolverStatus_t st, const char* what) {
  if (st != CUSOLVER_STATUS_SUCCESS) fail("cuSOLVER error ", static_cast<int>(st), " in ", what);
}

// One cuBLAS and one cuSOLVER handle per host thread, bound to the caller's stream on every call. Destroyed at thread
// exit (for the main thread before the CUDA runtime's own teardown).
struct Handles {
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  ~Handles() {
    if (blas != nullptr) cublasDestroy(blas);
    if (solver != nullptr) cusolverDnDestroy(solver);
  }
};

Handles& handles(cudaStream_t stream) {
  thread_local Handles h;
  if (h.blas == nullptr) {
    cublas_check(cublasCreate(&h.blas), "cublasCreate");
    cublas_check(cublasSetPointerMode(h.blas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  }
  if (h.solver == nullptr) cusolver_check(cusolverDnCreate(&h.solver), "cusolverDnCreate");
  cublas_check(cublasSetStream(h.blas, stream), "cublasSetStream");
  cusolver_check(cusolverDnSetStream(h.solver, stream), "cusolverDnSetStream");
  return h;
}

// A device allocation of one call, ordered on its stream (freed there when the owner goes out of scope).
template <typename T>
class StreamBuffer {
 public:
  StreamBuffer(size_t count, cudaStream_t stream) : stream_(stream) {
    if (count > 0) LOWBIT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ptr_), count * sizeof(T), stream));
  }
  StreamBuffer(const std::vector<T>& host, cudaStream_t stream) : StreamBuffer(host.size(), stream) {
    if (!host.empty())
      LOWBIT_CUDA_CHECK(cudaMemcpyAsync(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  ~StreamBuffer() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  cudaStream_t stream_;
};

template <typename T>
std::vector<T> download(const T* d, size_t count, cudaStream_t stream) {
  std::vector<T> h(count);
  if (count > 0) LOWBIT_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

template <typename T>
void upload_owned(T** dst, const std::vector<T>& host) {
  LOWBIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(dst), host.size() * sizeof(T)));
  LOWBIT_CUDA_CHECK(cudaMemcpy(*dst, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}

UniformSpecTwin twin_of(const UniformSpec& s) {
  UniformSpecTwin t;
  t.bits = s.bits;
  t.symmetric = s.symmetric;
  t.mse_clip = s.mse_clip;
  t.max_shrink = s.max_shrink;
  t.grid = s.grid;
  return t;
}

unsigned blocks_for(int64_t items, int threads, int64_t cap = 65535) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + threads - 1) / threads, 1, cap));
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels

__global__ void first_nonfinite_kernel(const float* __restrict__ w, int64_t count, unsigned long long* first) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!isfinite(w[i])) atomicMin(first, static_cast<unsigned long long>(i));
}

// out[r, i] = src[i] < 0 ? 0 : w[r, src[i]] (processing order, dead columns zeroed).
__global__ void gather_columns_kernel(const float* __restrict__ w, int64_t n, int64_t k, const int64_t* __restrict__ src,
                                      float* __restrict__ out) {
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y)
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < k;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t c = src[i];
      out[r * k + i] = c < 0 ? 0.0f : w[r * k + c];
    }
}

// One warp per (row, group) of w [n, k]: find_group_params, then (codes != nullptr) the codes and the optional
// dequantized weight. scales/zeros [n, G] (zeros unused when symmetric).
__global__ void uniform_groups_kernel(const float* __restrict__ w, int64_t n, int64_t k, int64_t gs, int64_t G,
                                      UniformSpecTwin spec, uint8_t* __restrict__ codes, uint16_t* __restrict__ scales,
                                      uint8_t* __restrict__ zeros, float* __restrict__ deq) {
  const int64_t task = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;   // r * G + g
  if (task >= n * G) return;   // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t r = task / G, g = task - r * G, c0 = g * gs, count = gs < k - c0 ? gs : k - c0;
  const float* x = w + r * k + c0;
  const UniformParams p = warp_group_params([&](int64_t i) { return x[i]; }, count, spec);
  if (lane == 0) {
    scales[task] = p.scale_f16;
    if (!spec.symmetric) zeros[task] = static_cast<uint8_t>(p.zero);
  }
  if (codes == nullptr) return;
  const int maxq = (1 << spec.bits) - 1;
  for (int64_t i = lane; i < count; i += 32) {
    const int code = uniform_code(x[i], p, maxq);
    codes[r * k + c0 + i] = static_cast<uint8_t>(code);
    if (deq != nullptr) deq[r * k + c0 + i] = mul_rn(uniform_offset(code, p), p.scale);
  }
}

enum class SolveMode { Uniform, Quik };

struct SolveArgs {
  const float* wp = nullptr;       // [n, k] processing order (read only: the sgemm updates it between launches)
  int64_t n = 0, k = 0;
  const float* u = nullptr;        // [k, k] upper factor, processing order
  const double* u_diag = nullptr;  // [k]
  const int64_t* perm = nullptr;   // [k] processing index -> original column
  float* err = nullptr;            // [n, kBlock] the block's scaled errors, for the sgemm
  float* deq = nullptr;            // optional [n, k] original order
  // SolveMode::Uniform
  UniformSpecTwin spec;
  int64_t gs = 0, G = 0;
  bool static_groups = false;      // scales/zeros already hold every group's parameters
  uint8_t* codes = nullptr;        // [n, k] original order
  uint16_t* scales = nullptr;      // [n, G]
  uint8_t* zeros = nullptr;        // [n, G]
  // SolveMode::Quik
  const float* row_scale = nullptr;   // [n]
  int qmax = 0;
  int64_t kb = 0;
  int8_t* wq = nullptr;            // [n, kb] processing (= base) order
};

__device__ __forceinline__ UniformParams stored_params(const SolveArgs& a, int64_t r, int64_t g) {
  UniformParams p;
  p.scale_f16 = a.scales[r * a.G + g];
  p.scale = f16_to_f32(p.scale_f16);
  p.zero = a.spec.symmetric ? (1 << (a.spec.bits - 1)) : a.zeros[r * a.G + g];
  return p;
}

// Columns [i1, i1 + cnt) of every row; see the design note at the top.
template <SolveMode kMode>
__global__ void __launch_bounds__(kSolveThreads) gptq_block_kernel(const SolveArgs a, const int64_t i1, const int cnt) {
  extern __shared__ __align__(16) unsigned char smem[];
  double* s_udiag = reinterpret_cast<double*>(smem);
  int64_t* s_perm = reinterpret_cast<int64_t*>(s_udiag + kBlock);
  float* s_u = reinterpret_cast<float*>(s_perm + kBlock);
  float* s_rows = s_u + kBlock * kBlock;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  for (int idx = threadIdx.x; idx < cnt * cnt; idx += kSolveThreads) {
    const int j = idx / cnt, c = idx - j * cnt;
    s_u[j * kBlock + c] = a.u[(i1 + j) * a.k + i1 + c];
  }
  for (int j = threadIdx.x; j < cnt; j += kSolveThreads) {
    s_udiag[j] = a.u_diag[i1 + j];
    s_perm[j] = a.perm[i1 + j];
  }
  __syncthreads();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kSolveWarps + warp;
  if (r >= a.n) return;   // whole warps; no CTA-wide barrier follows

  const float* wrow = a.wp + r * a.k;
  float v[4], e_mine[4], deq_mine[4];
  int code_mine[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int c = 32 * t + lane;
    v[t] = c < cnt ? wrow[i1 + c] : 0.0f;
    e_mine[t] = deq_mine[t] = 0.0f;
    code_mine[t] = 0;
  }
  float* rowbuf = s_rows + warp * kBlock;
  UniformParams p_cur{1.0f, 0x3c00, 0};
  int maxq = 0;
  float row_sc = 0.0f;
  if constexpr (kMode == SolveMode::Uniform) {
    maxq = (1 << a.spec.bits) - 1;
    // A group that began in an earlier block: its parameters were stored then (scale is exactly f16_to_f32 of the
    // stored half and the zero an integer in [0, maxq], so they come back unchanged).
    if (!a.static_groups && i1 % a.gs != 0) p_cur = stored_params(a, r, i1 / a.gs);
  } else {
    row_sc = a.row_scale[r];
  }

#pragma unroll
  for (int t = 0; t < 4; ++t) {
    for (int s = 0; s < 32; ++s) {
      const int j = 32 * t + s;
      if (j >= cnt) break;
      const int64_t i = i1 + j;
      float dq, num;
      int code;
      if constexpr (kMode == SolveMode::Uniform) {
        if (!a.static_groups && i % a.gs == 0) {
#pragma unroll
          for (int tt = 0; tt < 4; ++tt) rowbuf[32 * tt + lane] = v[tt];
          __syncwarp();
          const int64_t count = a.gs < a.k - i ? a.gs : a.k - i, end = i1 + cnt;
          p_cur = warp_group_params(
              [&](int64_t idx) {
                const int64_t c = i + idx;
                return c < end ? rowbuf[c - i1] : wrow[c];
              },
              count, a.spec);
          if (lane == 0) {
            const int64_t g = i / a.gs;
            a.scales[r * a.G + g] = p_cur.scale_f16;
            if (!a.spec.symmetric) a.zeros[r * a.G + g] = static_cast<uint8_t>(p_cur.zero);
          }
          __syncwarp();   // rowbuf is rewritten at the next group start
        }
        const UniformParams p = a.static_groups ? stored_params(a, r, s_perm[j] / a.gs) : p_cur;
        const float x = __shfl_sync(kFullMask, v[t], s);
        code = uniform_code(x, p, maxq);
        dq = mul_rn(uniform_offset(code, p), p.scale);   // dequant_code, and UniformQuantized::dequant
        num = sub_rn(x, dq);
      } else {
        const float x = __shfl_sync(kFullMask, v[t], s);
        const float c = quik_code(x, row_sc, a.qmax);   // may be -0, which the stored int8 code is not
        code = float_to_int_x86(c);
        dq = mul_rn(row_sc, static_cast<float>(static_cast<int8_t>(code)));   // QuikQuantized::dequantize's value
        num = sub_rn(x, mul_rn(c, row_sc));   // exact (small integer times an fp16 scale)
      }
      const float e = static_cast<float>(static_cast<double>(num) / s_udiag[j]);
      if (lane == s) {
        e_mine[t] = e;
        code_mine[t] = code;
        deq_mine[t] = dq;
      }
#pragma unroll
      for (int tt = t; tt < 4; ++tt) {
        const int c = 32 * tt + lane;
        if (c > j && c < cnt) v[tt] = sub_rn(v[tt], mul_rn(e, s_u[j * kBlock + c]));
      }
    }
  }

#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int c = 32 * t + lane;
    if (c >= cnt) continue;
    a.err[r * kBlock + c] = e_mine[t];
    const int64_t orig = s_perm[c];
    if constexpr (kMode == SolveMode::Uniform) {
      a.codes[r * a.k + orig] = static_cast<uint8_t>(code_mine[t]);
    } else {
      a.wq[r * a.kb + i1 + c] = static_cast<int8_t>(code_mine[t]);
    }
    if (a.deq != nullptr) a.deq[r * a.k + orig] = deq_mine[t];
  }
}

// QUIK's per-row scale, one warp per row, over the base columns [0, kb) of the processing-order weight.
__global__ void quik_row_scale_kernel(const float* __restrict__ wp, int64_t n, int64_t k, int64_t kb, int qmax,
                                      bool clip, uint16_t* __restrict__ scale_f16, float* __restrict__ scale) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (r >= n) return;
  const float* row = wp + r * k;
  const uint16_t h = warp_quik_row_scale([&](int64_t i) { return row[i]; }, kb, qmax, clip);
  if ((threadIdx.x & 31) == 0) {
    scale_f16[r] = h;
    scale[r] = f16_to_f32(h);
  }
}

// The outlier columns (processing indices kb..k-1) as fp16, and their dequantized values at the original columns.
__global__ void quik_outliers_kernel(const float* __restrict__ wp, int64_t n, int64_t k, int64_t kb,
                                     const int64_t* __restrict__ perm, uint16_t* __restrict__ out,
                                     float* __restrict__ deq) {
  const int64_t no = k - kb;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n * no;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / no, o = idx - r * no;
    const uint16_t h = f32_to_f16(wp[r * k + kb + o]);
    out[idx] = h;
    if (deq != nullptr) deq[r * k + perm[kb + o]] = f16_to_f32(h);
  }
}

// a = H[perm, perm] with dead diagonals (H_ii = 0) set to 1, plus damp on the diagonal.
__global__ void permute_damp_kernel(const double* __restrict__ h, int64_t k, const int64_t* __restrict__ perm,
                                    double damp, double* __restrict__ a) {
  for (int64_t i = blockIdx.y; i < k; i += gridDim.y) {
    const int64_t pi = perm[i];
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      double v = h[pi * k + perm[j]];
      if (i == j) v = (v == 0.0 ? 1.0 : v) + damp;
      a[i * k + j] = v;
    }
  }
}

// The row-major upper triangle of a (the factor), lower triangle zeroed, as fp32; and its fp64 diagonal.
__global__ void upper_factor_kernel(const double* __restrict__ a, int64_t k, float* __restrict__ u,
                                    double* __restrict__ u_diag) {
  for (int64_t i = blockIdx.y; i < k; i += gridDim.y)
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const double v = a[i * k + j];
      u[i * k + j] = j >= i ? static_cast<float>(v) : 0.0f;
      if (i == j) u_diag[i] = v;
    }
}

__global__ void difference_kernel(const float* __restrict__ w, const float* __restrict__ w_hat, int64_t count,
                                  double* __restrict__ d) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[i] = static_cast<double>(w[i]) - static_cast<double>(w_hat[i]);
}

// ---------------------------------------------------------------------------------------------------------------
// Host steps

// The CPU's check_weights_finite on the device: the same message for the first offending weight.
void check_finite(const float* w, int64_t count, const char* what, cudaStream_t stream) {
  StreamBuffer<unsigned long long> first(1, stream);
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(first.get(), 0xff, sizeof(unsigned long long), stream));
  first_nonfinite_kernel<<<blocks_for(count, 256, 4096), 256, 0, stream>>>(w, count, first.get());
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  const unsigned long long i = download(first.get(), 1, stream)[0];
  if (i != ~0ull) {
    const float v = download(w + i, 1, stream)[0];
    fail(what, ": weight ", i, " is not finite (", v, "); refusing to quantize");
  }
}

// out [n, k] = W's columns in `order` (processing index -> original column), dead columns zeroed.
void gather_live_columns(const float* w, int64_t n, int64_t k, const std::vector<int64_t>& order,
                         const std::vector<char>& dead, float* out, cudaStream_t stream) {
  std::vector<int64_t> src(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    const int64_t c = order[static_cast<size_t>(i)];
    src[static_cast<size_t>(i)] = dead[static_cast<size_t>(c)] ? -1 : c;
  }
  StreamBuffer<int64_t> d_src(src, stream);
  const dim3 grid(blocks_for(k, 256, 64), static_cast<unsigned>(std::min<int64_t>(n, 65535)));
  gather_columns_kernel<<<grid, 256, 0, stream>>>(w, n, k, d_src.get(), out);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

// The solve arguments every mode shares: the permuted weight, the factor, the error scratch, the optional output.
SolveArgs solve_args(const float* wp, int64_t n, int64_t k, const GpuGptqFactor& f, float* err, float* deq) {
  SolveArgs a;
  a.wp = wp;
  a.n = n;
  a.k = k;
  a.u = f.u;
  a.u_diag = f.u_diag;
  a.perm = f.d_perm;
  a.err = err;
  a.deq = deq;
  return a;
}

void uniform_groups(const float* w, int64_t n, int64_t k, int64_t gs, const UniformSpec& s, uint8_t* codes,
                    uint16_t* scales, uint8_t* zeros, float* deq, cudaStream_t stream) {
  const int64_t G = (k + gs - 1) / gs;
  const int64_t warps = n * G;
  uniform_groups_kernel<<<static_cast<unsigned>((warps + 7) / 8), 256, 0, stream>>>(w, n, k, gs, G, twin_of(s), codes,
                                                                                     scales, zeros, deq);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

// Blocks of `block` columns over [0, end), each followed by the trailing update of columns [i2, k).
template <SolveMode kMode>
void solve_blocks(const SolveArgs& a, int64_t end, int64_t block, cublasHandle_t blas, cudaStream_t stream) {
  LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(gptq_block_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSolveSmem)));
  const unsigned grid = static_cast<unsigned>((a.n + kSolveWarps - 1) / kSolveWarps);
  for (int64_t i1 = 0; i1 < end; i1 += block) {
    const int64_t i2 = std::min(end, i1 + block);
    const int cnt = static_cast<int>(i2 - i1);
    gptq_block_kernel<kMode><<<grid, kSolveThreads, kSolveSmem, stream>>>(a, i1, cnt);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    if (i2 < a.k) {
      // Row-major W[:, i2:] [n, k-i2] (ld k) -= Err [n, cnt] (ld kBlock) · U[i1:i2, i2:] [cnt, k-i2] (ld k). cuBLAS is
      // column-major, where each row-major matrix reads as its transpose: Wᵀ -= Uᵀ · Errᵀ, no transposition flags.
      const float alpha = -1.0f, beta = 1.0f;
      cublas_check(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(a.k - i2), static_cast<int>(a.n), cnt,
                               &alpha, a.u + i1 * a.k + i2, static_cast<int>(a.k), a.err, kBlock, &beta,
                               const_cast<float*>(a.wp) + i2, static_cast<int>(a.k)),
                   "cublasSgemm (GPTQ trailing update)");
    }
  }
}

}  // namespace

// -----------------------------------------------------------------------------------------------------------------
// GpuGptqFactor

GpuGptqFactor::GpuGptqFactor(GpuGptqFactor&& o) noexcept { *this = std::move(o); }

GpuGptqFactor& GpuGptqFactor::operator=(GpuGptqFactor&& o) noexcept {
  if (this != &o) {
    std::swap(k, o.k);
    std::swap(dead, o.dead);
    std::swap(perm, o.perm);
    std::swap(damp, o.damp);
    std::swap(u, o.u);
    std::swap(u_diag, o.u_diag);
    std::swap(d_perm, o.d_perm);
  }
  return *this;
}

GpuGptqFactor::~GpuGptqFactor() {
  if (u != nullptr) cudaFree(u);
  if (u_diag != nullptr) cudaFree(u_diag);
  if (d_perm != nullptr) cudaFree(d_perm);
}

GpuGptqFactor gptq_factor_gpu(const double* h, int64_t k, const GptqOptions& o, cudaStream_t stream,
                              const std::vector<int64_t>* perm_override) {
  LOWBIT_CHECK(h != nullptr && k > 0, "gptq: empty Hessian (k = ", k, ")");
  LOWBIT_CHECK(o.percdamp > 0 && o.block_size > 0, "gptq: percdamp and block size must be positive");
  LOWBIT_CHECK(k <= 46340, "gptq: k = ", k, " exceeds the 32-bit cuSOLVER interface (k * k < 2^31)");
  GpuGptqFactor f;
  f.k = k;
  std::vector<double> diag(static_cast<size_t>(k));
  LOWBIT_CUDA_CHECK(cudaMemcpy2DAsync(diag.data(), sizeof(double), h, static_cast<size_t>(k + 1) * sizeof(double),
                                      sizeof(double), static_cast<size_t>(k), cudaMemcpyDeviceToHost, stream));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  f.dead.assign(static_cast<size_t>(k), 0);
  for (int64_t i = 0; i < k; ++i)
    if (diag[static_cast<size_t>(i)] == 0.0) {   // a column no calibration input ever activated
      diag[static_cast<size_t>(i)] = 1.0;
      f.dead[static_cast<size_t>(i)] = 1;
    }
  f.perm.resize(static_cast<size_t>(k));
  if (perm_override != nullptr) {
    LOWBIT_CHECK(static_cast<int64_t>(perm_override->size()) == k, "gptq: the processing order has ",
                 perm_override->size(), " columns, expected ", k);
    std::vector<char> seen(static_cast<size_t>(k), 0);
    for (int64_t c : *perm_override) {
      LOWBIT_CHECK(c >= 0 && c < k && !seen[static_cast<size_t>(c)], "gptq: the processing order is not a permutation of 0..",
                   k - 1);
      seen[static_cast<size_t>(c)] = 1;
    }
    f.perm = *perm_override;
  } else {
    std::iota(f.perm.begin(), f.perm.end(), 0);
    if (o.act_order)
      std::stable_sort(f.perm.begin(), f.perm.end(), [&](int64_t a, int64_t b) {
        return diag[static_cast<size_t>(a)] > diag[static_cast<size_t>(b)];
      });
  }
  double mean_diag = 0;
  for (int64_t i = 0; i < k; ++i) mean_diag += diag[static_cast<size_t>(f.perm[static_cast<size_t>(i)])];
  mean_diag /= static_cast<double>(k);
  f.damp = o.percdamp * mean_diag;
  upload_owned(&f.d_perm, f.perm);

  Handles& hd = handles(stream);
  const int ki = static_cast<int>(k);
  StreamBuffer<double> a(static_cast<size_t>(k * k), stream);
  int lwork_f = 0, lwork_i = 0;
  cusolver_check(cusolverDnDpotrf_bufferSize(hd.solver, CUBLAS_FILL_MODE_LOWER, ki, a.get(), ki, &lwork_f),
                 "cusolverDnDpotrf_bufferSize");
  cusolver_check(cusolverDnDpotri_bufferSize(hd.solver, CUBLAS_FILL_MODE_LOWER, ki, a.get(), ki, &lwork_i),
                 "cusolverDnDpotri_bufferSize");
  StreamBuffer<double> work(static_cast<size_t>(std::max({lwork_f, lwork_i, 1})), stream);
  StreamBuffer<int> info(3, stream);
  const int lwork = std::max(lwork_f, lwork_i);
  const dim3 grid(blocks_for(k, 256, 64), static_cast<unsigned>(std::min<int64_t>(k, 65535)));
  for (int attempt = 0;; ++attempt) {
    permute_damp_kernel<<<grid, 256, 0, stream>>>(h, k, f.d_perm, f.damp, a.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    // inverse_upper_cholesky of gptq.cpp (see the design note): the three infos are read once, after all three calls.
    cusolver_check(cusolverDnDpotrf(hd.solver, CUBLAS_FILL_MODE_LOWER, ki, a.get(), ki, work.get(), lwork, info.get()),
                   "cusolverDnDpotrf");
    cusolver_check(cusolverDnDpotri(hd.solver, CUBLAS_FILL_MODE_LOWER, ki, a.get(), ki, work.get(), lwork, info.get() + 1),
                   "cusolverDnDpotri");
    cusolver_check(cusolverDnDpotrf(hd.solver, CUBLAS_FILL_MODE_LOWER, ki, a.get(), ki, work.get(), lwork, info.get() + 2),
                   "cusolverDnDpotrf");
    const std::vector<int> infos = download(info.get(), 3, stream);
    if (infos[0] == 0 && infos[1] == 0 && infos[2] == 0) break;
    LOWBIT_CHECK(attempt < 6, "gptq: the Hessian is not positive definite even with damping ", f.damp);
    f.damp *= 10.0;
  }
  LOWBIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&f.u), static_cast<size_t>(k * k) * sizeof(float)));
  LOWBIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&f.u_diag), static_cast<size_t>(k) * sizeof(double)));
  upper_factor_kernel<<<grid, 256, 0, stream>>>(a.get(), k, f.u, f.u_diag);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return f;
}

// -----------------------------------------------------------------------------------------------------------------
// GPTQ

UniformQuantized gptq_quantize_gpu(const float* w, int64_t n, int64_t k, const GpuGptqFactor& f,
                                   const GptqOptions& o, cudaStream_t stream, float* deq, const double* h,
                                   GptqStats* stats) {
  const UniformSpec& s = o.spec;
  validate_uniform_spec(s, k);
  LOWBIT_CHECK(w != nullptr && n > 0 && k > 0, "gptq: empty weight [", n, ", ", k, "]");
  LOWBIT_CHECK(o.block_size > 0, "gptq: percdamp and block size must be positive");
  LOWBIT_CHECK(f.k == k && f.u != nullptr, "gptq: factor is for k = ", f.k, ", weight has k = ", k);
  check_finite(w, n * k, "gptq", stream);
  const int64_t gs = s.group_size > 0 ? std::min(s.group_size, k) : k;
  GptqStats st;
  st.damp = f.damp;
  for (char d : f.dead) st.dead_columns += d ? 1 : 0;

  UniformQuantized q;
  q.bits = s.bits;
  q.n = n;
  q.k = k;
  q.group_size = gs;
  q.symmetric = s.symmetric;
  const int64_t G = q.groups();

  Handles& hd = handles(stream);
  StreamBuffer<float> wp(static_cast<size_t>(n * k), stream), err(static_cast<size_t>(n * kBlock), stream);
  StreamBuffer<uint8_t> codes(static_cast<size_t>(n * k), stream), zeros(static_cast<size_t>(n * G), stream);
  StreamBuffer<uint16_t> scales(static_cast<size_t>(n * G), stream);
  std::optional<StreamBuffer<float>> own_deq;
  if (deq == nullptr && h != nullptr && stats != nullptr) {
    own_deq.emplace(static_cast<size_t>(n * k), stream);
    deq = own_deq->get();
  }

  if (o.static_groups) {   // parameters from the original order (dead columns zeroed), before any update
    std::vector<int64_t> identity(static_cast<size_t>(k));
    for (int64_t c = 0; c < k; ++c) identity[static_cast<size_t>(c)] = c;
    gather_live_columns(w, n, k, identity, f.dead, wp.get(), stream);
    uniform_groups(wp.get(), n, k, gs, s, nullptr, scales.get(), zeros.get(), nullptr, stream);
  }
  gather_live_columns(w, n, k, f.perm, f.dead, wp.get(), stream);

  SolveArgs a = solve_args(wp.get(), n, k, f, err.get(), deq);
  a.spec = twin_of(s);
  a.gs = gs;
  a.G = G;
  a.static_groups = o.static_groups;
  a.codes = codes.get();
  a.scales = scales.get();
  a.zeros = zeros.get();
  // Blocks above 128 columns would need more registers per lane; the block size changes only the rounding of the
  // trailing updates (the algorithm is the same), so larger requests run at 128.
  solve_blocks<SolveMode::Uniform>(a, k, std::min<int64_t>(o.block_size, kBlock), hd.blas, stream);

  q.codes = download(codes.get(), static_cast<size_t>(n * k), stream);
  q.scales = download(scales.get(), static_cast<size_t>(n * G), stream);
  if (!s.symmetric) q.zeros = download(zeros.get(), static_cast<size_t>(n * G), stream);
  if (!o.static_groups && o.act_order && G > 1) {   // one group: every g_idx would be 0, so none is stored
    q.g_idx.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) q.g_idx[static_cast<size_t>(f.perm[static_cast<size_t>(j)])] = static_cast<int32_t>(j / gs);
  }
  if (h != nullptr && stats != nullptr) st.hessian_error = hessian_weighted_error_gpu(w, deq, n, k, h, stream);
  if (stats != nullptr) *stats = st;
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return q;
}

// -----------------------------------------------------------------------------------------------------------------
// RTN

UniformQuantized rtn_quantize_gpu(const float* w, int64_t n, int64_t k, const UniformSpec& s, cudaStream_t stream,
                                  float* deq) {
  validate_uniform_spec(s, k);
  LOWBIT_CHECK(w != nullptr && n > 0 && k > 0, "rtn: empty weight [", n, ", ", k, "]");
  check_finite(w, n * k, "rtn", stream);
  UniformQuantized q;
  q.bits = s.bits;
  q.n = n;
  q.k = k;
  q.group_size = s.group_size > 0 ? std::min(s.group_size, k) : k;
  q.symmetric = s.symmetric;
  const int64_t G = q.groups();
  StreamBuffer<uint8_t> codes(static_cast<size_t>(n * k), stream), zeros(static_cast<size_t>(n * G), stream);
  StreamBuffer<uint16_t> scales(static_cast<size_t>(n * G), stream);
  uniform_groups(w, n, k, q.group_size, s, codes.get(), scales.get(), zeros.get(), deq, stream);
  q.codes = download(codes.get(), static_cast<size_t>(n * k), stream);
  q.scales = download(scales.get(), static_cast<size_t>(n * G), stream);
  if (!s.symmetric) q.zeros = download(zeros.get(), static_cast<size_t>(n * G), stream);
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return q;
}

// -----------------------------------------------------------------------------------------------------------------
// QUIK

QuikQuantized quik_quantize_gpu(const float* w, int64_t n, int64_t k, const double* h,
                                const std::vector<int32_t>& outlier_cols, int wbits, int abits, bool act_fp8, bool clip,
                                double percdamp, cudaStream_t stream, float* deq, QuikStats* stats) {
  LOWBIT_CHECK(w != nullptr && n > 0 && k > 0, "quik: empty weight [", n, ", ", k, "]");
  LOWBIT_CHECK(wbits == 4 || wbits == 8, "quik: --wbits must be 4 or 8");
  check_finite(w, n * k, "quik", stream);
  LOWBIT_CHECK(h != nullptr, "quik: needs the [k, k] Hessian");
  QuikQuantized q = quik_layout(n, k, outlier_cols, wbits, abits, act_fp8);
  const std::vector<int64_t> base = q.base_columns();
  const int64_t kb = q.base(), no = q.outliers();
  std::vector<int64_t> order(base);   // processing order: base columns, then the outlier columns
  for (int32_t c : outlier_cols) order.push_back(c);
  GptqOptions fo;
  fo.percdamp = percdamp;
  const GpuGptqFactor f = gptq_factor_gpu(h, k, fo, stream, &order);

  Handles& hd = handles(stream);
  StreamBuffer<float> wp(static_cast<size_t>(n * k), stream), err(static_cast<size_t>(n * kBlock), stream);
  StreamBuffer<float> row_scale(static_cast<size_t>(n), stream);
  StreamBuffer<uint16_t> scale_f16(static_cast<size_t>(n), stream), outlier_w(static_cast<size_t>(n * no), stream);
  StreamBuffer<int8_t> wq(static_cast<size_t>(n * kb), stream);
  std::optional<StreamBuffer<float>> own_deq;
  if (deq == nullptr && stats != nullptr) {
    own_deq.emplace(static_cast<size_t>(n * k), stream);
    deq = own_deq->get();
  }
  gather_live_columns(w, n, k, order, f.dead, wp.get(), stream);

  const int qmax = (1 << (wbits - 1)) - 1;
  quik_row_scale_kernel<<<static_cast<unsigned>((n + 7) / 8), 256, 0, stream>>>(wp.get(), n, k, kb, qmax, clip,
                                                                                 scale_f16.get(), row_scale.get());
  LOWBIT_CUDA_CHECK(cudaGetLastError());

  SolveArgs a = solve_args(wp.get(), n, k, f, err.get(), deq);
  a.row_scale = row_scale.get();
  a.qmax = qmax;
  a.kb = kb;
  a.wq = wq.get();
  solve_blocks<SolveMode::Quik>(a, kb, kBlock, hd.blas, stream);   // the updates reach the outlier columns too
  if (no > 0) {
    quik_outliers_kernel<<<blocks_for(n * no, 256, 4096), 256, 0, stream>>>(wp.get(), n, k, kb, f.d_perm,
                                                                            outlier_w.get(), deq);
    LOWBIT_CUDA_CHECK(cudaGetLastError());
  }
  q.wq = download(wq.get(), static_cast<size_t>(n * kb), stream);
  q.scale = download(scale_f16.get(), static_cast<size_t>(n), stream);
  q.outlier_w = download(outlier_w.get(), static_cast<size_t>(n * no), stream);
  q.wreduced.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r)
    q.wreduced[static_cast<size_t>(r)] = quik_wreduced(q.scale[static_cast<size_t>(r)], q.wq.data() + r * kb, kb);
  if (stats != nullptr) stats->hessian_error = hessian_weighted_error_gpu(w, deq, n, k, h, stream);
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return q;
}

// -----------------------------------------------------------------------------------------------------------------
// Σ_r (w_r - ŵ_r)ᵀ H (w_r - ŵ_r)

double hessian_weighted_error_gpu(const float* w, const float* w_hat, int64_t n, int64_t k, const double* h,
                                  cudaStream_t stream) {
  LOWBIT_CHECK(w != nullptr && w_hat != nullptr && h != nullptr && n > 0 && k > 0,
               "hessian_weighted_error_gpu: empty input [", n, ", ", k, "]");
  Handles& hd = handles(stream);
  // Row blocks of D and DH at most 2^25 fp64 values each (256 MB): k = 28672 still takes 1170 rows at a time.
  const int64_t rows = std::clamp<int64_t>((int64_t{1} << 25) / k, 1, n);
  StreamBuffer<double> d(static_cast<size_t>(rows * k), stream), dh(static_cast<size_t>(rows * k), stream);
  double total = 0;
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t m = std::min(rows, n - r0);
    difference_kernel<<<blocks_for(m * k, 256, 4096), 256, 0, stream>>>(w + r0 * k, w_hat + r0 * k, m * k, d.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    // Row-major DH [m, k] = D [m, k] · H [k, k]; column-major: DHᵀ = Hᵀ · Dᵀ = H · Dᵀ (H symmetric, both triangles).
    const double one = 1.0, zero = 0.0;
    cublas_check(cublasDgemm(hd.blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(k), static_cast<int>(m),
                             static_cast<int>(k), &one, h, static_cast<int>(k), d.get(), static_cast<int>(k), &zero,
                             dh.get(), static_cast<int>(k)),
                 "cublasDgemm (Hessian-weighted error)");
    double part = 0;
    cublas_check(cublasDdot(hd.blas, static_cast<int>(m * k), d.get(), 1, dh.get(), 1, &part),
                 "cublasDdot (Hessian-weighted error)");
    total += part;
  }
  return total;
}

}  // namespace lowbit::cuda
