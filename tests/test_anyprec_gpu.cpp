// The any-precision quantizer's per-row core (quantize/anyprec_row.h), shared by the CPU quantizer and its GPU twin
// (backend_cuda/quantize/anyprec_gpu.h):
//   - CPU: anyprec_quantize and weighted_kmeans_1d reproduce checksums of their results recorded from the CPU
//     quantizer before the core was shared (inputs with ties in value, -0/+0, zero sensitivities, all-zero-
//     sensitivity rows, constant rows; seeds 2..5, parents up to 8, served-width subsets, outliers 0 and 0.005);
//     the warp's division of the searches over 32 lanes, emulated on the CPU, gives the same checksums; the core's
//     fp16 conversions equal core/half.h's;
//   - GPU: anyprec_quantize_gpu equals anyprec_quantize bit for bit (codes, every LUT, the outlier CSR) on the
//     brief's shapes 37x200, 576x1536, 1536x576; one Llama-sized 4096 x 4096 linear prints its time against the
//     CPU's. Skipped out loud without a device; the option checks run before any device work and are tested here too.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "quantize/anyprec.h"
#include "quantize/anyprec_row.h"   // the fp16 conversions only: the row core runs through anyprec.h (fp contraction)
#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LOWBIT_WITH_CUDA
#include "backend_cuda/common/common.h"
#include "backend_cuda/quantize/anyprec_gpu.h"
#endif

namespace lowbit {
namespace {

struct Input {
  std::vector<float> w, s;
};

// Heavy-tailed weights; a quarter of them on a 1/256 grid (ties in value, -0 next to +0), an eighth of the
// sensitivities zero, every 7th row with no sensitivity at all (plain k-means) and every 11th row constant (fewer
// distinct values than clusters).
Input make_input(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> heavy(4.0f);
  std::exponential_distribution<float> sens(1.0f);
  Input in;
  in.w.resize(static_cast<size_t>(n * k));
  in.s.resize(in.w.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      float v = 0.02f * heavy(rng);
      if (rng() % 4 == 0) v = std::round(v * 256.0f) / 256.0f;
      if (r % 11 == 5) v = 0.125f;
      float s = sens(rng) * sens(rng);
      if (rng() % 8 == 0 || r % 7 == 3) s = 0.0f;
      in.w[static_cast<size_t>(r * k + c)] = v;
      in.s[static_cast<size_t>(r * k + c)] = s;
    }
  return in;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
template <typename T>
uint64_t fnv1a(uint64_t h, const std::vector<T>& v) {
  return fnv1a(h, v.data(), v.size() * sizeof(T));
}

uint64_t checksum(const AnyPrecQuantized& q) {
  uint64_t h = 14695981039346656037ull;
  h = fnv1a(h, q.codes);
  for (const auto& [b, lut] : q.luts) {
    h = fnv1a(h, &b, sizeof b);
    h = fnv1a(h, lut);
  }
  h = fnv1a(h, q.outlier_rowptr);
  h = fnv1a(h, q.outlier_col);
  return fnv1a(h, q.outlier_val);
}

struct Case {
  int64_t n, k;
  uint32_t seed;
  int seed_bits, parent_bits;
  std::vector<int> widths;
  double outliers;
  uint64_t golden;   // checksum of the CPU quantizer's result
};

// The checksums were recorded from the CPU quantizer before its per-row core moved to anyprec_row.h; the shared core
// reproduced all eight with the row sort of that time (std::sort by value alone). Equal values are now ordered by
// column, a defined order the GPU's stable sort can reproduce; it changes the last bits of some centroids (the prefix
// sums add equal values in another order), so cases 4, 6, 7 and 8 carry the checksums of the defined order.

AnyPrecOptions options(const Case& c) {
  AnyPrecOptions o;
  o.seed_bits = c.seed_bits;
  o.parent_bits = c.parent_bits;
  o.widths = c.widths;
  o.outlier_fraction = c.outliers;
  return o;
}

const std::vector<Case>& golden_cases() {
  static const std::vector<Case> cases = {
      {37, 200, 1, 2, 8, {}, 0.0, 0xe224bcf740e1f094ull},
      {37, 200, 2, 3, 8, {}, 0.005, 0xa76f8565c0fd82a9ull},
      {37, 200, 3, 4, 6, {}, 0.0, 0x9daf0463377845f2ull},
      {37, 200, 4, 4, 8, {}, 0.005, 0x8879f7e4acb6db67ull},
      {37, 200, 5, 3, 7, {3, 5, 7}, 0.0, 0x9a23b9e625a046aaull},
      {37, 200, 6, 5, 8, {}, 0.005, 0x2f90f75624eec351ull},
      {23, 1536, 7, 3, 8, {}, 0.005, 0x6e691b1542a30c39ull},
      {12, 4096, 8, 4, 8, {4, 8}, 0.0, 0xa552054b4162a129ull},
  };
  return cases;
}

TEST(AnyPrecRow, CpuQuantizerMatchesRecordedChecksums) {
  for (const Case& c : golden_cases()) {
    const Input in = make_input(c.n, c.k, c.seed);
    const AnyPrecQuantized q = anyprec_quantize(in.w.data(), in.s.data(), c.n, c.k, options(c));
    std::printf("case %lldx%lld seed %u: 0x%016llxull\n", static_cast<long long>(c.n), static_cast<long long>(c.k),
                c.seed, static_cast<unsigned long long>(checksum(q)));
    EXPECT_EQ(checksum(q), c.golden) << c.n << "x" << c.k << " input seed " << c.seed << " bits " << c.seed_bits
                                     << ".." << c.parent_bits;
  }
}

// The GPU splits each row's searches over a warp's lanes and combines their first minima; the same partition emulated
// on the CPU must not move a single bit.
TEST(AnyPrecRow, WarpPartitionOfTheSearchesChangesNothing) {
  for (const Case& c : golden_cases()) {
    const Input in = make_input(c.n, c.k, c.seed);
    const AnyPrecQuantized q = anyprec_quantize_emulating_warp(in.w.data(), in.s.data(), c.n, c.k, options(c));
    EXPECT_EQ(checksum(q), c.golden) << c.n << "x" << c.k << " input seed " << c.seed;
  }
}

TEST(AnyPrecRow, KMeansMatchesRecordedChecksums) {
  std::mt19937 rng(11);
  std::student_t_distribution<float> heavy(3.0f);
  std::exponential_distribution<double> e(1.0);
  uint64_t h = 14695981039346656037ull;
  for (int trial = 0; trial < 48; ++trial) {
    const int64_t m = trial < 12 ? 1 + trial : 1 + static_cast<int64_t>(rng() % 900);
    const int K = 1 << (1 + trial % 7);
    std::vector<float> x(static_cast<size_t>(m));
    std::vector<double> w(static_cast<size_t>(m));
    for (auto& v : x) v = trial % 3 == 0 ? std::round(heavy(rng) * 3) : heavy(rng);
    for (auto& v : w) v = e(rng) * e(rng) + 1e-12;
    std::sort(x.begin(), x.end());
    for (bool exact : {false, true}) {
      if (exact && K > 64) continue;
      const KMeans1D km = weighted_kmeans_1d(x.data(), w.data(), m, K, 150, exact);
      h = fnv1a(h, km.start);
      h = fnv1a(h, km.centroids);
      h = fnv1a(h, km.objective);
      h = fnv1a(h, &km.iterations, sizeof km.iterations);
    }
  }
  std::printf("kmeans: 0x%016llxull\n", static_cast<unsigned long long>(h));
  EXPECT_EQ(h, 0xe55fca62741c59b9ull);
}


#ifdef LOWBIT_WITH_CUDA


AnyPrecQuantized quantize_on_gpu(const Input& in, int64_t n, int64_t k, const AnyPrecOptions& o) {
  const cuda::DeviceBuffer<float> w(in.w), s(in.s);
  return cuda::anyprec_quantize_gpu(w.get(), s.get(), n, k, o, nullptr);
}

template <typename T>
void expect_same(const std::vector<T>& gpu, const std::vector<T>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t differ = 0, first = gpu.size();
  for (size_t i = 0; i < gpu.size(); ++i)
    if (gpu[i] != cpu[i]) {
      ++differ;
      first = std::min(first, i);
    }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << gpu.size() << " differ, first at " << first << " (gpu "
                        << +gpu[first < gpu.size() ? first : 0] << ", cpu " << +cpu[first < cpu.size() ? first : 0]
                        << ")";
}

void expect_same(const AnyPrecQuantized& gpu, const AnyPrecQuantized& cpu, const std::string& what) {
  EXPECT_EQ(gpu.n, cpu.n) << what;
  EXPECT_EQ(gpu.k, cpu.k) << what;
  EXPECT_EQ(gpu.planes, cpu.planes) << what;
  EXPECT_EQ(gpu.widths, cpu.widths) << what;
  expect_same(gpu.codes, cpu.codes, what + " codes");
  ASSERT_EQ(gpu.luts.size(), cpu.luts.size()) << what;
  for (const auto& [b, lut] : cpu.luts) {
    ASSERT_TRUE(gpu.luts.count(b)) << what << " width " << b;
    expect_same(gpu.luts.at(b), lut, what + " lut" + std::to_string(b));
  }
  expect_same(gpu.outlier_rowptr, cpu.outlier_rowptr, what + " outlier_rowptr");
  expect_same(gpu.outlier_col, cpu.outlier_col, what + " outlier_col");
  expect_same(gpu.outlier_val, cpu.outlier_val, what + " outlier_val");
}

TEST(AnyPrecGpu, EqualsTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t n, k;
  };
  struct Bits {
    int seed, parent;
  };
  uint32_t input_seed = 100;
  for (const Shape sh : {Shape{37, 200}, Shape{576, 1536}, Shape{1536, 576}})
    for (const Bits bits : {Bits{2, 8}, Bits{3, 8}, Bits{4, 6}, Bits{4, 8}})
      for (double outliers : {0.0, 0.005}) {
        const Input in = make_input(sh.n, sh.k, ++input_seed);
        AnyPrecOptions o;
        o.seed_bits = bits.seed;
        o.parent_bits = bits.parent;
        o.outlier_fraction = outliers;
        const std::string what = std::to_string(sh.n) + "x" + std::to_string(sh.k) + " bits " +
                                 std::to_string(bits.seed) + ".." + std::to_string(bits.parent) + " outliers " +
                                 std::to_string(outliers);
        expect_same(quantize_on_gpu(in, sh.n, sh.k, o), anyprec_quantize(in.w.data(), in.s.data(), sh.n, sh.k, o),
                    what);
      }
  // The recorded cases too: 5 seed bits (quantile seed), served-width subsets, k = 4096.
  for (const Case& c : golden_cases()) {
    const Input in = make_input(c.n, c.k, c.seed);
    EXPECT_EQ(checksum(quantize_on_gpu(in, c.n, c.k, options(c))), c.golden) << c.n << "x" << c.k << " seed " << c.seed;
  }
}

// Options are checked on the host before any device work (null pointers are never touched); bad values on the device
// are reported as the CPU reports them.
TEST(AnyPrecGpu, RefusesWhatTheCpuRefuses) {
  AnyPrecOptions bad_seed;
  bad_seed.seed_bits = 1;
  EXPECT_THROW(cuda::anyprec_quantize_gpu(nullptr, nullptr, 4, 64, bad_seed, nullptr), Error);
  AnyPrecOptions no_parent;
  no_parent.widths = {3, 4};
  EXPECT_THROW(cuda::anyprec_quantize_gpu(nullptr, nullptr, 4, 64, no_parent, nullptr), Error);
  SKIP_WITHOUT_GPU();
  for (int which = 0; which < 2; ++which) {
    Input in = make_input(5, 64, 9);
    if (which == 0) in.w[77] = NAN;
    else in.s[130] = -1.0f;
    std::string cpu_msg, gpu_msg;
    try {
      anyprec_quantize(in.w.data(), in.s.data(), 5, 64, AnyPrecOptions{});
    } catch (const Error& e) {
      cpu_msg = e.what();
    }
    try {
      quantize_on_gpu(in, 5, 64, AnyPrecOptions{});
    } catch (const Error& e) {
      gpu_msg = e.what();
    }
    EXPECT_FALSE(cpu_msg.empty());
    EXPECT_EQ(gpu_msg, cpu_msg);
  }
}

TEST(AnyPrecGpu, LlamaSizedLinearTiming) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 4096, k = 4096;
  const Input in = make_input(n, k, 42);
  AnyPrecOptions o;   // 3..8 bits, the CLI's default
  o.outlier_fraction = 0.005;
  const cuda::DeviceBuffer<float> w(in.w), s(in.s);
  auto t0 = std::chrono::steady_clock::now();
  const AnyPrecQuantized g = cuda::anyprec_quantize_gpu(w.get(), s.get(), n, k, o, nullptr);
  const double gpu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  const AnyPrecQuantized c = anyprec_quantize(in.w.data(), in.s.data(), n, k, o);
  const double cpu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("anyprec 3..8 bits + 0.5%% outliers, 4096 x 4096 on %s: GPU %.3f s, CPU %.3f s (%.1fx)\n",
              cuda::device_name().c_str(), gpu_s, cpu_s, cpu_s / gpu_s);
  expect_same(g, c, "4096x4096");
}

#endif  // LOWBIT_WITH_CUDA

}  // namespace
}  // namespace lowbit
