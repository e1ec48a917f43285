#include "cuda/bench_kernels.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "cuda/packed.h"

namespace lowbit::cuda {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = static_cast<uint8_t>(mix(seed * 0x100000001ull + static_cast<uint64_t>(i)));
}

// fp16 values lo + (hi - lo) * u, u uniform in [0, 1).
__global__ void fill_half_kernel(__half* p, int64_t n, uint64_t seed, float lo, float hi) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = __float2half_rn(lo + (hi - lo) * static_cast<float>(mix(seed * 0x100000001ull + static_cast<uint64_t>(i)) >> 40) * 0x1p-24f);
}

__global__ void fill_float_kernel(float* p, int64_t n, uint64_t seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = static_cast<float>(mix(seed * 0x100000001ull + static_cast<uint64_t>(i)) >> 40) * 0x1p-23f - 1.0f;
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

void fill_bytes(void* p, int64_t n, uint64_t seed) {
  if (n > 0) fill_bytes_kernel<<<blocks(n), 256>>>(static_cast<uint8_t*>(p), n, seed);
}
void fill_half(void* p, int64_t n, uint64_t seed, float lo, float hi) {
  if (n > 0) fill_half_kernel<<<blocks(n), 256>>>(static_cast<__half*>(p), n, seed, lo, hi);
}

// Median time (us) of f(i) over iters launches, one event pair each; i rotates the weight copies.
template <typename F>
double median_us(int iters, F f) {
  cudaEvent_t a, b;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&a));
  LOWBIT_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);   // warm-up
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    LOWBIT_CUDA_CHECK(cudaEventRecord(a));
    f(i);
    LOWBIT_CUDA_CHECK(cudaEventRecord(b));
    LOWBIT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  LOWBIT_CUDA_CHECK(cudaEventDestroy(a));
  LOWBIT_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Copies so that one pass over all of them is >= 4x the L2 (at least 2).
int rotation(uint64_t bytes_per_copy) {
  int l2 = 0;
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const uint64_t want = 4ull * static_cast<uint64_t>(l2);
  return static_cast<int>(std::clamp<uint64_t>((want + bytes_per_copy - 1) / bytes_per_copy, 2, 64));
}

// A packed weight's parts on the device, filled with random bytes of the real layout.
struct RandomAnyPrec {
  DeviceBuffer<uint32_t> planes;
  DeviceBuffer<__half> luts[9];
  AnyPrecDevice view;
  RandomAnyPrec(int64_t n, int64_t k, uint64_t seed) {
    view.n = n;
    view.k = k;
    view.words = (k + 31) / 32;
    view.planes = 8;
    view.widths = 0x1FCu;
    planes = DeviceBuffer<uint32_t>(static_cast<size_t>(8 * n * view.words));
    fill_bytes(planes.get(), static_cast<int64_t>(planes.bytes()), seed);
    view.plane_data = planes.get();
    for (int b = 2; b <= 8; ++b) {
      luts[b] = DeviceBuffer<__half>(static_cast<size_t>(n << b));
      fill_half(luts[b].get(), n << b, seed + static_cast<uint64_t>(b), -0.05f, 0.05f);
      view.lut[b] = luts[b].get();
    }
  }
  uint64_t bytes_read(int b) const { return planes.bytes() / 8 * static_cast<uint64_t>(b) + luts[b].bytes(); }
};

struct RandomMixed24A {
  DeviceBuffer<uint8_t> perm, qa, qb, meta2, meta4, ss2, sm2, ss4, sm4, rowptr, col, val;
  Mixed24ADevice view;
  uint64_t bytes = 0;
  RandomMixed24A(int64_t n, int64_t k, double outlier_frac, uint64_t seed) {
    const int64_t U = k / 64, G = k / 16, RG = (n + 15) / 16;
    view.n = n;
    view.k = k;
    std::vector<uint16_t> p(static_cast<size_t>(G));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), std::mt19937(static_cast<uint32_t>(seed)));
    perm = DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(p.data()), p.size() * 2);
    auto rnd = [&](DeviceBuffer<uint8_t>& d, int64_t nbytes, uint64_t s) {
      d = DeviceBuffer<uint8_t>(static_cast<size_t>(nbytes));
      fill_bytes(d.get(), nbytes, s);
      bytes += static_cast<uint64_t>(nbytes);
    };
    auto halves = [&](DeviceBuffer<uint8_t>& d, int64_t count, uint64_t s, float lo, float hi) {
      d = DeviceBuffer<uint8_t>(static_cast<size_t>(2 * count));
      fill_half(d.get(), count, s, lo, hi);
      bytes += static_cast<uint64_t>(2 * count);
    };
    rnd(qa, 16 * n * U, seed + 1);
    rnd(qb, 4 * n * U, seed + 2);
    rnd(meta2, 2 * n * U, seed + 3);
    rnd(meta4, n * U, seed + 4);
    halves(ss2, RG * 3 * U, seed + 5, 1e-4f, 1e-3f);
    halves(sm2, RG * 3 * U, seed + 6, 1e-3f, 2e-3f);
    halves(ss4, RG * U, seed + 7, 1e-4f, 1e-3f);
    halves(sm4, RG * U, seed + 8, 1e-3f, 2e-3f);
    bytes += perm.bytes();
    view.perm = reinterpret_cast<const uint16_t*>(perm.get());
    view.qa = reinterpret_cast<const uint4*>(qa.get());
    view.qb = reinterpret_cast<const uint32_t*>(qb.get());
    view.meta2 = reinterpret_cast<const uint16_t*>(meta2.get());
    view.meta4 = meta4.get();
    view.ss2 = reinterpret_cast<const __half*>(ss2.get());
    view.sm2 = reinterpret_cast<const __half*>(sm2.get());
    view.ss4 = reinterpret_cast<const __half*>(ss4.get());
    view.sm4 = reinterpret_cast<const __half*>(sm4.get());
    const int64_t per_row = static_cast<int64_t>(outlier_frac * static_cast<double>(k) + 0.5);
    if (per_row > 0) {   // the same count in every row, columns spread over the row (stored order, increasing)
      std::vector<int32_t> rp(static_cast<size_t>(n + 1));
      for (int64_t r = 0; r <= n; ++r) rp[static_cast<size_t>(r)] = static_cast<int32_t>(r * per_row);
      std::vector<uint16_t> c(static_cast<size_t>(n * per_row));
      std::mt19937 rng(static_cast<uint32_t>(seed + 9));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < per_row; ++i)
          c[static_cast<size_t>(r * per_row + i)] = static_cast<uint16_t>(i * (k / per_row) + static_cast<int64_t>(rng() % static_cast<uint32_t>(k / per_row)));
      rowptr = DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(rp.data()), rp.size() * 4);
      col = DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(c.data()), c.size() * 2);
      halves(val, n * per_row, seed + 10, -0.1f, 0.1f);
      bytes += rowptr.bytes() + col.bytes();
      view.rowptr = reinterpret_cast<const int32_t*>(rowptr.get());
      view.col = reinterpret_cast<const uint16_t*>(col.get());
      view.val = reinterpret_cast<const __half*>(val.get());
      view.nnz = n * per_row;
    }
  }
  uint64_t dense_bytes() const { return bytes - (rowptr.bytes() + col.bytes() + val.bytes()); }
};

double copy_bandwidth() {
  const size_t bytes = 1ull << 30;
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  LOWBIT_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const double us = median_us(20, [&](int) { LOWBIT_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice)); });
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
}

}  // namespace

void run_kernel_bench(const KernelBenchOptions& o, std::ostream& out) {
  char line[512];
  const double bw = copy_bandwidth();
  std::snprintf(line, sizeof line, "device: %s\ncopy bandwidth (device-to-device, bytes read + written): %.0f GB/s\n",
                device_name().c_str(), bw / 1e9);
  out << line;
  out << "times: median of " << o.iters << " launches (CUDA events), weights rotated through copies >= 4x the L2\n";
  out << "shape (n x k) | kernel | batch | us | cuBLAS fp16 us | speedup | weight GB/s | of copy bw\n";
  cudaStream_t s = nullptr;
  GemmContext ctx(s);
  for (const auto& [n, k] : o.shapes) {
    // Baseline: cuBLAS fp16 (fp32 accumulation, fp16 out), the same batches, rotated weights.
    const uint64_t wbytes = static_cast<uint64_t>(n * k) * 2;
    const int rot_h = rotation(wbytes);
    std::vector<DeviceBuffer<__half>> wh;
    for (int i = 0; i < rot_h; ++i) {
      wh.emplace_back(static_cast<size_t>(n * k));
      fill_half(wh.back().get(), n * k, 1000 + static_cast<uint64_t>(i), -0.05f, 0.05f);
    }
    const int64_t mmax = *std::max_element(o.batches.begin(), o.batches.end());
    DeviceBuffer<__half> xh(static_cast<size_t>(mmax * k)), yh(static_cast<size_t>(mmax * n));
    fill_half(xh.get(), mmax * k, 7, -1.0f, 1.0f);
    DeviceBuffer<float> xf(static_cast<size_t>(mmax * k)), yf(static_cast<size_t>(mmax * n));
    fill_float_kernel<<<blocks(mmax * k), 256>>>(xf.get(), mmax * k, 8);
    std::vector<double> base;
    for (int64_t m : o.batches) {
      const float alpha = 1.0f, beta = 0.0f;
      base.push_back(median_us(o.iters, [&](int i) {
        cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, wh[static_cast<size_t>(i % rot_h)].get(), CUDA_R_16F,
                                  static_cast<int>(k), xh.get(), CUDA_R_16F, static_cast<int>(k), &beta, yh.get(),
                                  CUDA_R_16F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "bench cuBLAS");
      }));
      std::snprintf(line, sizeof line, "%lldx%lld | cuBLAS fp16 | %lld | %.1f | %.1f | 1.00 | %.0f | %.2f\n",
                    static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m), base.back(),
                    base.back(), static_cast<double>(wbytes) / (base.back() * 1e-6) / 1e9,
                    static_cast<double>(wbytes) / (base.back() * 1e-6) / bw);
      out << line << std::flush;
    }
    wh.clear();
    auto row = [&](const std::string& kernel, int64_t m, double us, double b_us, uint64_t bytes) {
      std::snprintf(line, sizeof line, "%lldx%lld | %s | %lld | %.1f | %.1f | %.2f | %.0f | %.2f\n",
                    static_cast<long long>(n), static_cast<long long>(k), kernel.c_str(), static_cast<long long>(m), us,
                    b_us, b_us / us, static_cast<double>(bytes) / (us * 1e-6) / 1e9,
                    static_cast<double>(bytes) / (us * 1e-6) / bw);
      out << line << std::flush;
    };
    if (o.anyprec && k % 32 == 0) {
      const int rot = rotation(static_cast<uint64_t>(n * k));   // 8 planes = 1 byte per weight
      std::vector<RandomAnyPrec> w;
      for (int i = 0; i < rot; ++i) w.emplace_back(n, k, 50 + static_cast<uint64_t>(i));
      for (int b : o.bits)
        for (size_t bi = 0; bi < o.batches.size(); ++bi) {
          const int64_t m = o.batches[bi];
          double us;
          if (m <= kMaxGemvBatch) {
            us = median_us(o.iters, [&](int i) { anyprec_gemv(w[static_cast<size_t>(i % rot)].view, b, xf.get(), static_cast<int>(m), yf.get(), s); });
          } else {
            __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
            us = median_us(o.iters, [&](int i) {
              anyprec_dequant_f16(w[static_cast<size_t>(i % rot)].view, b, wd, s);
              dense_f16_matmul(wd, n, k, xf.get(), m, yf.get(), ctx);
            });
          }
          row("anyprec " + std::to_string(b) + "-bit" + (m > kMaxGemvBatch ? " (dequant+cuBLAS)" : ""), m, us, base[bi],
              w[0].bytes_read(b));
        }
    }
    if (o.mixed24a && k % 64 == 0) {
      const int rot = rotation(static_cast<uint64_t>(n * k) * 3 / 8);
      std::vector<RandomMixed24A> w;
      for (int i = 0; i < rot; ++i) w.emplace_back(n, k, o.outlier_frac, 70 + static_cast<uint64_t>(i));
      std::vector<Mixed24ADevice> dense;
      for (const auto& x : w) {
        Mixed24ADevice d = x.view;
        d.rowptr = nullptr;
        d.col = nullptr;
        d.val = nullptr;
        d.nnz = 0;
        dense.push_back(d);
      }
      for (size_t bi = 0; bi < o.batches.size(); ++bi) {
        const int64_t m = o.batches[bi];
        if (m <= kMaxGemvBatch) {
          const double d_us = median_us(o.iters, [&](int i) { mixed24a_gemv(dense[static_cast<size_t>(i % rot)], xf.get(), static_cast<int>(m), yf.get(), s); });
          row("2/4/16 no outliers", m, d_us, base[bi], w[0].dense_bytes());
          if (w[0].view.rowptr != nullptr) {
            const double f_us = median_us(o.iters, [&](int i) { mixed24a_gemv(w[static_cast<size_t>(i % rot)].view, xf.get(), static_cast<int>(m), yf.get(), s, OutlierMode::Fused); });
            row("2/4/16 + outliers fused", m, f_us, base[bi], w[0].bytes);
            const double c_us = median_us(o.iters, [&](int i) { mixed24a_gemv(w[static_cast<size_t>(i % rot)].view, xf.get(), static_cast<int>(m), yf.get(), s, OutlierMode::SpMV); });
            row("2/4/16 + outliers CSR SpMV", m, c_us, base[bi], w[0].bytes);
          }
        } else {
          __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
          const double us = median_us(o.iters, [&](int i) {
            mixed24a_dequant_f16(w[static_cast<size_t>(i % rot)].view, wd, s);
            dense_f16_matmul(wd, n, k, xf.get(), m, yf.get(), ctx);
          });
          row("2/4/16 + outliers (dequant+cuBLAS)", m, us, base[bi], w[0].bytes);
        }
      }
    }
  }
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace lowbit::cuda
