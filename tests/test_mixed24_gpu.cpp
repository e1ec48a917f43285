// The GPU 2/4/16 mixed24a quantizer (backend_cuda/quantize/mixed24_gpu.h) against its CPU twin mixed24a_quantize on
// the same seeded inputs: Hessians 2/N XᵀX of random X with heavy (and in one case dead) columns, weights with a few
// large entries; the brief's shapes plus odd ones (rows not a multiple of 16, block size 64, outliers from all
// groups). Checked: the group permutation, outlier positions, codes, the hessian error, and the dequantized weight
// (the GPU's deq output is exactly what its result encodes, and agrees with the CPU's). Without error feedback, or
// with a diagonal Hessian, no sum depends on BLAS and the two agree bit for bit: the kernel rounds every float
// operation on its own as the portable CPU build does (LOWBIT_NATIVE=OFF, the device bundle's build; with
// -march=native GCC fuses some of the CPU twin's multiply-adds and a rare near-tie may differ).
// One Llama-sized 4096 x 4096 linear prints its time.
// The option checks run before any device work, so they are tested without a GPU too.
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LOWBIT_WITH_CUDA
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend_cuda/common/common.h"
#include "backend_cuda/quantize/mixed24_gpu.h"
#include "quantize/gptq.h"
#include "quantize/mixed24.h"

namespace lowbit {
namespace {

// GPU vs CPU with error feedback: cuBLAS and OpenBLAS sum the trailing update in different orders (~1e-7 relative),
// and a code that flips on such a near-tie changes its row's later updates; the GPU's diag of H⁻¹ comes from the fp32
// factor (the CPU's from fp64), which moves outlier saliencies by ~1e-7 relative at the selection threshold.
constexpr double kMinSameCodes = 0.995;
constexpr double kMinSameOutliers = 0.99;
constexpr double kMinSameDequantized = 0.99;
constexpr double kHessianErrorRelTol = 1e-3;


double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Problem {
  int64_t n = 0, k = 0;
  std::vector<float> w;    // [n, k]
  std::vector<double> h;   // [k, k]
};

// H = 2/N XᵀX over N calibration rows (2k unless given); every 37th input column 8x heavier (activation outlier
// features), `dead` columns never activated (H_cc = 0); `diagonal`: H's off-diagonal entries dropped. W ~ N(0, 0.02²)
// with one weight in 500 ten times larger.
Problem make_problem(int64_t n, int64_t k, uint32_t seed, const std::vector<int64_t>& dead = {}, bool diagonal = false,
                     int64_t N = 0) {
  Problem p;
  p.n = n;
  p.k = k;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  if (N <= 0) N = 2 * k;
  std::vector<double> scale(static_cast<size_t>(k), 1.0), x(static_cast<size_t>(N * k));
  for (int64_t c = 0; c < k; ++c)
    if (c % 37 == 5) scale[static_cast<size_t>(c)] = 8.0;
  for (int64_t c : dead) scale[static_cast<size_t>(c)] = 0.0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < k; ++c) x[static_cast<size_t>(i * k + c)] = nd(rng) * scale[static_cast<size_t>(c)];
  p.h.assign(static_cast<size_t>(k * k), 0.0);
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(k), static_cast<int>(N), 2.0 / static_cast<double>(N),
              x.data(), static_cast<int>(k), 0.0, p.h.data(), static_cast<int>(k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      if (diagonal && i != j) p.h[static_cast<size_t>(i * k + j)] = 0.0;
      else if (j < i) p.h[static_cast<size_t>(i * k + j)] = p.h[static_cast<size_t>(j * k + i)];
  p.w.resize(static_cast<size_t>(n * k));
  std::uniform_int_distribution<int> big(0, 499);
  for (float& v : p.w) v = static_cast<float>(0.02 * nd(rng) * (big(rng) == 0 ? 10.0 : 1.0));
  return p;
}

struct GpuRun {
  Mixed24AQuantized q;
  std::vector<float> deq;   // [n, k] the device's deq output
  Mixed24Stats stats;
  double seconds = 0;
};

GpuRun run_gpu(const Problem& p, const Mixed24Options& o) {
  const cuda::DeviceBuffer<float> w(p.w);
  const cuda::DeviceBuffer<double> h(p.h);
  cuda::DeviceBuffer<float> deq(p.w.size());
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());   // the uploads ran on the legacy stream; the quantizer uses its own
  cudaStream_t s = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GpuRun r;
  const double t0 = now_s();
  r.q = cuda::mixed24a_quantize_gpu(w.get(), p.n, p.k, h.get(), o, s, deq.get(), &r.stats);
  r.seconds = now_s() - t0;
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(s));
  r.deq = deq.download();
  return r;
}

// Flat stored-order positions r k + c of the outliers.
std::set<int64_t> outlier_positions(const Mixed24AQuantized& q) {
  std::set<int64_t> at;
  if (q.outlier_rowptr.empty()) return at;
  for (int64_t r = 0; r < q.n; ++r)
    for (int32_t i = q.outlier_rowptr[static_cast<size_t>(r)]; i < q.outlier_rowptr[static_cast<size_t>(r + 1)]; ++i)
      at.insert(r * q.k + q.outlier_col[static_cast<size_t>(i)]);
  return at;
}

template <typename T>
double same_fraction(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size() || a.empty()) return a.size() == b.size() ? 1.0 : 0.0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

struct Case {
  int64_t n, k;
  uint32_t seed;
  std::vector<int64_t> dead;
  bool diagonal = false;
};

// The GPU result against the CPU twin. exact: every part bit for bit (no error feedback, so no sgemm).
void expect_matches_cpu(const Case& c, const Mixed24Options& o, const std::string& what, bool exact = false) {
  SCOPED_TRACE(what);
  const Problem p = make_problem(c.n, c.k, c.seed, c.dead, c.diagonal);
  GptqOptions fo;
  fo.percdamp = o.percdamp;
  fo.block_size = o.block_size;
  Mixed24Stats cs;
  const double t0 = now_s();
  const Mixed24AQuantized cq = mixed24a_quantize(p.w.data(), p.n, p.k, p.h, gptq_factor(p.h, p.k, fo), o, &cs);
  const double cpu_s = now_s() - t0;
  const GpuRun g = run_gpu(p, o);
  const Mixed24AQuantized& gq = g.q;

  // The device deq output is exactly what the returned struct encodes.
  std::vector<float> g_deq(p.w.size()), c_deq(p.w.size());
  gq.dequantize(g_deq.data());
  cq.dequantize(c_deq.data());
  EXPECT_EQ(g.deq, g_deq) << "deq differs from Mixed24AQuantized::dequantize of the GPU result";

  EXPECT_EQ(gq.n, cq.n);
  EXPECT_EQ(gq.k, cq.k);
  ASSERT_EQ(gq.perm, cq.perm) << "group permutation (eq. 9 sensitivity order)";
  ASSERT_EQ(gq.codes.size(), cq.codes.size());
  ASSERT_EQ(gq.zero.size(), cq.zero.size());
  ASSERT_EQ(gq.ss.size(), cq.ss.size());
  const std::set<int64_t> go = outlier_positions(gq), co = outlier_positions(cq);
  EXPECT_EQ(g.stats.outliers, cs.outliers);
  EXPECT_EQ(g.stats.outliers, static_cast<int64_t>(go.size()));
  EXPECT_EQ(gq.outlier_rowptr.empty(), cq.outlier_rowptr.empty());
  size_t common = 0;
  for (int64_t i : go) common += co.count(i);
  const double same_outliers = co.empty() ? (go.empty() ? 1.0 : 0.0) : static_cast<double>(common) / static_cast<double>(co.size());
  const double same_codes = same_fraction(gq.codes, cq.codes);
  const double same_meta = 0.5 * (same_fraction(gq.zero, cq.zero) + same_fraction(gq.scode, cq.scode));
  const double same_second = 0.5 * (same_fraction(gq.ss, cq.ss) + same_fraction(gq.sm, cq.sm));
  const double same_deq = same_fraction(g_deq, c_deq);
  const double herr_rel = std::fabs(g.stats.hessian_error - cs.hessian_error) / std::max(cs.hessian_error, 1e-300);
  std::printf("[ %s ] %lldx%lld: same codes %.5f, (scale code, zero) %.5f, step/offset %.5f, outliers %.5f (%lld), "
              "dequantized %.5f; hessian error gpu %.6g cpu %.6g (rel %.2e); gpu %.3f s, cpu %.3f s\n",
              what.c_str(), static_cast<long long>(p.n), static_cast<long long>(p.k), same_codes, same_meta, same_second,
              same_outliers, static_cast<long long>(cs.outliers), same_deq, g.stats.hessian_error, cs.hessian_error,
              herr_rel, g.seconds, cpu_s);
  if (exact) {
    EXPECT_EQ(go, co);
    EXPECT_EQ(gq.codes, cq.codes);
    EXPECT_EQ(gq.zero, cq.zero);
    EXPECT_EQ(gq.scode, cq.scode);
    EXPECT_EQ(gq.ss, cq.ss);
    EXPECT_EQ(gq.sm, cq.sm);
    EXPECT_EQ(gq.outlier_val, cq.outlier_val);
    EXPECT_EQ(g_deq, c_deq);
  }
  EXPECT_GE(same_outliers, kMinSameOutliers);
  EXPECT_GE(same_codes, kMinSameCodes);
  EXPECT_GE(same_deq, kMinSameDequantized);
  EXPECT_LE(herr_rel, kHessianErrorRelTol);
}

// The brief's shapes: a small one, a wide one (with two dead input columns), a tall one.
const std::vector<Case>& shapes() {
  static const std::vector<Case> c = {{48, 256, 11, {}}, {576, 1536, 12, {5, 700}}, {1536, 576, 13, {}}};
  return c;
}

TEST(Mixed24Gpu, MatchesCpuWithDefaultOptions) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : shapes()) expect_matches_cpu(c, Mixed24Options{}, "default");
}

TEST(Mixed24Gpu, MatchesCpuWithoutOutliers) {
  SKIP_WITHOUT_GPU();
  Mixed24Options o;
  o.outlier_fraction = 0;
  for (const Case& c : shapes()) expect_matches_cpu(c, o, "no outliers");
}

TEST(Mixed24Gpu, MatchesCpuWithUnitsInColumnOrder) {
  SKIP_WITHOUT_GPU();
  Mixed24Options o;
  o.unit_order_by_sensitivity = false;
  for (const Case& c : shapes()) expect_matches_cpu(c, o, "units in column order");
}

// Rows not a multiple of 16 (a partial second-order block), one row, a block of 64 columns, outliers from all groups
// (4-bit groups too), the maximum outlier fraction.
TEST(Mixed24Gpu, MatchesCpuOnOddShapesAndOptions) {
  SKIP_WITHOUT_GPU();
  Mixed24Options o;
  o.block_size = 64;
  o.outliers_from_all_groups = true;
  o.outlier_fraction = 0.02;
  expect_matches_cpu({37, 192, 21, {}}, o, "37 rows, block 64, outliers from all groups");
  expect_matches_cpu({1, 128, 22, {}}, Mixed24Options{}, "one row");
}

// Without error feedback nothing is summed by BLAS: the two quantizers must agree bit for bit.
TEST(Mixed24Gpu, BitExactWithoutErrorFeedback) {
  SKIP_WITHOUT_GPU();
  Mixed24Options o;
  o.error_feedback = false;
  o.outlier_fraction = 0;
  expect_matches_cpu({48, 256, 31, {}}, o, "round to nearest", true);
  expect_matches_cpu({37, 192, 32, {3}}, o, "round to nearest, 37 rows, a dead column", true);
}

// A diagonal Hessian makes U diagonal: every update adds exact zeros, the sgemm included, and diag(H⁻¹) is U_cc² on
// both sides, so even with error feedback and outliers the results agree bit for bit (outlier selection, fp16 outlier
// values, fits that skip outliers, the CSR).
TEST(Mixed24Gpu, BitExactWithDiagonalHessian) {
  SKIP_WITHOUT_GPU();
  expect_matches_cpu({96, 512, 51, {9}, true}, Mixed24Options{}, "diagonal H", true);
  Mixed24Options o;
  o.outliers_from_all_groups = true;
  o.outlier_fraction = 0.01;
  expect_matches_cpu({37, 192, 52, {}, true}, o, "diagonal H, 37 rows, outliers from all groups", true);
}

// A Llama-2-7B-sized linear (4096 x 4096): prints the time (the first call also pays for the CUDA libraries' start).
TEST(Mixed24Gpu, Llama7bSizedLinearTime) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(4096, 4096, 41, {}, false, 4096);
  const Mixed24Options o;
  const GpuRun first = run_gpu(p, o);
  const GpuRun g = run_gpu(p, o);
  std::printf("[ mixed24a gpu ] 4096x4096 on %s: %.3f s (first call %.3f s), %lld outliers, hessian error %.6g\n",
              cuda::device_name().c_str(), g.seconds, first.seconds, static_cast<long long>(g.stats.outliers),
              g.stats.hessian_error);
  EXPECT_EQ(g.q.codes, first.q.codes) << "two runs on the same input differ";
  EXPECT_EQ(g.stats.outliers, std::llround(o.outlier_fraction * 4096.0 * 4096.0));
  EXPECT_TRUE(std::isfinite(g.stats.hessian_error) && g.stats.hessian_error > 0);
  std::vector<float> d(p.w.size());
  g.q.dequantize(d.data());
  EXPECT_EQ(g.deq, d);
}

// Refusals happen before any device work (null device pointers are never touched).
TEST(Mixed24Gpu, RefusesWhatTheAlignedLayoutCannotTake) {
  auto refuses = [](int64_t n, int64_t k, const Mixed24Options& o, const std::string& phrase) {
    try {
      cuda::mixed24a_quantize_gpu(nullptr, n, k, nullptr, o, nullptr);
      ADD_FAILURE() << "no error for n = " << n << ", k = " << k << " (expected '" << phrase << "')";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  refuses(16, 100, Mixed24Options{}, "multiple of 64");
  Mixed24Options ratio;
  ratio.ratio_4bit = 0.5;
  refuses(16, 128, ratio, "--ratio-4bit 0.25");
  Mixed24Options block;
  block.block_size = 256;
  refuses(16, 256, block, "block size 256");
  Mixed24Options odd_block;
  odd_block.block_size = 24;
  refuses(16, 256, odd_block, "multiple of 16");
  refuses(16, 128, Mixed24Options{}, "needs the device weight");
}

}  // namespace
}  // namespace lowbit

#else
TEST(Mixed24Gpu, SkippedWithoutCudaToolkit) { GTEST_SKIP() << "GPU tests skipped: lowbit was built without CUDA"; }
#endif
