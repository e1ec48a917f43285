// The GPU quantizers of backend_cuda/quantize/gptq_gpu.h against their CPU twins (quantize/rtn, gptq, quik) on the
// same seeded inputs: H = 2/N XᵀX from correlated inputs with a few heavy columns and one dead column; odd shapes
// (k not a multiple of 128, groups across blocks, per channel), bits 2..8, (a)symmetric, act-order, static groups, MSE
// clipping. RTN must be bit-identical; GPTQ and QUIK share the CPU's arithmetic inside a 128-column block but not
// the summation order of the trailing sgemm, so their codes get an agreement budget and their objective a relative
// one. The shared scalar arithmetic (gptq_gpu_kernels.cuh) is checked against the CPU on any machine; the GPU tests
// skip out loud without a device.
#include <gtest/gtest.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_cuda/quantize/gptq_gpu_kernels.cuh"
#include "core/half.h"
#include "quantize/gptq.h"
#include "quantize/quik.h"
#include "quantize/rtn.h"
#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LOWBIT_WITH_CUDA
#include "backend_cuda/common/common.h"
#include "backend_cuda/quantize/gptq_gpu.h"
#endif

namespace lowbit {
namespace {

// GPU codes equal to the CPU's (GPTQ, QUIK): only a weight within rounding of a decision boundary may differ, and
// its row's later codes follow the changed error feedback.
constexpr double kMinCodeAgreement = 0.999;
// Σ (w - ŵ)ᵀ H (w - ŵ), GPU vs CPU, relative.
constexpr double kHessianErrorBudget = 1e-4;
// U (fp32) from cuSOLVER vs LAPACK, max |difference| over max |U|.
constexpr double kFactorBudget = 1e-6;
// QUIK's fp16 outlier columns (updated by every base block), ‖difference‖ / ‖CPU‖.
constexpr double kOutlierBudget = 1e-3;

// Correlated inputs (four shared factors), every 37th column heavy, one dead column: H = 2/N XᵀX.
std::vector<double> make_hessian(int64_t k, int64_t rows, uint32_t seed, int64_t dead_col) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<double> load(static_cast<size_t>(k * 4));
  for (double& v : load) v = nd(rng);
  std::vector<double> x(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    double f[4];
    for (double& v : f) v = nd(rng);
    for (int64_t c = 0; c < k; ++c) {
      double v = nd(rng);
      for (int t = 0; t < 4; ++t) v += 0.6 * load[static_cast<size_t>(c * 4 + t)] * f[t];
      if (c % 37 == 5) v *= 8.0;
      if (c == dead_col) v = 0.0;
      x[static_cast<size_t>(r * k + c)] = v;
    }
  }
  std::vector<double> h(static_cast<size_t>(k * k), 0.0);
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(k), static_cast<int>(rows),
              2.0 / static_cast<double>(rows), x.data(), static_cast<int>(k), 0.0, h.data(), static_cast<int>(k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j) h[static_cast<size_t>(i * k + j)] = h[static_cast<size_t>(j * k + i)];
  return h;
}

// Rows of different scales, a few large weights, one all-zero row (GPTQ's [-1, 1] range for an empty group).
std::vector<float> make_weights(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> w(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      float v = nd(rng) * (0.02f + 0.01f * static_cast<float>(r % 5));
      if ((r * k + c) % 97 == 13) v *= 6.0f;
      w[static_cast<size_t>(r * k + c)] = r == 3 ? 0.0f : v;
    }
  return w;
}

std::string describe(const UniformSpec& s) {
  return "bits " + std::to_string(s.bits) + " group " + std::to_string(s.group_size) +
         (s.symmetric ? " sym" : " asym") + (s.mse_clip ? " mse" : "");
}

template <typename T>
double agreement(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size() || a.empty()) return a.size() == b.size() ? 1.0 : 0.0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i] ? 1 : 0;
  return static_cast<double>(same) / static_cast<double>(a.size());
}

double rel_diff(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

// ------------------------------------------------------------------------------------------------------------------
// The shared scalar arithmetic, on the CPU

// core/half.h's fp16 conversions, which the CPU quantizers and their GPU twins share, against the IEEE definition:
// every half decodes to sign · mantissa · 2^exponent, and a float rounds to the nearest half, ties to an even
// mantissa, overflowing to infinity at 65520.
TEST(GptqGpuTwin, Fp16ConversionsAreIeee) {
  const auto exact = [](uint32_t h) {   // the value of a finite half, in double
    const double mag = ((h >> 10) & 0x1fu) == 0 ? std::ldexp(static_cast<double>(h & 0x3ffu), -24)
                                                : std::ldexp(static_cast<double>(1024 + (h & 0x3ffu)),
                                                             static_cast<int>((h >> 10) & 0x1fu) - 25);
    return (h & 0x8000u) ? -mag : mag;
  };
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (((h >> 10) & 0x1fu) == 0x1fu) {
      EXPECT_EQ(std::isnan(f), (h & 0x3ffu) != 0) << h;
      if ((h & 0x3ffu) == 0) {
        EXPECT_EQ(f, (h & 0x8000u) ? -INFINITY : INFINITY) << h;
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), exact(h)) << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << h;
    ASSERT_EQ(f32_to_f16(f), h) << h;   // exactly representable values map back to themselves
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {   // every 4099th float bit pattern, NaNs and infinities included
    float f;
    const uint32_t u32 = static_cast<uint32_t>(u);
    std::memcpy(&f, &u32, 4);
    const uint16_t h = f32_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(h))) << u;
      continue;
    }
    ASSERT_EQ((h & 0x8000u) != 0, std::signbit(f)) << u;
    const double a = std::fabs(static_cast<double>(f));
    const uint32_t mag = h & 0x7fffu;
    if (a >= 65520.0) {
      ASSERT_EQ(mag, 0x7c00u) << u;
      continue;
    }
    ASSERT_LT(mag, 0x7c00u) << u;
    const double err = std::fabs(exact(mag) - a);
    if (mag > 0) {
      ASSERT_LE(err, std::fabs(exact(mag - 1) - a)) << u;
    }
    const double up = mag + 1 < 0x7c00u ? std::fabs(exact(mag + 1) - a) : INFINITY;
    ASSERT_LE(err, up) << u;
    if ((mag > 0 && err == std::fabs(exact(mag - 1) - a)) || err == up) {   // a tie
      ASSERT_EQ(mag & 1u, 0u) << u;
    }
  }
}

// find_group_params and quantize_code of rtn.cpp against the twin's sequential form: the warp form on the device
// only spreads the same candidates over lanes.
TEST(GptqGpuTwin, GroupParamsMatchFindGroupParams) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  int checked = 0;
  for (int bits : {2, 3, 4, 8})
    for (bool sym : {false, true})
      for (bool mse : {false, true})
        for (int64_t count : {1, 7, 128, 300}) {
          UniformSpec s;
          s.bits = bits;
          s.symmetric = sym;
          s.mse_clip = mse;
          cuda::gptq_twin::UniformSpecTwin t;
          t.bits = bits;
          t.symmetric = sym;
          t.mse_clip = mse;
          t.max_shrink = s.max_shrink;
          t.grid = s.grid;
          for (int trial = 0; trial < 20; ++trial) {
            std::vector<float> x(static_cast<size_t>(count));
            const float scale = trial == 0 ? 0.0f : std::ldexp(1.0f, trial % 9 - 6);
            for (float& v : x) v = nd(rng) * scale + (trial % 3 == 1 ? 0.5f * scale : 0.0f);
            if (trial == 2) std::fill(x.begin(), x.end(), 0.0f);
            if (trial == 3) x[0] = -0.0f;
            const GroupParams want = find_group_params(x.data(), count, 1, s);
            const cuda::gptq_twin::UniformParams got =
                cuda::gptq_twin::group_params_sequential([&](int64_t i) { return x[static_cast<size_t>(i)]; }, count, t);
            ASSERT_EQ(got.scale_f16, want.scale_f16) << describe(s) << " count " << count << " trial " << trial;
            ASSERT_EQ(got.zero, want.zero) << describe(s) << " count " << count << " trial " << trial;
            ASSERT_EQ(got.scale, want.scale);
            const int maxq = (1 << bits) - 1;
            for (float v : x) ASSERT_EQ(cuda::gptq_twin::uniform_code(v, got, maxq), quantize_code(v, want, maxq));
            ++checked;
          }
        }
  EXPECT_EQ(checked, 4 * 2 * 2 * 4 * 20);
}

// QUIK's per-row scale (clipping search included) against quik_quantize's, on the processing-order weights it sees.
TEST(GptqGpuTwin, QuikRowScaleMatchesQuikQuantize) {
  const int64_t n = 24, k = 160, dead = 11;
  const std::vector<double> h = make_hessian(k, 256, 3, dead);
  const std::vector<float> w = make_weights(n, k, 4);
  const std::vector<int32_t> outliers = {5, 42, 79, 150};
  for (int wbits : {4, 8})
    for (bool clip : {false, true}) {
      const QuikQuantized q = quik_quantize(w.data(), n, k, h, outliers, wbits, 8, false, clip, 0.01);
      const std::vector<int64_t> base = q.base_columns();
      const int qmax = (1 << (wbits - 1)) - 1;
      for (int64_t r = 0; r < n; ++r) {
        auto load = [&](int64_t i) {
          const int64_t c = base[static_cast<size_t>(i)];
          return c == dead ? 0.0f : w[static_cast<size_t>(r * k + c)];
        };
        ASSERT_EQ(cuda::gptq_twin::quik_row_scale_sequential(load, q.base(), qmax, clip), q.scale[static_cast<size_t>(r)])
            << "wbits " << wbits << " clip " << clip << " row " << r;
      }
    }
}

#ifdef LOWBIT_WITH_CUDA


// A non-blocking stream: the functions must order their own work on it and synchronise it before returning.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

std::vector<float> dequantized(const UniformQuantized& q) {
  std::vector<float> d(static_cast<size_t>(q.n * q.k));
  q.dequantize(d.data());
  return d;
}

// Bit-identical float vectors (so -0 and +0 differ); otherwise a failure naming the first difference.
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

struct Shape {
  int64_t n, k, group;
};

TEST(GptqGpu, RtnIsBitIdenticalToTheCpu) {
  SKIP_WITHOUT_GPU();
  Stream st;
  const std::vector<Shape> shapes = {{37, 200, 128}, {64, 576, 128}, {16, 300, 0}, {24, 256, 64}, {5, 1000, 0}};
  for (const Shape& sh : shapes) {
    const std::vector<float> w = make_weights(sh.n, sh.k, static_cast<uint32_t>(sh.k));
    const cuda::DeviceBuffer<float> dw(w);
    cuda::DeviceBuffer<float> deq(w.size());
    for (int bits : {2, 3, 4, 8})
      for (bool sym : {false, true})
        for (bool mse : {false, true}) {
          UniformSpec s;
          s.bits = bits;
          s.group_size = sh.group;
          s.symmetric = sym;
          s.mse_clip = mse;
          SCOPED_TRACE("n " + std::to_string(sh.n) + " k " + std::to_string(sh.k) + " " + describe(s));
          const UniformQuantized cpu = rtn_quantize(w.data(), sh.n, sh.k, s);
          const UniformQuantized gpu = cuda::rtn_quantize_gpu(dw.get(), sh.n, sh.k, s, st.s, deq.get());
          EXPECT_EQ(gpu.group_size, cpu.group_size);
          EXPECT_TRUE(gpu.codes == cpu.codes) << "code agreement " << agreement(gpu.codes, cpu.codes);
          EXPECT_TRUE(gpu.scales == cpu.scales) << "scale agreement " << agreement(gpu.scales, cpu.scales);
          EXPECT_TRUE(gpu.zeros == cpu.zeros) << "zero agreement " << agreement(gpu.zeros, cpu.zeros);
          EXPECT_TRUE(same_bits(deq.download(), dequantized(cpu)));
        }
  }
}

TEST(GptqGpu, FactorMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Stream st;
  for (int64_t k : {200, 576}) {
    const std::vector<double> h = make_hessian(k, 2 * k, static_cast<uint32_t>(k), k / 3);
    const cuda::DeviceBuffer<double> dh(h);
    // identity, act-order, and an explicit order (QUIK's base-then-outliers) against the CPU on the permuted H
    for (int mode = 0; mode < 3; ++mode) {
      SCOPED_TRACE("k " + std::to_string(k) + " mode " + std::to_string(mode));
      GptqOptions o;
      o.act_order = mode == 1;
      std::vector<int64_t> order(static_cast<size_t>(k));
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(static_cast<uint32_t>(k + mode));
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<double> hp = h;
      if (mode == 2)
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j)
            hp[static_cast<size_t>(i * k + j)] = h[static_cast<size_t>(order[static_cast<size_t>(i)] * k + order[static_cast<size_t>(j)])];
      const GptqFactor cpu = gptq_factor(hp, k, o);
      const cuda::GpuGptqFactor gpu = cuda::gptq_factor_gpu(dh.get(), k, o, st.s, mode == 2 ? &order : nullptr);
      EXPECT_EQ(gpu.damp, cpu.damp);
      if (mode == 2) {
        EXPECT_TRUE(gpu.perm == order);
        for (int64_t i = 0; i < k; ++i)
          EXPECT_EQ(gpu.dead[static_cast<size_t>(order[static_cast<size_t>(i)])], cpu.dead[static_cast<size_t>(i)]);
      } else {
        EXPECT_TRUE(gpu.perm == cpu.perm);
        EXPECT_TRUE(gpu.dead == cpu.dead);
      }
      std::vector<float> u(static_cast<size_t>(k * k));
      std::vector<double> diag(static_cast<size_t>(k));
      LOWBIT_CUDA_CHECK(cudaMemcpy(u.data(), gpu.u, u.size() * sizeof(float), cudaMemcpyDeviceToHost));
      LOWBIT_CUDA_CHECK(cudaMemcpy(diag.data(), gpu.u_diag, diag.size() * sizeof(double), cudaMemcpyDeviceToHost));
      double max_u = 0, max_d = 0, max_diag_rel = 0;
      bool lower_zero = true;
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          const size_t e = static_cast<size_t>(i * k + j);
          max_u = std::max(max_u, static_cast<double>(std::fabs(cpu.uf[e])));
          max_d = std::max(max_d, static_cast<double>(std::fabs(u[e] - cpu.uf[e])));
          if (j < i && u[e] != 0.0f) lower_zero = false;
        }
        max_diag_rel = std::max(max_diag_rel, rel_diff(diag[static_cast<size_t>(i)], cpu.u[static_cast<size_t>(i * k + i)]));
      }
      EXPECT_LE(max_d / max_u, kFactorBudget);
      EXPECT_LE(max_diag_rel, kFactorBudget);
      EXPECT_TRUE(lower_zero);
    }
  }
}

struct GptqCase {
  int bits;
  int64_t group;   // -1: the shape's
  bool sym, act_order, static_groups, mse;
};

TEST(GptqGpu, MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Stream st;
  const std::vector<Shape> shapes = {{37, 200, 128}, {64, 576, 128}, {48, 300, 0}, {40, 256, 96}};
  const std::vector<GptqCase> cases = {
      {4, -1, false, false, false, false}, {3, -1, true, true, false, false}, {2, -1, false, true, true, false},
      {8, -1, true, false, false, false},  {4, -1, false, true, false, true}, {3, -1, false, false, true, true},
      {4, 0, false, true, false, false},   {2, 32, true, false, false, true},
  };
  for (const Shape& sh : shapes) {
    const int64_t dead = sh.k / 2 + 1;
    const std::vector<double> h = make_hessian(sh.k, 2 * sh.k, static_cast<uint32_t>(sh.k + 1), dead);
    const std::vector<float> w = make_weights(sh.n, sh.k, static_cast<uint32_t>(sh.n));
    const cuda::DeviceBuffer<double> dh(h);
    const cuda::DeviceBuffer<float> dw(w);
    cuda::DeviceBuffer<float> deq(w.size());
    for (const GptqCase& c : cases) {
      GptqOptions o;
      o.spec.bits = c.bits;
      o.spec.group_size = c.group < 0 ? sh.group : c.group;
      o.spec.symmetric = c.sym;
      o.spec.mse_clip = c.mse;
      o.act_order = c.act_order;
      o.static_groups = c.static_groups;
      SCOPED_TRACE("n " + std::to_string(sh.n) + " k " + std::to_string(sh.k) + " " + describe(o.spec) +
                   (c.act_order ? " act-order" : "") + (c.static_groups ? " static" : ""));
      GptqStats cs, gs;
      const GptqFactor cf = gptq_factor(h, sh.k, o);
      const UniformQuantized cpu = gptq_quantize(w.data(), sh.n, sh.k, h, cf, o, &cs);
      const cuda::GpuGptqFactor gf = cuda::gptq_factor_gpu(dh.get(), sh.k, o, st.s);
      const UniformQuantized gpu = cuda::gptq_quantize_gpu(dw.get(), sh.n, sh.k, gf, o, st.s, deq.get(), dh.get(), &gs);
      const double codes = agreement(gpu.codes, cpu.codes);
      EXPECT_GE(codes, kMinCodeAgreement);
      EXPECT_TRUE(gpu.g_idx == cpu.g_idx);
      EXPECT_EQ(gpu.group_size, cpu.group_size);
      EXPECT_EQ(gs.dead_columns, cs.dead_columns);
      EXPECT_EQ(gs.dead_columns, 1);
      EXPECT_EQ(gs.damp, cs.damp);
      EXPECT_LE(rel_diff(gs.hessian_error, cs.hessian_error), kHessianErrorBudget)
          << gs.hessian_error << " vs " << cs.hessian_error;
      const int64_t G = cpu.groups();
      if (o.static_groups) {   // from the original weights, before any update: exact
        EXPECT_TRUE(gpu.scales == cpu.scales);
        EXPECT_TRUE(gpu.zeros == cpu.zeros);
      } else {   // the first group in processing order sees the original weights too
        for (int64_t r = 0; r < sh.n; ++r) {
          ASSERT_EQ(gpu.scales[static_cast<size_t>(r * G)], cpu.scales[static_cast<size_t>(r * G)]) << "row " << r;
          if (!c.sym) {
            ASSERT_EQ(gpu.zeros[static_cast<size_t>(r * G)], cpu.zeros[static_cast<size_t>(r * G)]) << "row " << r;
          }
        }
      }
      EXPECT_TRUE(same_bits(deq.download(), dequantized(gpu)));
      std::printf("gptq n %lld k %lld %s%s%s: codes %.5f, hessian error %.6g vs %.6g\n", static_cast<long long>(sh.n),
                  static_cast<long long>(sh.k), describe(o.spec).c_str(), c.act_order ? " act-order" : "",
                  c.static_groups ? " static" : "", codes, gs.hessian_error, cs.hessian_error);
    }
  }
}

TEST(GptqGpu, QuikMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Stream st;
  struct QuikCase {
    int64_t n, k;
    std::vector<int32_t> outliers;
  };
  std::vector<int32_t> many;
  for (int32_t c = 3; c < 576; c += 29) many.push_back(c);
  const std::vector<QuikCase> cases = {{37, 200, {3, 17, 150}}, {64, 576, many}, {16, 300, {}}, {20, 130, {0, 129}}};
  for (const QuikCase& qc : cases) {
    const int64_t dead = qc.k / 2 + 1;
    const std::vector<double> h = make_hessian(qc.k, 2 * qc.k, static_cast<uint32_t>(qc.k + 7), dead);
    const std::vector<float> w = make_weights(qc.n, qc.k, static_cast<uint32_t>(qc.n + 1));
    const cuda::DeviceBuffer<double> dh(h);
    const cuda::DeviceBuffer<float> dw(w);
    cuda::DeviceBuffer<float> deq(w.size());
    for (int wbits : {4, 8})
      for (bool clip : {false, true}) {
        SCOPED_TRACE("n " + std::to_string(qc.n) + " k " + std::to_string(qc.k) + " outliers " +
                     std::to_string(qc.outliers.size()) + " wbits " + std::to_string(wbits) + (clip ? " clip" : ""));
        QuikStats cs, gs;
        const QuikQuantized cpu = quik_quantize(w.data(), qc.n, qc.k, h, qc.outliers, wbits, 8, false, clip, 0.01, &cs);
        const QuikQuantized gpu = cuda::quik_quantize_gpu(dw.get(), qc.n, qc.k, dh.get(), qc.outliers, wbits, 8, false,
                                                          clip, 0.01, st.s, deq.get(), &gs);
        EXPECT_TRUE(gpu.scale == cpu.scale);   // from the weights before any update: exact
        const double codes = agreement(gpu.wq, cpu.wq);
        EXPECT_GE(codes, kMinCodeAgreement);
        EXPECT_TRUE(gpu.outlier_idx == cpu.outlier_idx);
        ASSERT_EQ(gpu.outlier_w.size(), cpu.outlier_w.size());
        double diff2 = 0, ref2 = 0;
        for (size_t i = 0; i < cpu.outlier_w.size(); ++i) {
          const double a = f16_to_f32(gpu.outlier_w[i]), b = f16_to_f32(cpu.outlier_w[i]);
          diff2 += (a - b) * (a - b);
          ref2 += b * b;
        }
        if (ref2 > 0) {
          EXPECT_LE(std::sqrt(diff2 / ref2), kOutlierBudget);
        }
        for (int64_t r = 0; r < qc.n; ++r)
          EXPECT_EQ(gpu.wreduced[static_cast<size_t>(r)],
                    quik_wreduced(gpu.scale[static_cast<size_t>(r)], gpu.wq.data() + r * gpu.base(), gpu.base()));
        EXPECT_LE(rel_diff(gs.hessian_error, cs.hessian_error), kHessianErrorBudget)
            << gs.hessian_error << " vs " << cs.hessian_error;
        std::vector<float> want(w.size());
        gpu.dequantize(want.data());
        EXPECT_TRUE(same_bits(deq.download(), want));
        std::printf("quik n %lld k %lld outliers %zu wbits %d%s: codes %.5f, hessian error %.6g vs %.6g\n",
                    static_cast<long long>(qc.n), static_cast<long long>(qc.k), qc.outliers.size(), wbits,
                    clip ? " clip" : "", codes, gs.hessian_error, cs.hessian_error);
      }
  }
}

TEST(GptqGpu, HessianWeightedErrorMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Stream st;
  const int64_t n = 300, k = 333;
  const std::vector<double> h = make_hessian(k, 400, 5, -1);
  const std::vector<float> w = make_weights(n, k, 6), w2 = make_weights(n, k, 8);
  const cuda::DeviceBuffer<double> dh(h);
  const cuda::DeviceBuffer<float> dw(w), dw2(w2);
  const double cpu = hessian_weighted_error(w.data(), w2.data(), n, k, h);
  const double gpu = cuda::hessian_weighted_error_gpu(dw.get(), dw2.get(), n, k, dh.get(), st.s);
  EXPECT_LE(rel_diff(gpu, cpu), 1e-10) << gpu << " vs " << cpu;   // fp64 throughout: summation order only
}

TEST(GptqGpu, RefusesWhatTheCpuRefuses) {
  SKIP_WITHOUT_GPU();
  Stream st;
  const int64_t n = 8, k = 64;
  std::vector<float> w = make_weights(n, k, 1);
  w[77] = std::nanf("");
  const cuda::DeviceBuffer<float> dw(w);
  const std::vector<double> h = make_hessian(k, 128, 2, -1);
  const cuda::DeviceBuffer<double> dh(h);
  auto expect_error = [](auto&& call, const std::string& phrase) {
    try {
      call();
      ADD_FAILURE() << "no error (expected '" << phrase << "')";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(phrase), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  UniformSpec s;
  expect_error([&] { cuda::rtn_quantize_gpu(dw.get(), n, k, s, st.s); }, "rtn: weight 77 is not finite");
  GptqOptions o;
  const cuda::GpuGptqFactor f = cuda::gptq_factor_gpu(dh.get(), k, o, st.s);
  expect_error([&] { cuda::gptq_quantize_gpu(dw.get(), n, k, f, o, st.s); }, "gptq: weight 77 is not finite");
  expect_error([&] { cuda::quik_quantize_gpu(dw.get(), n, k, dh.get(), {1, 2}, 4, 8, false, false, 0.01, st.s); },
               "quik: weight 77 is not finite");
  const cuda::DeviceBuffer<float> dw_small(make_weights(n, k - 1, 1));
  expect_error([&] { cuda::gptq_quantize_gpu(dw_small.get(), n, k - 1, f, o, st.s); }, "factor is for k = 64");
  // -H: no damping makes it positive definite, on either side
  std::vector<double> neg(h);
  for (double& v : neg) v = -v;
  const cuda::DeviceBuffer<double> dneg(neg);
  expect_error([&] { gptq_factor(neg, k, o); }, "not positive definite even with damping");
  expect_error([&] { cuda::gptq_factor_gpu(dneg.get(), k, o, st.s); }, "not positive definite even with damping");
  s.bits = 9;
  expect_error([&] { cuda::rtn_quantize_gpu(dw.get(), n, k, s, st.s); }, "--bits must be in 2..8");
}

// Llama-2-7B shapes: 4096 x 4096 against the CPU (timed on both), and 4096 x 11008 (down_proj) on the GPU alone.
TEST(GptqGpu, Llama7BShapesTimed) {
  SKIP_WITHOUT_GPU();
  Stream st;
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  GptqOptions o;
  o.spec.bits = 4;
  o.spec.group_size = 128;
  o.act_order = true;
  {
    const int64_t n = 4096, k = 4096;
    const std::vector<double> h = make_hessian(k, k + 512, 11, 1234);
    const std::vector<float> w = make_weights(n, k, 12);
    const cuda::DeviceBuffer<double> dh(h);
    const cuda::DeviceBuffer<float> dw(w);
    cuda::DeviceBuffer<float> deq(w.size());
    const auto t0 = clock::now();
    const GptqFactor cf = gptq_factor(h, k, o);
    GptqStats cs, gs;
    const UniformQuantized cpu = gptq_quantize(w.data(), n, k, h, cf, o, &cs);
    const auto t1 = clock::now();
    const cuda::GpuGptqFactor gf = cuda::gptq_factor_gpu(dh.get(), k, o, st.s);
    const auto t2 = clock::now();
    const UniformQuantized gpu = cuda::gptq_quantize_gpu(dw.get(), n, k, gf, o, st.s, deq.get(), dh.get(), &gs);
    const auto t3 = clock::now();
    const double codes = agreement(gpu.codes, cpu.codes);
    std::printf("gptq %s 4096x4096 act-order g128: CPU %.3f s, GPU factor %.3f s + solve %.3f s (%.1fx); codes %.5f, "
                "hessian error %.6g vs %.6g\n",
                cuda::device_name().c_str(), seconds(t0, t1), seconds(t1, t2), seconds(t2, t3),
                seconds(t0, t1) / seconds(t1, t3), codes, gs.hessian_error, cs.hessian_error);
    EXPECT_GE(codes, kMinCodeAgreement);
    EXPECT_TRUE(gpu.g_idx == cpu.g_idx);
    EXPECT_LE(rel_diff(gs.hessian_error, cs.hessian_error), kHessianErrorBudget);
    const auto t4 = clock::now();
    const UniformQuantized rtn_cpu = rtn_quantize(w.data(), n, k, o.spec);
    const auto t5 = clock::now();
    const UniformQuantized rtn_gpu = cuda::rtn_quantize_gpu(dw.get(), n, k, o.spec, st.s);
    const auto t6 = clock::now();
    std::printf("rtn 4096x4096 g128: CPU %.3f s, GPU %.3f s\n", seconds(t4, t5), seconds(t5, t6));
    EXPECT_TRUE(rtn_gpu.codes == rtn_cpu.codes && rtn_gpu.scales == rtn_cpu.scales && rtn_gpu.zeros == rtn_cpu.zeros);
  }
  {
    const int64_t n = 4096, k = 11008;
    const std::vector<double> h = make_hessian(k, 1024, 13, 77);
    const cuda::DeviceBuffer<double> dh(h);
    const cuda::DeviceBuffer<float> dw(make_weights(n, k, 14));
    cuda::DeviceBuffer<float> deq(static_cast<size_t>(n * k)), rtn(static_cast<size_t>(n * k));
    GptqStats gs;
    const auto t0 = clock::now();
    const cuda::GpuGptqFactor gf = cuda::gptq_factor_gpu(dh.get(), k, o, st.s);
    const auto t1 = clock::now();
    cuda::gptq_quantize_gpu(dw.get(), n, k, gf, o, st.s, deq.get(), nullptr, nullptr);
    const auto t2 = clock::now();
    gs.hessian_error = cuda::hessian_weighted_error_gpu(dw.get(), deq.get(), n, k, dh.get(), st.s);
    const auto t3 = clock::now();
    cuda::rtn_quantize_gpu(dw.get(), n, k, o.spec, st.s, rtn.get());
    const double rtn_error = cuda::hessian_weighted_error_gpu(dw.get(), rtn.get(), n, k, dh.get(), st.s);
    std::printf("gptq %s 4096x11008 act-order g128: factor %.3f s, solve %.3f s, hessian error %.3f s; error %.6g "
                "(RTN %.6g)\n",
                cuda::device_name().c_str(), seconds(t0, t1), seconds(t1, t2), seconds(t2, t3), gs.hessian_error,
                rtn_error);
    EXPECT_LT(gs.hessian_error, rtn_error);
  }
}

#else

TEST(GptqGpu, SkippedWithoutCudaToolkit) { GTEST_SKIP() << "GPU tests skipped: lowbit was built without CUDA"; }

#endif

}  // namespace
}  // namespace lowbit
