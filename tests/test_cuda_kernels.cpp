// The CUDA kernels against their CPU reference twins on the same packed bytes: the any-precision bitplane GEMV
// (every width 2..8 from one parent, batch 1..8, outliers fused or as a SpMV), the mixed24a GEMV, the uniform GEMV, the
// dequantize kernels (bit-exact), and the large-batch path (dequantize + cuBLAS). Outputs are poisoned with NaN
// before every launch, so an element a kernel fails to write fails the test. Without a GPU every test skips and
// says why.
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LOWBIT_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "core/half.h"
#include "core/knobs.h"
#include "backend_cuda/mixed24a/cusparse_outliers.h"
#include "backend_cuda/ops/gpu_ops.h"
#include "backend_cuda/anyprec/int8_tables.h"
#include "backend_cuda/dispatch/packed.h"
#include "backend_cuda/ops/sampling.h"
#include "backend_cuda/quik/quik.h"
#include "formats/format_table.h"
#include "formats/quik/layout.h"
#include "formats/uniform/layout.h"
#include "packed_fixtures.h"

namespace lowbit {
namespace {

// Error budgets, relative to sum_c |x_c| |w_rc| of each output (the scale of its rounding error):
constexpr double kGemvBudget = 1e-5;       // fp32 accumulation in another order than the fp64 reference
constexpr double kCublasBudget = 2e-3;     // x and W rounded to fp16 (2 x 2^-11) before an fp32-accumulated GEMM
constexpr double kFp16XBudget = 5e-4;      // x alone rounded to fp16 (2^-11 = 4.9e-4), W exact (fp16 LUT values)


// sum_c |x[t, c]| |w[r, c]| for every output, from the dense weights w [n, k].
std::vector<double> abs_scale(const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t n, int64_t k) {
  std::vector<double> s(static_cast<size_t>(m * n));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t r = 0; r < n; ++r) {
      double a = 0;
      for (int64_t c = 0; c < k; ++c) a += std::fabs(static_cast<double>(x[static_cast<size_t>(t * k + c)]) * w[static_cast<size_t>(r * k + c)]);
      s[static_cast<size_t>(t * n + r)] = a;
    }
  return s;
}

// Every output within its named rounding budget of a reference: |got - ref| <= bound + kGemvBudget * scale (the paths
// that round x to int8 pieces, against the format's own reference); the first 3 misses are reported.
void expect_within_rounding(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& bound,
                            const std::vector<double>& scale, const std::string& what, const std::string& ref_name) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= bound[i] + kGemvBudget * scale[i]) && bad++ < 3)
      ADD_FAILURE() << what << " vs " << ref_name << ": output " << i << " got " << got[i] << " want " << ref[i]
                    << " (rounding budget " << bound[i] << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

// Runs f(x_dev, y_dev) with y poisoned (NaN), returns y.
template <typename F>
std::vector<float> run_poisoned(const std::vector<float>& x, int64_t ysize, F f) {
  cuda::DeviceBuffer<float> xd(x), yd(static_cast<size_t>(ysize));
  LOWBIT_CUDA_CHECK(cudaMemset(yd.get(), 0xFF, yd.bytes()));
  f(xd.get(), yd.get());
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  return yd.download();
}

// y of packed_matmul (the runtime's kernel choice) on w at `bits` for x [m, k], y poisoned first, the stream synced.
std::vector<float> run_packed(const cuda::DevicePackedWeight& w, int bits, const std::vector<float>& x, int64_t m,
                              cuda::GemmContext& ctx) {
  return run_poisoned(x, m * w.n(), [&](const float* xd, float* yd) {
    cuda::packed_matmul(w, bits, xd, m, yd, ctx);
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  });
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& scale,
                  double budget, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]), lim = budget * scale[i] + 1e-30;
    worst = std::max(worst, err / (scale[i] + 1e-30));
    if (!(err <= lim) && bad++ < 3)   // NaN (unwritten) fails here too
      ADD_FAILURE() << what << ": output " << i << " got " << got[i] << " want " << want[i] << " (budget " << lim << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " outputs outside the budget";
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

struct Shape {
  int64_t n, k;
};

// One test per shape (CudaKernels/AnyPrecGemvSweep.MatchesCpuTwinEveryWidthAndBatch/i), so that a sanitizer run can take
// the shapes a few at a time.
// k: one word, not a multiple of 32 / 256 / 1024, a short last tile, a 28672-wide input; n: 1 and 28672.
// k = 4200: 132 words, a multiple of 4 (the register-table kernel's 16-byte loads) ending in a part group of 16;
// n = 8192: 512 blocks of 16 rows, the register-table kernel's compact form on a 132-SM GPU.
// The streamed kernel (k a multiple of 128, >= 2048): 64x4096; 17x8320 (65 words, 17 groups: the CTA's warps
// take 5 / 4 / 4 / 4 groups, two tiles, the second of one row); 9001x2432 (563 tiles, more than one wave of
// persistent CTAs on an H100 or H200: CTAs loop over several tiles; a part last group and a part last tile).
constexpr Shape kAnyPrecSweepShapes[] = {{1, 32},     {5, 1100},   {33, 2348}, {64, 4096},  {37, 4200},
                                         {3, 28672 + 37}, {28672, 96}, {8192, 256}, {17, 8320}, {9001, 2432}};
class AnyPrecGemvSweep : public ::testing::TestWithParam<int> {};
TEST_P(AnyPrecGemvSweep, MatchesCpuTwinEveryWidthAndBatch) {
  SKIP_WITHOUT_GPU();
  const Shape sh = kAnyPrecSweepShapes[GetParam()];
  uint32_t seed = 1 + 1000 * static_cast<uint32_t>(GetParam());
  for (bool outliers : {false, true}) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const AnyPrecQuantized q = test::random_anyprec(sh.n, sh.k, outliers, seed++);
    const PackedWeight pw = pack_anyprec(q, storage);
    validate_packed(pw, "t");
    const auto cpu = make_packed_linear(pw, nullptr, "t");
    const cuda::DevicePackedWeight dw(pw);   // one upload serves every width below: no reload between widths
    for (int bits = 2; bits <= 8; ++bits) {
      std::vector<float> wd(static_cast<size_t>(sh.n * sh.k));
      q.dequantize(bits, wd.data());
      for (int m : {1, 2, 3, 4, 5, 6, 7, 8}) {
        if (sh.n * sh.k > 1000000 && m != 1 && m != 2 && m != 8) continue;   // the wide shapes: the ends of the batch range
        const std::vector<float> x = test::random_x(m, sh.k, seed++);
        std::vector<float> want(static_cast<size_t>(m * sh.n));
        cpu->forward_ref(x.data(), m, want.data(), bits);
        const std::vector<double> scale = abs_scale(x, wd, m, sh.n, sh.k);
        // The CUDA-core path, the tensor-core path splitting x in its loop, and the tensor-core path reading
        // x pre-split into fragment order (scratch poisoned first: every fragment it reads must be written).
        cuda::DeviceBuffer<uint8_t> xfrag(cuda::anyprec_xfrag_bytes(sh.k));
        // And, at 2..4 bits, the tensor-core kernel with register tables (pre-split x in its own slab order), plain
        // and streamed; at 5..8 bits the streamed shared-table kernel.
        for (const auto& [path, presplit] : std::vector<std::pair<cuda::GemvPath, bool>>{
                 {cuda::GemvPath::Scalar, false}, {cuda::GemvPath::TensorCore, false}, {cuda::GemvPath::TensorCore, true},
                 {cuda::GemvPath::TensorCoreRegisterLut, true}, {cuda::GemvPath::TensorCoreRegisterLutStream, true},
                 {cuda::GemvPath::TensorCoreSharedLutStream, true}})
          for (cuda::OutlierMode mode : {cuda::OutlierMode::Fused, cuda::OutlierMode::SpMV}) {
            if (!outliers && mode == cuda::OutlierMode::SpMV) continue;
            if (cuda::is_register_table(path) && bits > 4) continue;
            if (cuda::is_streamed(path) && !cuda::anyprec_stream_fits(sh.n, sh.k, m)) continue;
            if (path == cuda::GemvPath::TensorCoreSharedLutStream && (bits < 5 || !cuda::anyprec_lut_stream_fits(sh.n, sh.k, m))) continue;
            if (presplit) LOWBIT_CUDA_CHECK(cudaMemset(xfrag.get(), 0xFF, xfrag.bytes()));
            const auto got = run_poisoned(x, m * sh.n, [&](const float* xd, float* yd) {
              cuda::anyprec_gemv(dw.anyprec(), bits, xd, m, yd, nullptr, mode, path, presplit ? xfrag.get() : nullptr);
            });
            const std::string kind = path == cuda::GemvPath::Scalar                      ? "scalar "
                                     : path == cuda::GemvPath::TensorCoreRegisterLut       ? "tensor-core register tables "
                                     : path == cuda::GemvPath::TensorCoreRegisterLutStream ? "tensor-core register tables streamed "
                                     : path == cuda::GemvPath::TensorCoreSharedLutStream   ? "tensor-core shared tables streamed "
                                     : presplit                                            ? "tensor-core pre-split "
                                                                                           : "tensor-core ";
            expect_close(got, want, scale, kGemvBudget,
                         "anyprec " + kind +
                             std::to_string(sh.n) + "x" + std::to_string(sh.k) + " b" + std::to_string(bits) + " m" +
                             std::to_string(m) + (outliers ? (mode == cuda::OutlierMode::Fused ? " fused" : " spmv") : ""));
          }
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(CudaKernels, AnyPrecGemvSweep, ::testing::Range(0, static_cast<int>(std::size(kAnyPrecSweepShapes))));

// The int8 GEMV (TensorCoreInt8LutStream: int8 centroids under a row scale, x as two int8 pieces under a column scale,
// int8 mma with int32 sums) against two references on the same packed bytes:
//   - its CPU twin: the same int8 tables and pieces (int8_tables.h, the same float operations) summed in fp64, and
//     the outliers corrected against the int8 centroid with the fp32 x; budget kGemvBudget (only the fp32 scaling and
//     the sum of the warps' partials differ);
//   - the format's own reference (fp16 centroids, fp32 x), within the named budget of the two roundings: per output
//     sum_c |x_c| sigma_r / 2 (a centroid is off by at most half its row's int8 step; at 4 bits, two pieces, sigma_r /
//     508) + sum_c |w8_rc| s / 508 (an activation by at most half the low piece's step), plus kGemvBudget.
// The tables derived on the device are byte-for-byte the host's. Shapes: 64x4096 (four tiles, eight warps per CTA),
// 17x8320 (65 words: a part last group; 17 rows: a part tile), 9001x2432 (four warps per CTA, more tiles than one wave
// of persistent CTAs), 40x28672, 33x2048 (four groups: four warps); every width 2..4, batches 1..8 (the stage forms
// M = 1, 2, 4, 8), with and without ~1.5% outliers; the SpMV mode runs fused too.
// One test per shape, as AnyPrecGemvSweep.
constexpr Shape kInt8SweepShapes[] = {{64, 4096}, {17, 8320}, {9001, 2432}, {40, 28672}, {33, 2048}};
class AnyPrecInt8GemvSweep : public ::testing::TestWithParam<int> {};
TEST_P(AnyPrecInt8GemvSweep, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const Shape sh = kInt8SweepShapes[GetParam()];
  uint32_t seed = 500 + 1000 * static_cast<uint32_t>(GetParam());
  for (bool outliers : {false, true}) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const AnyPrecQuantized q = test::random_anyprec(sh.n, sh.k, outliers, seed++);
    const PackedWeight pw = pack_anyprec(q, storage);
    const auto cpu = make_packed_linear(pw, nullptr, "t");
    const cuda::DevicePackedWeight dw(pw);
    const int64_t n16 = (sh.n + 15) / 16 * 16;
    for (int bits = 2; bits <= 4; ++bits) {
      const int E = 1 << bits;
      // Host tables and their device twins.
      // 4 bits: two pieces per centroid (i8_table_row2), tl the second.
      std::vector<int8_t> tq(static_cast<size_t>(n16 * E), 0), tl(tq.size(), 0);
      std::vector<float> sig(static_cast<size_t>(n16), 0.0f);
      for (int64_t r = 0; r < sh.n; ++r) {
        std::vector<float> c(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) c[static_cast<size_t>(e)] = f16_to_f32(q.luts.at(bits)[static_cast<size_t>(r * E + e)]);
        sig[static_cast<size_t>(r)] = bits == 4 ? cuda::i8_table_row2(c.data(), E, tq.data() + r * E, tl.data() + r * E)
                                                : cuda::i8_table_row(c.data(), E, tq.data() + r * E);
      }
      std::vector<int8_t> dq(tq.size());
      std::vector<float> dsig(sig.size());
      LOWBIT_CUDA_CHECK(cudaMemcpy(dq.data(), dw.anyprec().lut8[bits], dq.size(), cudaMemcpyDeviceToHost));
      LOWBIT_CUDA_CHECK(cudaMemcpy(dsig.data(), dw.anyprec().lut8_scale[bits], dsig.size() * 4, cudaMemcpyDeviceToHost));
      // 4 bits: stored in i8_split16's form (the twin below computes with the plain values tq / tl).
      auto split = [&](const std::vector<int8_t>& t) {
        if (bits != 4) return t;
        std::vector<int8_t> sp(t.size());
        for (size_t r = 0; r < t.size(); r += 16) cuda::i8_split16(t.data() + r, sp.data() + r);
        return sp;
      };
      ASSERT_EQ(dq, split(tq)) << "int8 tables, " << bits << " bits";
      if (bits == 4) {
        LOWBIT_CUDA_CHECK(cudaMemcpy(dq.data(), dw.anyprec().lut8_lo4, dq.size(), cudaMemcpyDeviceToHost));
        ASSERT_EQ(dq, split(tl)) << "int8 tables' second pieces, 4 bits";
      }
      const double centroid_step = bits == 4 ? 1.0 / 508 : 0.5;   // the centroid rounding bound, in units of sigma
      ASSERT_EQ(0, std::memcmp(dsig.data(), sig.data(), sig.size() * 4)) << "int8 table scales, " << bits << " bits";
      // The int8 view of the dense weights (outliers keep their fp16 values) and of the int8 centroids alone.
      std::vector<float> w8(static_cast<size_t>(sh.n * sh.k)), wd(w8.size());
      q.dequantize(bits, wd.data());
      for (int64_t r = 0; r < sh.n; ++r)
        for (int64_t c = 0; c < sh.k; ++c) {
          const int code = q.codes[static_cast<size_t>(r * sh.k + c)] >> (q.planes - bits);
          const size_t t = static_cast<size_t>(r * E + code);
          w8[static_cast<size_t>(r * sh.k + c)] =
              static_cast<float>(sig[static_cast<size_t>(r)] * (tq[t] + (bits == 4 ? tl[t] / static_cast<double>(cuda::kI8LoSteps) : 0.0)));
        }
      for (int m : {1, 2, 3, 5, 8}) {
        if (sh.n * sh.k > 1000000 && m != 1 && m != 8) continue;   // the large shapes: the ends of the batch range
        const std::vector<float> x = test::random_x(m, sh.k, seed++);
        std::vector<float> want(static_cast<size_t>(m * sh.n)), ref(want.size());
        std::vector<double> bound(want.size());
        cpu->forward_ref(x.data(), m, ref.data(), bits);
        for (int mm = 0; mm < m; ++mm) {
          const float* xr = x.data() + mm * sh.k;
          float mx = 0.0f;
          for (int64_t c = 0; c < sh.k; ++c) mx = cuda::i8_absmax_step(mx, xr[c]);
          const float s = mx / cuda::kI8Max;
          std::vector<double> xq(static_cast<size_t>(sh.k));
          for (int64_t c = 0; c < sh.k; ++c) {
            int8_t hi, lo;
            cuda::i8_x_pieces(xr[c], s, hi, lo);
            xq[static_cast<size_t>(c)] = static_cast<double>(s) * (hi + lo / static_cast<double>(cuda::kI8LoSteps));
          }
          for (int64_t r = 0; r < sh.n; ++r) {
            double acc = 0, b = 0;
            for (int64_t c = 0; c < sh.k; ++c) {
              const size_t i = static_cast<size_t>(r * sh.k + c);
              acc += static_cast<double>(w8[i]) * xq[static_cast<size_t>(c)];
              b += std::fabs(static_cast<double>(xr[c])) * sig[static_cast<size_t>(r)] * (centroid_step + 1e-5) +
                   std::fabs(static_cast<double>(w8[i])) * s / 508.0;
            }
            if (outliers)
              for (int32_t e = q.outlier_rowptr[static_cast<size_t>(r)]; e < q.outlier_rowptr[static_cast<size_t>(r) + 1]; ++e) {
                const int64_t c = q.outlier_col[static_cast<size_t>(e)];
                const size_t i = static_cast<size_t>(r * sh.k + c);
                // The twin: the dense sum used the int8 centroid with the pieces; the correction swaps it for the fp16
                // value with fp32 x (as the kernel's epilogue).
                acc += static_cast<double>(f16_to_f32(q.outlier_val[static_cast<size_t>(e)]) - w8[i]) * xr[c];
              }
            want[static_cast<size_t>(mm * sh.n + r)] = static_cast<float>(acc);
            bound[static_cast<size_t>(mm * sh.n + r)] = b;
          }
        }
        const std::vector<double> scale = abs_scale(x, wd, m, sh.n, sh.k);
        cuda::DeviceBuffer<uint8_t> xfrag(cuda::anyprec_xfrag_bytes(sh.k));
        ASSERT_GE(xfrag.bytes(), cuda::anyprec_i8_x_bytes(sh.k, m));
        for (cuda::OutlierMode mode : {cuda::OutlierMode::Fused, cuda::OutlierMode::SpMV}) {
          if (!outliers && mode == cuda::OutlierMode::SpMV) continue;
          LOWBIT_CUDA_CHECK(cudaMemset(xfrag.get(), 0xFF, xfrag.bytes()));
          const auto got = run_poisoned(x, m * sh.n, [&](const float* xd, float* yd) {
            cuda::anyprec_gemv(dw.anyprec(), bits, xd, m, yd, nullptr, mode, cuda::GemvPath::TensorCoreInt8LutStream, xfrag.get());
          });
          const std::string what = "anyprec int8 " + std::to_string(sh.n) + "x" + std::to_string(sh.k) + " b" +
                                   std::to_string(bits) + " m" + std::to_string(m) + (outliers ? " outliers" : "");
          expect_close(got, want, scale, kGemvBudget, what + " vs twin");
          expect_within_rounding(got, ref, bound, scale, what, "fp16-LUT reference");
        }
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(CudaKernels, AnyPrecInt8GemvSweep, ::testing::Range(0, static_cast<int>(std::size(kInt8SweepShapes))));

// The rows' max |x| that the kernels producing x hand the int8 GEMV (packed_matmul's x_max): RMSNorm's and SwiGLU's
// (atomic, into a slot the RMSNorm zeroes) are exactly the max of what they wrote, their outputs unchanged; the GEMV
// given them writes the same activation bytes and outputs, bit for bit, as when its x kernel reduces the rows itself.
// k = 2048, 4224 (a part last tile), 8192; batch 1, 3, 8; 3 bits with outliers.
TEST(CudaKernels, ProducerRowMaximaAreExactAndChangeNothing) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 700;
  auto host_max = [](const std::vector<float>& v, int m, int64_t k) {
    std::vector<float> mx(static_cast<size_t>(m), 0.0f);
    for (int r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) mx[static_cast<size_t>(r)] = cuda::i8_absmax_step(mx[static_cast<size_t>(r)], v[static_cast<size_t>(r * k + c)]);
    return mx;
  };
  for (const int64_t k : {2048, 4224, 8192}) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const int64_t n = 40;
    const AnyPrecQuantized q = test::random_anyprec(n, k, true, seed++);
    const cuda::DevicePackedWeight dw(pack_anyprec(q, storage));
    ASSERT_NE(dw.anyprec().rowptr, nullptr);
    ASSERT_TRUE(cuda::rmsnorm_writes_xmax(static_cast<int>(k)));
    cuda::DeviceBuffer<uint8_t> xq(cuda::anyprec_xfrag_bytes(k));
    for (const int m : {1, 3, 8}) {
      const std::string what = "k " + std::to_string(k) + " batch " + std::to_string(m);
      cuda::DeviceBuffer<float> slots(16);
      LOWBIT_CUDA_CHECK(cudaMemset(slots.get(), 0x7F, slots.bytes()));   // garbage the kernels must overwrite / zero
      // RMSNorm: its max into slot 0.., zeroing slot 8..
      const std::vector<float> x = test::random_x(m, k, seed++), d = test::random_x(m, k, seed++), w = test::random_x(1, k, seed++);
      cuda::DeviceBuffer<float> x1(x), x2(x), dd(d), wd(w), y1(x.size()), y2(x.size());
      cuda::rmsnorm(x1.get(), dd.get(), wd.get(), y1.get(), nullptr, m, static_cast<int>(k), 1e-5f, nullptr, slots.get(), slots.get() + 8);
      cuda::rmsnorm(x2.get(), dd.get(), wd.get(), y2.get(), nullptr, m, static_cast<int>(k), 1e-5f, nullptr);
      LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> yv = y1.download(), sv = slots.download();
      EXPECT_EQ(yv, y2.download()) << what << " rmsnorm y";
      EXPECT_EQ(x1.download(), x2.download()) << what << " rmsnorm residual";
      const std::vector<float> want = host_max(yv, m, k);
      for (int r = 0; r < m; ++r) {
        EXPECT_EQ(sv[static_cast<size_t>(r)], want[static_cast<size_t>(r)]) << what << " rmsnorm max, row " << r;
        EXPECT_EQ(sv[static_cast<size_t>(8 + r)], 0.0f) << what << " zeroed slot, row " << r;
      }
      auto gemv = [&](const float* xd, const float* xmax, std::vector<uint8_t>& pieces) {
        cuda::DeviceBuffer<float> yd(static_cast<size_t>(m * n));
        LOWBIT_CUDA_CHECK(cudaMemset(yd.get(), 0xFF, yd.bytes()));
        LOWBIT_CUDA_CHECK(cudaMemset(xq.get(), 0xAB, xq.bytes()));
        cuda::anyprec_gemv_i8(dw.anyprec(), 3, xd, m, yd.get(), nullptr, true, xq.get(), xmax);
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        pieces = xq.download();
        pieces.resize(cuda::anyprec_i8_x_bytes(k, m));
        return yd.download();
      };
      std::vector<uint8_t> p_own, p_given;
      const auto own = gemv(y1.get(), nullptr, p_own), given = gemv(y1.get(), slots.get(), p_given);
      EXPECT_EQ(own, given) << what << " GEMV outputs from rmsnorm's max";
      EXPECT_EQ(p_own, p_given) << what << " activation pieces from rmsnorm's max";
      EXPECT_TRUE(std::all_of(own.begin(), own.end(), [](float v) { return std::isfinite(v); })) << what;
      // SwiGLU: its max atomically into the slot zeroed above.
      const std::vector<float> gu = test::random_x(m, 2 * k, seed++);
      cuda::DeviceBuffer<float> gud(gu), h1(static_cast<size_t>(m * k)), h2(static_cast<size_t>(m * k));
      cuda::swiglu_rows(gud.get(), gud.get() + k, 2 * k, h1.get(), m, k, nullptr, reinterpret_cast<unsigned*>(slots.get() + 8));
      cuda::swiglu_rows(gud.get(), gud.get() + k, 2 * k, h2.get(), m, k, nullptr);
      LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> hv = h1.download(), sv2 = slots.download();
      EXPECT_EQ(hv, h2.download()) << what << " SwiGLU values";
      const std::vector<float> want2 = host_max(hv, m, k);
      for (int r = 0; r < m; ++r) EXPECT_EQ(sv2[static_cast<size_t>(8 + r)], want2[static_cast<size_t>(r)]) << what << " SwiGLU max, row " << r;
      const auto own2 = gemv(h1.get(), nullptr, p_own), given2 = gemv(h1.get(), slots.get() + 8, p_given);
      EXPECT_EQ(own2, given2) << what << " GEMV outputs from SwiGLU's max";
      EXPECT_EQ(p_own, p_given) << what << " activation pieces from SwiGLU's max";
    }
  }
}

// Prefill attention on tensor cores and the per-row kernel against a double-precision reference on the same fp32
// queries and fp16 cache: head dims 64 and 128, plain and grouped (GQA 4:1) heads, one and two sequences, prompts of
// 16, 70 and 300 tokens starting at position 0 or 37 (a prompt continued in chunks), full causal and a 50-key sliding
// window, contiguous and paged (16-position blocks, shuffled) caches, layer 1 of 2. Outputs start as NaN, so a row
// the kernel skips fails. Budget: 1e-4 absolute on unit-normal values (q and the weights keep ~22 bits as fp16 hi + lo;
// the per-row kernel is fp32 throughout), with scores spread over +-12 so the softmax is peaked.
TEST(CudaKernels, PrefillAttentionMatchesReference) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 4100;
  constexpr int kLayers = 2, kLayer = 1;
  int cases = 0;
  double worst_of[2] = {0, 0};   // tensor cores, per-row kernel
  for (const int hd : {64, 128})
    for (const auto [heads, kv_heads] : {std::pair{4, 4}, std::pair{8, 2}})
      for (const int seqs : {1, 2})
        for (const int n : {16, 70, 300})
          for (const int start : {0, 37})
            for (const int window : {0, 50})
              for (const bool paged : {false, true}) {
                if ((seqs == 2 || heads == 8) && n == 16 && start == 37) continue;   // keep the grid's size in check
                const std::string what = "hd " + std::to_string(hd) + " heads " + std::to_string(heads) + "/" +
                                         std::to_string(kv_heads) + " seqs " + std::to_string(seqs) + " n " + std::to_string(n) +
                                         " start " + std::to_string(start) + " window " + std::to_string(window) +
                                         (paged ? " paged" : " contiguous");
                const int kvd = kv_heads * hd, span = start + n, rows = seqs * n;
                std::mt19937 rng(seed++);
                std::normal_distribution<float> nd(0.0f, 1.0f);
                // Cache positions of every sequence: contiguous, block = capacity per sequence; paged, blocks of 16
                // handed out in a shuffled order.
                cuda::KvMap map;
                map.layers = kLayers;
                std::vector<int32_t> table;
                int blocks = seqs;
                if (paged) {
                  map.block = 16;
                  map.shift = 4;
                  map.max_blocks = (span + 15) / 16;
                  blocks = seqs * map.max_blocks;
                  table.resize(static_cast<size_t>(blocks));
                  std::iota(table.begin(), table.end(), 0);
                  std::shuffle(table.begin(), table.end(), rng);
                } else {
                  map.block = span;
                }
                auto row_of = [&](int b, int p) {
                  const int blk = paged ? table[static_cast<size_t>(b * map.max_blocks + p / 16)] : b;
                  return (static_cast<int64_t>(blk) * kLayers + kLayer) * map.block + (paged ? p % 16 : p);
                };
                const size_t cache_elems = static_cast<size_t>(blocks) * kLayers * map.block * kvd;
                std::vector<uint16_t> kc(cache_elems), vc(cache_elems);
                std::vector<double> kf(cache_elems), vf(cache_elems);
                for (size_t i = 0; i < cache_elems; ++i) {
                  kc[i] = f32_to_f16(nd(rng));
                  vc[i] = f32_to_f16(nd(rng));
                  kf[i] = f16_to_f32(kc[i]);
                  vf[i] = f16_to_f32(vc[i]);
                }
                std::vector<float> q(static_cast<size_t>(rows) * heads * hd);
                for (float& v : q) v = 1.5f * nd(rng);
                std::vector<int32_t> seq(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows));
                for (int r = 0; r < rows; ++r) {
                  seq[static_cast<size_t>(r)] = r / n;
                  pos[static_cast<size_t>(r)] = start + r % n;
                }
                // Reference in double.
                std::vector<double> want(q.size());
                for (int r = 0; r < rows; ++r)
                  for (int h = 0; h < heads; ++h) {
                    const int b = r / n, p = pos[static_cast<size_t>(r)], kvh = h / (heads / kv_heads);
                    const int first = window > 0 ? std::max(0, p - window + 1) : 0;
                    const float* qr = q.data() + (static_cast<size_t>(r) * heads + h) * hd;
                    std::vector<double> sc;
                    double mx = -1e300;
                    for (int key = first; key <= p; ++key) {
                      const double* kr = kf.data() + row_of(b, key) * kvd + static_cast<int64_t>(kvh) * hd;
                      double dot = 0;
                      for (int d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * kr[d];
                      sc.push_back(dot / std::sqrt(static_cast<double>(hd)));
                      mx = std::max(mx, sc.back());
                    }
                    double l = 0;
                    for (double& v : sc) l += (v = std::exp(v - mx));
                    double* o = want.data() + (static_cast<size_t>(r) * heads + h) * hd;
                    for (int key = first; key <= p; ++key) {
                      const double* vr = vf.data() + row_of(b, key) * kvd + static_cast<int64_t>(kvh) * hd;
                      for (int d = 0; d < hd; ++d) o[d] += sc[static_cast<size_t>(key - first)] / l * vr[d];
                    }
                  }
                cuda::DeviceBuffer<uint16_t> kd(kc), vd(vc);
                cuda::DeviceBuffer<float> qd(q), od(q.size()), scratch(static_cast<size_t>(rows) * heads * (hd + 2));
                cuda::DeviceBuffer<int32_t> sd(seq), pd(pos), td(paged ? table : std::vector<int32_t>{0});
                if (paged) map.table = td.get();
                const auto* kh = reinterpret_cast<const __half*>(kd.get());
                const auto* vh = reinterpret_cast<const __half*>(vd.get());
                for (const bool tc : {true, false}) {
                  LOWBIT_CUDA_CHECK(cudaMemset(od.get(), 0xFF, od.bytes()));
                  if (tc)
                    cuda::prefill_attention(qd.get(), sd.get(), pd.get(), seqs, n, heads, kv_heads, hd, kLayer, map, window, kh,
                                            vh, od.get(), nullptr);
                  else
                    cuda::attention(qd.get(), sd.get(), pd.get(), rows, heads, kv_heads, hd, kLayer, map, window, kh, vh,
                                    od.get(), 1, scratch.get(), false, nullptr);
                  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
                  const std::vector<float> got = od.download();
                  double worst = 0;
                  size_t at = 0;
                  for (size_t i = 0; i < got.size(); ++i) {
                    const double e = std::isfinite(got[i]) ? std::abs(got[i] - want[i]) : 1e30;
                    if (e > worst) worst = e, at = i;
                  }
                  worst_of[tc ? 0 : 1] = std::max(worst_of[tc ? 0 : 1], worst);
                  EXPECT_LE(worst, 1e-4) << what << (tc ? " tensor cores" : " per-row kernel") << ": element " << at
                                         << " " << got[at] << " vs " << want[at];
                }
                ++cases;
              }
  EXPECT_GT(cases, 150);
  std::printf("[ prefill attention ] max |out - reference| over %d cases: tensor cores %.2e, per-row kernel %.2e (budget 1e-4)\n",
              cases, worst_of[0], worst_of[1]);
}

// SwiGLU in the int8 GEMV's epilogue (a stacked [gate; up] weight): h and each row's max |h| bit-identical to the GEMV's
// 2 H outputs followed by swiglu_rows, poisoned outputs caught. Every width 2..4 with outliers, batch 1, 2, 5, 8, both CTA
// forms (n = 128: eight warps; n = 22016, H = 11008 as Llama-2-7B: four; n = 8192 at batch 8: eight on 2..3 bits).
TEST(CudaKernels, Int8GemvSwiGluEpilogueIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 820;
  for (const Shape& sh : {Shape{128, 2048}, Shape{22016, 4096}, Shape{8192, 8192}}) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const cuda::DevicePackedWeight dw(pack_anyprec(test::random_anyprec(sh.n, sh.k, true, seed++), storage));
    const int64_t H = sh.n / 2;
    cuda::DeviceBuffer<uint8_t> xq(cuda::anyprec_xfrag_bytes(sh.k));
    for (int bits = 2; bits <= 4; ++bits)
      for (const int m : {1, 2, 5, 8}) {
        const std::string what = std::to_string(sh.n) + "x" + std::to_string(sh.k) + " b" + std::to_string(bits) + " m" + std::to_string(m);
        const std::vector<float> x = test::random_x(m, sh.k, seed++);
        cuda::DeviceBuffer<float> xd(x), gu(static_cast<size_t>(m * sh.n)), h1(static_cast<size_t>(m * H)), h2(static_cast<size_t>(m * H));
        cuda::DeviceBuffer<unsigned> mx1(8), mx2(8);
        LOWBIT_CUDA_CHECK(cudaMemset(h1.get(), 0xFF, h1.bytes()));
        LOWBIT_CUDA_CHECK(cudaMemset(h2.get(), 0xFF, h2.bytes()));
        LOWBIT_CUDA_CHECK(cudaMemset(mx1.get(), 0, mx1.bytes()));
        LOWBIT_CUDA_CHECK(cudaMemset(mx2.get(), 0, mx2.bytes()));
        cuda::anyprec_gemv_i8(dw.anyprec(), bits, xd.get(), m, gu.get(), nullptr, true, xq.get());
        cuda::swiglu_rows(gu.get(), gu.get() + H, 2 * H, h1.get(), m, H, nullptr, mx1.get());
        cuda::anyprec_gemv_i8(dw.anyprec(), bits, xd.get(), m, h2.get(), nullptr, true, xq.get(), nullptr, mx2.get());
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> a = h1.download(), b = h2.download();
        EXPECT_EQ(a, b) << what;
        EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](float v) { return std::isfinite(v); })) << what;
        EXPECT_GT(*std::max_element(b.begin(), b.end()), 0.0f) << what;
        const std::vector<unsigned> ma = mx1.download(), mb = mx2.download();
        for (int r = 0; r < 8; ++r) EXPECT_EQ(ma[static_cast<size_t>(r)], mb[static_cast<size_t>(r)]) << what << " row max " << r;
      }
  }
}

// The int8 GEMV's CTA forms (4 or 8 warps per tile; gemv_balance_enabled picks 8 where the busiest warp then takes fewer
// items) give the same bits: its sums are integers, reduced over the warps as integers and scaled once; and so do both
// activation pieces in one mma and one mma each (i8_pack_mode 1 / 0). 12288x4096 (Llama-2-7B q/k/v: 768 tiles of 8
// groups) and 22016x4096 (gate/up, also with the SwiGLU epilogue's tile pairs), every width 2..4, batch 1, 2, 8,
// outliers fused; at least one case must change form, or the test proves nothing.
TEST(CudaKernels, Int8GemvCtaFormsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  const bool saved = cuda::gemv_balance_enabled();
  int changed = 0;
  uint32_t seed = 1300;
  for (const Shape& sh : {Shape{12288, 4096}, Shape{22016, 4096}}) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const cuda::DevicePackedWeight dw(pack_anyprec(test::random_anyprec(sh.n, sh.k, true, seed++), storage));
    cuda::DeviceBuffer<uint8_t> xq(cuda::anyprec_xfrag_bytes(sh.k));
    for (int bits = 2; bits <= 4; ++bits)
      for (const int m : {1, 2, 8})
        for (const bool sw : {false, true}) {
          if (sw && (sh.n != 22016 || bits == 4)) continue;   // the SwiGLU epilogue: gate/up at 2..3 bits
          const std::string what = std::to_string(sh.n) + "x" + std::to_string(sh.k) + " b" + std::to_string(bits) + " m" +
                                   std::to_string(m) + (sw ? " swiglu" : "");
          const std::vector<float> x = test::random_x(m, sh.k, seed++);
          const int64_t outs = m * (sw ? sh.n / 2 : sh.n);
          std::vector<float> got[2];
          int warps[2];
          for (int on = 0; on < 2; ++on) {
            cuda::set_gemv_balance(on == 1);
            warps[on] = cuda::anyprec_i8_cta_warps(dw.anyprec(), bits, m, true, sw);
            cuda::DeviceBuffer<unsigned> hmax(8);
            LOWBIT_CUDA_CHECK(cudaMemset(hmax.get(), 0, hmax.bytes()));
            got[on] = run_poisoned(x, outs, [&](const float* xd, float* yd) {
              cuda::anyprec_gemv_i8(dw.anyprec(), bits, xd, m, yd, nullptr, true, xq.get(), nullptr, sw ? hmax.get() : nullptr);
            });
          }
          cuda::set_gemv_balance(saved);
          changed += warps[0] != warps[1];
          EXPECT_TRUE(std::all_of(got[1].begin(), got[1].end(), [](float v) { return std::isfinite(v); })) << what;
          EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)))
              << what << ": " << warps[0] << " and " << warps[1] << " warps per CTA differ";
          for (const int pack : {0, 1}) {   // both activation pieces in one mma or one mma each (2..3 bits, batch 1..4)
            cuda::set_i8_pack_mode(pack);
            cuda::DeviceBuffer<unsigned> hmax(8);
            LOWBIT_CUDA_CHECK(cudaMemset(hmax.get(), 0, hmax.bytes()));
            const auto p = run_poisoned(x, outs, [&](const float* xd, float* yd) {
              cuda::anyprec_gemv_i8(dw.anyprec(), bits, xd, m, yd, nullptr, true, xq.get(), nullptr, sw ? hmax.get() : nullptr);
            });
            cuda::set_i8_pack_mode(-1);
            EXPECT_EQ(0, std::memcmp(p.data(), got[1].data(), p.size() * sizeof(float))) << what << ": pack mode " << pack << " differs";
          }
        }
  }
  EXPECT_GT(changed, 0) << "no case ran both CTA forms";
}

// q/k/v (or gate/up) stacked into one weight: its GEMV is, row for row, bit-identical to the GEMVs of its parts
// (every kernel computes a row from that row's planes, LUT and outliers alone), with outliers, at both kernel
// layouts (k = 1100: 35 words, one word per lane; k = 4096: 16-byte loads), every path Auto picks for batch 1 / 8.
TEST(CudaKernels, StackedAnyPrecRowsEqualTheirParts) {
  SKIP_WITHOUT_GPU();
  for (int64_t k : {1100, 4096}) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    std::vector<cuda::DevicePackedWeight> parts;
    const int64_t ns[] = {5, 33, 16};
    for (int i = 0; i < 3; ++i) parts.emplace_back(pack_anyprec(test::random_anyprec(ns[i], k, true, 900 + static_cast<uint32_t>(i)), storage));
    const auto stacked = cuda::DevicePackedWeight::concat_rows({&parts[0], &parts[1], &parts[2]});
    ASSERT_NE(stacked, nullptr);
    ASSERT_EQ(stacked->n(), 54);
    for (int bits : {3, 4, 8})
      for (int m : {1, 8}) {
        const std::vector<float> x = test::random_x(m, k, 77);
        cuda::DeviceBuffer<uint8_t> xfrag(cuda::anyprec_xfrag_bytes(k));
        const auto path = cuda::anyprec_auto_path(54, k, m, bits, true);
        const auto got = run_poisoned(x, m * 54, [&](const float* xd, float* yd) {
          cuda::anyprec_gemv(stacked->anyprec(), bits, xd, m, yd, nullptr, cuda::OutlierMode::Fused, path, xfrag.get());
        });
        int64_t row0 = 0;
        for (int i = 0; i < 3; ++i) {
          const auto part = run_poisoned(x, m * ns[i], [&](const float* xd, float* yd) {
            cuda::anyprec_gemv(parts[static_cast<size_t>(i)].anyprec(), bits, xd, m, yd, nullptr, cuda::OutlierMode::Fused,
                               cuda::anyprec_auto_path(ns[i], k, m, bits, true), xfrag.get());
          });
          for (int mm = 0; mm < m; ++mm)
            for (int64_t r = 0; r < ns[i]; ++r)
              ASSERT_EQ(got[static_cast<size_t>(mm * 54 + row0 + r)], part[static_cast<size_t>(mm * ns[i] + r)])
                  << "k " << k << " b" << bits << " m" << m << " part " << i << " row " << r;
          row0 += ns[i];
        }
      }
  }
  // Weights that cannot be stacked: another input width, other served widths, outliers in one only.
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const cuda::DevicePackedWeight a(pack_anyprec(test::random_anyprec(4, 64, false, 1), storage));
  const cuda::DevicePackedWeight b(pack_anyprec(test::random_anyprec(4, 96, false, 2), storage));
  const cuda::DevicePackedWeight c(pack_anyprec(test::random_codes(4, 64, 8, 0x118u, 3), storage));   // widths 3, 4, 8
  const cuda::DevicePackedWeight d(pack_anyprec(test::random_anyprec(4, 64, true, 4), storage));
  EXPECT_EQ(cuda::DevicePackedWeight::concat_rows({&a, &b}), nullptr);
  EXPECT_EQ(cuda::DevicePackedWeight::concat_rows({&a, &c}), nullptr);
  EXPECT_EQ(cuda::DevicePackedWeight::concat_rows({&a, &d}), nullptr);
  EXPECT_NE(cuda::DevicePackedWeight::concat_rows({&a, &a}), nullptr);
}

// Both GEMV paths (CUDA-core FMAs; tensor-core mma with x split into two fp16 halves) hold the fp32 budget.
// The streamed tensor-core kernel (k % 256 == 0, k >= 1024): 16x4096, 3x28672, 33x2304 (9 chunks: the warps take
// 3 / 2 / 2 / 2, a part last tile) and 9001x1280 (563 tiles: persistent CTAs loop over several on an H100 / H200).
TEST(CudaKernels, Mixed24aGemvMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const Shape shapes[] = {{1, 64}, {17, 576}, {40, 1600}, {16, 4096}, {3, 28672}, {28672, 128}, {33, 2304}, {9001, 1280}};
  uint32_t seed = 100;
  for (const Shape& sh : shapes)
    for (bool outliers : {false, true}) {
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const Mixed24AQuantized q = test::random_mixed24a(sh.n, sh.k, outliers, seed++);
      const PackedWeight pw = pack_mixed24a(q, storage);
      validate_packed(pw, "t");
      const cuda::DevicePackedWeight dw(pw);
      std::vector<float> wd(static_cast<size_t>(sh.n * sh.k));
      q.dequantize(wd.data());
      for (int m : {1, 2, 3, 4, 5, 6, 7, 8}) {
        const std::vector<float> x = test::random_x(m, sh.k, seed++);
        std::vector<float> want(static_cast<size_t>(m * sh.n));
        mixed24a_gemm_packed_ref(pw, x.data(), m, nullptr, want.data());
        const std::vector<double> scale = abs_scale(x, wd, m, sh.n, sh.k);
        cuda::DeviceBuffer<uint8_t> xfrag(cuda::mixed24a_xfrag_bytes(sh.k));
        for (const auto& [path, presplit] : std::vector<std::pair<cuda::GemvPath, bool>>{
                 {cuda::GemvPath::Scalar, false}, {cuda::GemvPath::TensorCore, false}, {cuda::GemvPath::TensorCore, true},
                 {cuda::GemvPath::TensorCoreStream, true}})
          for (cuda::OutlierMode mode : {cuda::OutlierMode::Fused, cuda::OutlierMode::SpMV}) {
            if (!outliers && mode == cuda::OutlierMode::SpMV) continue;
            if (path == cuda::GemvPath::TensorCoreStream && !cuda::mixed24a_stream_fits(sh.n, sh.k, m)) continue;
            if (presplit) LOWBIT_CUDA_CHECK(cudaMemset(xfrag.get(), 0xFF, xfrag.bytes()));
            const auto got = run_poisoned(x, m * sh.n, [&](const float* xd, float* yd) {
              cuda::mixed24a_gemv(dw.mixed24a(), xd, m, yd, nullptr, mode, path, presplit ? xfrag.get() : nullptr);
            });
            expect_close(got, want, scale, kGemvBudget,
                         "mixed24a " + std::string(path == cuda::GemvPath::Scalar             ? "scalar "
                                                   : path == cuda::GemvPath::TensorCoreStream ? "tensor-core streamed "
                                                   : presplit                                 ? "tensor-core pre-split "
                                                                                              : "tensor-core ") +
                             std::to_string(sh.n) + "x" + std::to_string(sh.k) + " m" + std::to_string(m) +
                             (outliers ? (mode == cuda::OutlierMode::Fused ? " fused" : " spmv") : ""));
          }
      }
    }
}

// A random uniform weight: codes, fp16 scales in [2^-10, 2^-6), zeros in [0, 2^bits) unless symmetric, and with
// act-order a g_idx from a random column order (groups contiguous in that order, as GPTQ's act-order stores them).
UniformQuantized uniform_weight(int64_t n, int64_t k, int bits, int64_t group, bool symmetric, bool act_order, uint32_t seed) {
  std::mt19937 rng(seed);
  UniformQuantized q;
  q.bits = bits;
  q.n = n;
  q.k = k;
  q.group_size = group > 0 ? std::min(group, k) : k;
  q.symmetric = symmetric;
  const int64_t G = q.groups();
  q.codes.resize(static_cast<size_t>(n * k));
  for (uint8_t& c : q.codes) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1u));
  q.scales.resize(static_cast<size_t>(n * G));
  for (uint16_t& sc : q.scales) sc = f32_to_f16(std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f, -10 + static_cast<int>(rng() % 4)));
  if (!symmetric) {
    q.zeros.resize(static_cast<size_t>(n * G));
    for (uint8_t& z : q.zeros) z = static_cast<uint8_t>(rng() & ((1u << bits) - 1u));
  }
  if (act_order) {
    std::vector<int64_t> order(static_cast<size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    q.g_idx.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) q.g_idx[static_cast<size_t>(order[static_cast<size_t>(j)])] = static_cast<int32_t>(j / q.group_size);
  }
  return q;
}

// The uniform GEMV (batch 1..8) against the format's reference forward on the same packed bytes, every width 2..8:
// the chunked form (k a multiple of 32; groups of 32 / 128 / a whole row, or g_idx) and the per-column form (k = 1100,
// 172, or groups of 48), symmetric and not, n of 1, a part CTA and several waves; through packed_matmul too.
TEST(CudaKernels, UniformGemvMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t n, k, group;
    bool symmetric, act_order;
  };
  const Case cases[] = {{1, 32, 32, false, false},      {5, 64, 0, true, false},      {33, 576, 128, false, false},
                        {17, 1100, 128, false, false},  {300, 172, 32, false, true},  {40, 1536, 48, true, false},
                        {64, 4096, 128, false, true},   {3, 11008, 128, false, false}, {2000, 256, 64, true, true},
                        // the tensor-core GEMV (k and groups multiples of 128, no g_idx): several tiles and CTAs
                        {300, 1024, 128, false, false}, {1000, 512, 0, false, false}, {70, 2048, 256, true, false},
                        {4100, 384, 128, false, false}};
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t st;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&st));
  {
    cuda::GemmContext ctx(st);
    uint32_t seed = 500;
    for (const Case& c : cases)
      for (int bits = 2; bits <= 8; ++bits) {
        const UniformQuantized q = uniform_weight(c.n, c.k, bits, c.group, c.symmetric, c.act_order, seed++);
        const PackedWeight pw = pack_uniform(q, storage);
        validate_packed(pw, "t");
        const cuda::DevicePackedWeight dw(pw);
        const auto ref = make_packed_linear(pw, nullptr, "t");
        std::vector<float> wd(static_cast<size_t>(c.n * c.k));
        q.dequantize(wd.data());
        const std::string what = "uniform w" + std::to_string(bits) + " " + std::to_string(c.n) + "x" + std::to_string(c.k) +
                                 " g" + std::to_string(c.group) + (c.symmetric ? " sym" : "") + (c.act_order ? " act-order" : "") +
                                 (cuda::uniform_gemv_tensor_core(dw.uniform()) ? " tensor-core"
                                  : cuda::uniform_gemv_chunked(dw.uniform()) ? " chunked" : " per-column");
        for (int m = 1; m <= 8; ++m) {
          if (m > 2 && m < 8 && bits != 4 && bits != 3) continue;   // every batch at 3 and 4 bits; 1, 2, 8 at the others
          const std::vector<float> x = test::random_x(m, c.k, seed++);
          std::vector<float> want(static_cast<size_t>(m * c.n));
          ref->forward_ref(x.data(), m, want.data(), 0);
          const std::vector<double> scale = abs_scale(x, wd, m, c.n, c.k);
          const auto got = run_poisoned(x, m * c.n, [&](const float* xd, float* yd) {
            cuda::uniform_gemv(dw.uniform(), xd, m, yd, nullptr);
          });
          expect_close(got, want, scale, kGemvBudget, what + " m" + std::to_string(m));
          if (m == 1 || m == 8) {
            const auto via = run_packed(dw, 0, x, m, ctx);
            EXPECT_EQ(via, got) << what << " m" << m << ": packed_matmul runs the same kernel";
          }
        }
      }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(st));
}

#ifdef LOWBIT_WITH_CUTLASS
constexpr bool kCutlassBuilt = true;
#else
constexpr bool kCutlassBuilt = false;
#endif

// QUIK on the GPU against its CPU twin quik_gemm_packed_ref, every activation form, the GEMV (m <= 8) and the GEMM,
// odd shapes, 0 to all columns as outliers: the integer sums bit for bit where they are exact (integer activations at
// every m; FP8 in the GEMV), y within the named budgets; packed_matmul runs the same kernels. Above batch 8 the
// integer and FP8 forms run the fused CUTLASS GEMM wherever n is a multiple of 4 on an sm_90 GPU (asserted), and the
// library GEMM + separate epilogue (LOWBIT_QUIK_FUSED=0, and the outliers summed in that epilogue) give the same sums
// bit for bit and y within budget.
TEST(CudaKernels, QuikMatchesIntegerReference) {
  SKIP_WITHOUT_GPU();
  // Hopper's FP8 tensor cores accumulate with fewer mantissa bits than fp32 between cuBLASLt's fp32 promotions (the
  // products themselves are exact: e4m3 x 4-bit code).
  constexpr double kFp8GemmBudget = 1e-4;
  struct Case {
    int64_t n, k, outliers;
  };
  const Case cases[] = {{1, 32, 0},      {7, 100, 3},   {64, 576, 36}, {40, 64, 64},
                        {300, 1536, 126}, {16, 4096, 0}, {9, 200, 199}, {520, 2080, 32}};
  struct Form {
    int wbits, abits;
    bool fp8;
  };
  const Form forms[] = {{4, 4, false}, {4, 8, false}, {8, 4, false}, {8, 8, false}, {4, 8, true}, {4, 16, false}, {8, 16, false}};
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t st;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&st));
  {
    cuda::GemmContext ctx(st);
    uint32_t seed = 900;
    for (const Case& c : cases)
      for (const Form& f : forms) {
        const QuikQuantized q = test::random_quik(c.n, c.k, f.wbits, f.abits, f.fp8, c.outliers, seed++);
        const PackedWeight pw = pack_quik(q, storage);
        validate_packed(pw, "t");
        const cuda::DevicePackedWeight dw(pw);
        std::vector<float> wd(static_cast<size_t>(c.n * c.k));
        q.dequantize(wd.data());
        const std::string what = "quik W" + std::to_string(f.wbits) + (f.fp8 ? "-FP8" : "A" + std::to_string(f.abits)) +
                                 " " + std::to_string(c.n) + "x" + std::to_string(c.k) + " outliers " +
                                 std::to_string(c.outliers);
        // The fused GEMM serves integer and FP8 forms with n a multiple of 4 and a base column, from 256 tokens (by
        // default; forced on at every GEMM batch below).
        const bool fusable = kCutlassBuilt && cuda::sm90a_available() && f.abits != 16 && c.n % 4 == 0 && c.outliers < c.k;
        EXPECT_EQ(cuda::quik_gemm_fused(dw.quik(), 300), fusable) << what << ": the fused GEMM at 300 tokens";
        EXPECT_FALSE(cuda::quik_gemm_fused(dw.quik(), 40)) << what << ": the library GEMM below 256 tokens";
        for (int64_t m : {1, 2, 5, 8, 9, 40, 300}) {
          if (m == 300 && c.n < 500) continue;   // the multi-tile batch, on the one large shape
          const bool gemm = m > 8;
          const bool exact = f.abits != 16 && (!f.fp8 || !gemm);
          const double budget = f.abits == 16 ? (gemm ? kFp16XBudget : kGemvBudget) : f.fp8 && gemm ? kFp8GemmBudget : kGemvBudget;
          const std::vector<float> x = test::random_x(m, c.k, seed++);
          std::vector<float> want(static_cast<size_t>(m * c.n));
          std::vector<int64_t> want_acc;
          quik_gemm_packed_ref(pw, x.data(), m, nullptr, want.data(), &want_acc);
          cuda::DeviceBuffer<int64_t> acc(static_cast<size_t>(m * c.n));
          LOWBIT_CUDA_CHECK(cudaMemset(acc.get(), 0xFF, acc.bytes()));
          const auto got = run_poisoned(x, m * c.n, [&](const float* xd, float* yd) {
            cuda::quik_matmul(dw.quik(), xd, m, yd, ctx, acc.get());
            LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
          });
          const std::string at = what + " m" + std::to_string(m);
          const std::vector<double> scale = abs_scale(x, wd, m, c.n, c.k);
          expect_close(got, want, scale, budget, at);
          if (exact) {
            const std::vector<int64_t> got_acc = acc.download();
            int bad_acc = 0;
            for (size_t i = 0; i < want_acc.size(); ++i) bad_acc += got_acc[i] != want_acc[i];
            EXPECT_EQ(bad_acc, 0) << at << ": integer sums that differ from the reference's";
          }
          const auto via = run_packed(dw, 0, x, m, ctx);
          EXPECT_EQ(via, got) << at << ": packed_matmul runs the same kernels";
          if (!gemm && f.abits != 16 && !f.fp8)   // both GEMV forms forced: the same integer sums, so the same y
            for (const int chunk : {16, 32}) {
              set_knob(Knob::QuikGemvChunk, chunk);
              LOWBIT_CUDA_CHECK(cudaMemset(acc.get(), 0xFF, acc.bytes()));
              const auto forced = run_poisoned(x, m * c.n, [&](const float* xd, float* yd) {
                cuda::quik_matmul(dw.quik(), xd, m, yd, ctx, acc.get());
                LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
              });
              reset_knob(Knob::QuikGemvChunk);
              EXPECT_EQ(forced, got) << at << ": the " << chunk << "-code GEMV";
              EXPECT_EQ(acc.download(), want_acc) << at << ": the " << chunk << "-code GEMV's integer sums";
            }
          if (gemm) {
            const auto fused = run_poisoned(x, m * c.n, [&](const float* xd, float* yd) {
              cuda::quik_gemm(dw.quik(), xd, m, yd, ctx, nullptr, cuda::OutlierPass::Epilogue);
              LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
            });
            expect_close(fused, want, scale, budget, at + " (outliers in the epilogue)");
            if (fusable)   // both GEMM forms forced: the same sums, y within budget
              for (int force : {0, 1}) {
                set_knob(Knob::QuikFused, force);
                EXPECT_EQ(cuda::quik_gemm_fused(dw.quik(), m), force == 1) << at;
                LOWBIT_CUDA_CHECK(cudaMemset(acc.get(), 0xFF, acc.bytes()));
                const auto forced = run_poisoned(x, m * c.n, [&](const float* xd, float* yd) {
                  cuda::quik_gemm(dw.quik(), xd, m, yd, ctx, acc.get());
                  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
                });
                reset_knob(Knob::QuikFused);
                const std::string form = force == 1 ? " (fused GEMM)" : " (library GEMM + epilogue)";
                expect_close(forced, want, scale, budget, at + form);
                if (exact) {
                  EXPECT_EQ(acc.download(), want_acc) << at << form << ": integer sums";
                }
              }
          }
        }
      }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(st));
}

// QUIK activations quantized by their producers (quik_rmsnorm_quantize, quik_swiglu_quantize) against the plain
// kernels followed by the linear's own activation step, bit for bit: y / out as rmsnorm() / swiglu_rows() write them
// (and the residual), the quantization's bytes as quik_matmul leaves them in the context's activation scratch, and the
// linear's output from them (quik_matmul_quantized) as quik_matmul's from y. Every activation form (int8 at 4 and 8
// bits, FP8 for the GEMV and, padded to 16 rows, the GEMM, A16), batch 1, 5 (GEMV), 9 and 40 (GEMM); widths of
// SmolLM2 (576, 1536), Llama-2-7B (4096, 11008) and the 70B MLP (28672: eight float4s a thread; an RMSNorm that wide is
// refused); 0, some and every column as outliers.
TEST(CudaKernels, QuikProducersQuantizeAsTheLinear) {
  SKIP_WITHOUT_GPU();
  struct Form {
    int wbits, abits;
    bool fp8;
  };
  const Form forms[] = {{4, 4, false}, {8, 8, false}, {4, 8, true}, {4, 16, false}};
  struct Case {
    int64_t width, outliers;
  };
  const Case cases[] = {{576, 36}, {1536, 0}, {4096, 41}, {11008, 110}, {28672, 287}, {64, 64}};
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t st;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&st));
  {
    cuda::GemmContext ctx(st);
    uint32_t seed = 5100;
    for (const Case& c : cases)
      for (const Form& f : forms) {
        const int64_t n = 24, k = c.width;
        const QuikQuantized q = test::random_quik(n, k, f.wbits, f.abits, f.fp8, c.outliers, seed++);
        const cuda::DevicePackedWeight dw(pack_quik(q, storage));
        const cuda::QuikDevice w = dw.quik();
        ASSERT_TRUE(cuda::quik_producer_quantizes(w, k));
        EXPECT_FALSE(cuda::quik_producer_quantizes(w, k + 4)) << "another width";
        for (const int m : {1, 5, 9, 40}) {
          const std::string what = "W" + std::to_string(f.wbits) + (f.fp8 ? "-FP8" : "A" + std::to_string(f.abits)) + " k " +
                                   std::to_string(k) + " outliers " + std::to_string(c.outliers) + " m " + std::to_string(m);
          const size_t bytes = cuda::quik_act_scratch_bytes(w, m);
          cuda::DeviceBuffer<uint8_t> acts(bytes);
          // The linear's own quantization of `in`, as it leaves the context's scratch, and its output.
          auto own = [&](const float* in, std::vector<uint8_t>& scratch) {
            uint8_t* sp = reinterpret_cast<uint8_t*>(ctx.act_scratch((bytes + 1) / 2));
            LOWBIT_CUDA_CHECK(cudaMemsetAsync(sp, 0, bytes, st));
            cuda::DeviceBuffer<float> y(static_cast<size_t>(m * n));
            cuda::quik_matmul(w, in, m, y.get(), ctx);
            LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
            scratch.resize(bytes);
            LOWBIT_CUDA_CHECK(cudaMemcpy(scratch.data(), sp, bytes, cudaMemcpyDeviceToHost));
            return y.download();
          };
          auto from_acts = [&]() {
            cuda::DeviceBuffer<float> y(static_cast<size_t>(m * n));
            cuda::quik_matmul_quantized(w, acts.get(), m, y.get(), ctx);
            LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
            return y.download();
          };
          // RMSNorm with the residual added (widths rmsnorm() serves with its float4 kernel; wider rows are refused).
          const std::vector<float> x = test::random_x(m, k, seed++), d = test::random_x(m, k, seed++),
                                   g = test::random_x(1, k, seed++);
          cuda::DeviceBuffer<float> x1(x), x2(x), dd(d), gd(g), y1(x.size()), y2(x.size());
          EXPECT_EQ(cuda::quik_rmsnorm_quantizes(w, static_cast<int>(k)), k <= 16384) << what;
          std::vector<uint8_t> want_bytes;
          if (k > 16384) {
            test::expect_refused([&] { cuda::quik_rmsnorm_quantize(w, x1.get(), dd.get(), gd.get(), y1.get(), m, static_cast<int>(k),
                                                                   1e-5f, acts.get(), bytes, st); },
                                 "do not quantize");
          } else {
          LOWBIT_CUDA_CHECK(cudaMemset(acts.get(), 0, bytes));
          cuda::quik_rmsnorm_quantize(w, x1.get(), dd.get(), gd.get(), y1.get(), m, static_cast<int>(k), 1e-5f, acts.get(), bytes, st);
            test::expect_refused([&] { cuda::quik_rmsnorm_quantize(w, x1.get(), dd.get(), gd.get(), y1.get(), m, static_cast<int>(k),
                                                                   1e-5f, acts.get(), bytes - 1, st); },
                                 "needed");
          cuda::rmsnorm(x2.get(), dd.get(), gd.get(), y2.get(), nullptr, m, static_cast<int>(k), 1e-5f, st);
          LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
          EXPECT_EQ(y1.download(), y2.download()) << what << ": RMSNorm output";
          EXPECT_EQ(x1.download(), x2.download()) << what << ": residual";
          const std::vector<float> want = own(y2.get(), want_bytes);
          EXPECT_EQ(acts.download(), want_bytes) << what << ": RMSNorm's quantization";
          EXPECT_EQ(from_acts(), want) << what << ": the linear from RMSNorm's quantization";
          }
          // SwiGLU from a fused [gate | up] row.
          const std::vector<float> gu = test::random_x(m, 2 * k, seed++);
          cuda::DeviceBuffer<float> gud(gu), h1(x.size()), h2(x.size());
          LOWBIT_CUDA_CHECK(cudaMemset(acts.get(), 0, bytes));
          cuda::quik_swiglu_quantize(w, gud.get(), gud.get() + k, 2 * k, h1.get(), m, k, acts.get(), bytes, st);
          cuda::swiglu_rows(gud.get(), gud.get() + k, 2 * k, h2.get(), m, k, st);
          LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
          EXPECT_EQ(h1.download(), h2.download()) << what << ": SwiGLU output";
          const std::vector<float> want2 = own(h2.get(), want_bytes);
          EXPECT_EQ(acts.download(), want_bytes) << what << ": SwiGLU's quantization";
          EXPECT_EQ(from_acts(), want2) << what << ": the linear from SwiGLU's quantization";
        }
      }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(st));
}

// Attention quantizing its output for a QUIK o projection (quik.h: QuikRowSink): every attention path writes the same
// fp32 output as without the sink, the bytes of the activation quantization quik_matmul writes from that output, and
// the o projection from them gives quik_matmul's y bit for bit. Paths: the tensor-core prefill (two sequences of 70
// rows: a full and a part query tile each), the per-row kernel over 9 prefill rows, and decode (1 and 5 rows) unsplit,
// split over 3 blocks merged in a cluster, and merged by the combine kernel. Shapes: 32 heads of 128 over 8 KV heads
// with 41 outlier columns, 8 heads of 64 with none and with every column an outlier. Forms W4A8, W8A8, W4A4, W4-FP8,
// W4A16. Each sink runs twice, so a row-group count the first launch left non-zero would show; the counts end at zero.
TEST(CudaKernels, QuikAttentionQuantizesAsTheLinear) {
  SKIP_WITHOUT_GPU();
  struct Form {
    int wbits, abits;
    bool fp8;
  };
  const Form forms[] = {{4, 8, false}, {8, 8, false}, {4, 4, false}, {4, 8, true}, {4, 16, false}};
  struct Shape {
    int heads, kv_heads, hd, outliers;
  };
  const Shape shapes[] = {{32, 8, 128, 41}, {8, 8, 64, 0}, {8, 8, 64, 512}};
  struct Path {
    const char* name;
    int seqs, n, splits;
    bool cluster;
  };
  const Path paths[] = {{"tensor-core prefill", 2, 70, 1, false}, {"per-row prefill", 1, 9, 1, false},
                        {"decode", 1, 1, 1, false},     {"decode", 5, 1, 1, false},
                        {"decode, cluster", 5, 1, 3, true}, {"decode, combine kernel", 5, 1, 3, false}};
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t st;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&st));
  const bool cluster_was = cuda::cluster_combine_enabled();
  {
    cuda::GemmContext ctx(st);
    uint32_t seed = 5300;
    for (const Shape& sh : shapes) {
      const int k = sh.heads * sh.hd, kvd = sh.kv_heads * sh.hd, span = 100;
      std::mt19937 rng(seed++);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      // One layer, a contiguous cache of `span` positions for each of up to 5 sequences.
      cuda::KvMap map;
      map.layers = 1;
      map.block = span;
      std::vector<uint16_t> kc(static_cast<size_t>(5) * span * kvd), vc(kc.size());
      for (size_t i = 0; i < kc.size(); ++i) kc[i] = f32_to_f16(nd(rng)), vc[i] = f32_to_f16(nd(rng));
      cuda::DeviceBuffer<uint16_t> kd(kc), vd(vc);
      const auto* kh = reinterpret_cast<const __half*>(kd.get());
      const auto* vh = reinterpret_cast<const __half*>(vd.get());
      for (const Form& f : forms) {
        const int64_t n_out = 24;
        const QuikQuantized qw = test::random_quik(n_out, k, f.wbits, f.abits, f.fp8, sh.outliers, seed++);
        const cuda::DevicePackedWeight dw(pack_quik(qw, storage));
        const cuda::QuikDevice w = dw.quik();
        ASSERT_TRUE(cuda::quik_attention_quantizes(w, k));
        for (const Path& p : paths) {
          const int rows = p.seqs * p.n;
          const bool tc = p.n >= 16;
          ASSERT_EQ(cuda::attention_on_tensor_cores(p.n, sh.hd), tc);
          const std::string what = std::string(p.name) + ", " + std::to_string(rows) + " rows, " + std::to_string(sh.heads) +
                                   " heads of " + std::to_string(sh.hd) + ", " + std::to_string(sh.outliers) + " outliers, W" +
                                   std::to_string(f.wbits) + (f.fp8 ? "-FP8" : "A" + std::to_string(f.abits));
          std::vector<float> q(static_cast<size_t>(rows) * k);
          for (float& v : q) v = 1.5f * nd(rng);
          std::vector<int32_t> seq(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows));
          for (int r = 0; r < rows; ++r) {
            seq[static_cast<size_t>(r)] = r / p.n;
            pos[static_cast<size_t>(r)] = p.n == 1 ? 40 + 11 * r : 20 + r % p.n;
          }
          cuda::DeviceBuffer<float> qd(q), scratch(static_cast<size_t>(rows) * sh.heads * p.splits * (sh.hd + 2));
          cuda::DeviceBuffer<int32_t> sd(seq), pd(pos);
          cuda::set_cluster_combine(p.cluster);
          auto run = [&](float* out, const cuda::QuikRowSink* sink) {
            LOWBIT_CUDA_CHECK(cudaMemset(out, 0xFF, static_cast<size_t>(rows) * k * sizeof(float)));
            if (tc)
              cuda::prefill_attention(qd.get(), sd.get(), pd.get(), p.seqs, p.n, sh.heads, sh.kv_heads, sh.hd, 0, map, 0, kh, vh,
                                      out, st, sink);
            else
              cuda::attention(qd.get(), sd.get(), pd.get(), rows, sh.heads, sh.kv_heads, sh.hd, 0, map, 0, kh, vh, out,
                              p.splits, scratch.get(), p.n == 1, st, nullptr, nullptr, sink);
            LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
          };
          cuda::DeviceBuffer<float> plain(q.size()), sunk(q.size());
          run(plain.get(), nullptr);
          // quik_matmul's own quantization of the plain output (read back from the context's scratch) and its y.
          const size_t bytes = cuda::quik_act_scratch_bytes(w, rows);
          uint8_t* own = reinterpret_cast<uint8_t*>(ctx.act_scratch((bytes + 1) / 2));
          LOWBIT_CUDA_CHECK(cudaMemsetAsync(own, 0, bytes, st));
          cuda::DeviceBuffer<float> y_want(static_cast<size_t>(rows * n_out)), y_got(y_want.size());
          cuda::quik_matmul(w, plain.get(), rows, y_want.get(), ctx);
          LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
          std::vector<uint8_t> want_bytes(bytes);
          LOWBIT_CUDA_CHECK(cudaMemcpy(want_bytes.data(), own, bytes, cudaMemcpyDeviceToHost));
          cuda::DeviceBuffer<uint8_t> acts(bytes);
          cuda::DeviceBuffer<unsigned> done(static_cast<size_t>(rows));
          LOWBIT_CUDA_CHECK(cudaMemset(done.get(), 0, done.bytes()));
          for (int rep = 0; rep < 2; ++rep) {
            LOWBIT_CUDA_CHECK(cudaMemset(acts.get(), 0, bytes));
            const cuda::QuikRowSink sink = cuda::quik_row_sink(w, rows, acts.get(), bytes, done.get(), rows, st);
            run(sunk.get(), &sink);
            const std::string r = what + (rep == 0 ? "" : ", again");
            ASSERT_EQ(sunk.download(), plain.download()) << r << ": attention output";
            ASSERT_EQ(acts.download(), want_bytes) << r << ": the quantized rows";
            cuda::quik_matmul_quantized(w, acts.get(), rows, y_got.get(), ctx);
            LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
            EXPECT_EQ(y_got.download(), y_want.download()) << r << ": the o projection from them";
          }
          const std::vector<unsigned> counts = done.download();
          EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](unsigned c) { return c == 0; })) << what << ": counts left";
          // Refusals: too few counts, a weight of another width.
          test::expect_refused([&] { cuda::quik_row_sink(w, rows, acts.get(), bytes, done.get(), rows - 1, st); }, "row-group counts");
          test::expect_refused([&] { cuda::quik_row_sink(w, rows, acts.get(), bytes - 1, done.get(), rows, st); }, "needed");
        }
      }
    }
  }
  cuda::set_cluster_combine(cluster_was);
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(st));
}

// The benchmarks' cuSPARSE baseline for the 2/4/16 outliers (cusparse_outliers.h): the dense GEMV on the weight
// without its outliers, then cuSPARSE's y += A x over the CSR outliers (columns mapped through the permutation), equals
// the format's reference within kGemvBudget at batch 1 (SpMV) and above (SpMM); a weight without outliers is refused.
TEST(CudaKernels, CusparseOutliersMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const Shape shapes[] = {{17, 576}, {40, 1600}, {3, 28672}, {9001, 1280}};
  uint32_t seed = 900;
  for (const Shape& sh : shapes) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const Mixed24AQuantized q = test::random_mixed24a(sh.n, sh.k, true, seed++);
    const PackedWeight pw = pack_mixed24a(q, storage);
    const cuda::DevicePackedWeight dw(pw);
    ASSERT_GT(dw.mixed24a().nnz, 0) << sh.n << "x" << sh.k;
    cuda::CusparseOutliers sparse(dw.mixed24a());
    std::vector<float> wd(static_cast<size_t>(sh.n * sh.k));
    q.dequantize(wd.data());
    for (int m : {1, 3, 8}) {
      const std::vector<float> x = test::random_x(m, sh.k, seed++);
      std::vector<float> want(static_cast<size_t>(m * sh.n));
      mixed24a_gemm_packed_ref(pw, x.data(), m, nullptr, want.data());
      const auto got = run_poisoned(x, m * sh.n, [&](const float* xd, float* yd) {
        cuda::mixed24a_gemv(dw.mixed24a_dense(), xd, m, yd, nullptr, cuda::OutlierMode::Fused, cuda::GemvPath::Scalar, nullptr);
        sparse.add(xd, m, yd, nullptr);
      });
      expect_close(got, want, abs_scale(x, wd, m, sh.n, sh.k), kGemvBudget,
                   "cuSPARSE outliers " + std::to_string(sh.n) + "x" + std::to_string(sh.k) + " m" + std::to_string(m) +
                       (sparse.values_fp16() ? " (fp16 values)" : " (fp32 values)"));
    }
  }
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const PackedWeight plain = pack_mixed24a(test::random_mixed24a(16, 1024, false, seed), storage);
  const cuda::DevicePackedWeight dplain(plain);
  EXPECT_THROW(cuda::CusparseOutliers{dplain.mixed24a()}, Error);
}

// The 2/4/16 GEMVs on int8-derived activations: the integer-dot GEMV (GemvPath::Dp2aStream, batch 1..2: x as one 16-bit
// integer per activation, v = 254 hi + lo from the int8 pieces of int8_tables.h under s = max|x| / 127 per batch
// column; exact int32 dot products per group) and the int8 tensor-core GEMV (GemvPath::Int8MmaStream, batch 1..8: the
// same pieces as mma B operands, exact int32 sums sum q hi and sum q lo per group, v = 254 C_hi + C_lo) on the same
// packed bytes as:
//   - its CPU twin: the same v and s, the dense values (q - z) * scale as the format stores them, summed in fp64, and the
//     outliers with fp32 x; budget kGemvBudget (only the kernel's fp32 scaling and accumulation order differ);
//   - the format's own reference (fp32 x): within the named rounding budget sum_c |w_c| s / 508 (an activation is off by
//     at most half the low piece's step) plus kGemvBudget.
// The kernel given the rows' max |x| (the producers' xmax) writes the same bits as when its activation kernel reduces
// the rows itself. Shapes: 16x1024 (the smallest k: 16 units, 2 chunks), 17x1280 (a part tile; 20 units: a part chunk),
// 40x11008 (Llama-2-7B's down rows: 172 units, a part chunk), 33x2304, 3x28672, 9001x1280 (more tiles than one wave of
// persistent CTAs); batch 1..8 (the integer-dot GEMV at 1 and 2); with and without outliers, fused and as the CSR pass.
TEST(CudaKernels, Mixed24aIntegerDotGemvMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const Shape shapes[] = {{16, 1024}, {17, 1280}, {40, 11008}, {33, 2304}, {3, 28672}, {9001, 1280}};
  uint32_t seed = 900;
  for (const Shape& sh : shapes)
    for (bool outliers : {false, true}) {
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const Mixed24AQuantized q = test::random_mixed24a(sh.n, sh.k, outliers, seed++);
      const PackedWeight pw = pack_mixed24a(q, storage);
      const cuda::DevicePackedWeight dw(pw);
      std::vector<float> wd(static_cast<size_t>(sh.n * sh.k));
      q.dequantize(wd.data());
      for (int m = 1; m <= 8; ++m) {
        ASSERT_TRUE(cuda::mixed24a_mma_fits(sh.n, sh.k, m));
        ASSERT_EQ(cuda::mixed24a_dp_fits(sh.n, sh.k, m), m <= 2);
        ASSERT_EQ(cuda::mixed24a_auto_path(sh.n, sh.k, m, true),
                  m <= 2 ? cuda::GemvPath::Dp2aStream : m <= cuda::kMixedMmaMaxBatch ? cuda::GemvPath::Int8MmaStream : cuda::GemvPath::TensorCoreStream);
        if (m <= 2) {
          ASSERT_LE(cuda::mixed24a_dp_x_bytes(sh.k, m), cuda::mixed24a_xfrag_bytes(sh.k));
        }
        ASSERT_LE(cuda::mixed24a_mma_x_bytes(sh.k, m), cuda::mixed24a_xfrag_bytes(sh.k));
        const std::vector<float> x = test::random_x(m, sh.k, seed++);
        std::vector<float> ref(static_cast<size_t>(m * sh.n)), want(ref.size()), xmax(static_cast<size_t>(m));
        std::vector<double> bound(ref.size());
        mixed24a_gemm_packed_ref(pw, x.data(), m, nullptr, ref.data());
        for (int mm = 0; mm < m; ++mm) {
          const float* xr = x.data() + mm * sh.k;
          float mx = 0.0f;
          for (int64_t c = 0; c < sh.k; ++c) mx = cuda::i8_absmax_step(mx, xr[c]);
          xmax[static_cast<size_t>(mm)] = mx;
          const float s = mx / cuda::kI8Max;
          std::vector<double> xq(static_cast<size_t>(sh.k));   // original column order
          for (int64_t c = 0; c < sh.k; ++c) {
            int8_t hi, lo;
            cuda::i8_x_pieces(xr[c], s, hi, lo);
            xq[static_cast<size_t>(c)] = static_cast<double>(s) * (cuda::kI8LoSteps * hi + lo) / cuda::kI8LoSteps;
          }
          for (int64_t r = 0; r < sh.n; ++r) {
            std::vector<char> is_out(static_cast<size_t>(sh.k), 0);
            double acc = 0, b = 0;
            if (outliers)
              for (int32_t e = q.outlier_rowptr[static_cast<size_t>(r)]; e < q.outlier_rowptr[static_cast<size_t>(r) + 1]; ++e) {
                const int64_t c = q.outlier_col[static_cast<size_t>(e)];
                is_out[static_cast<size_t>(c)] = 1;
                acc += static_cast<double>(f16_to_f32(q.outlier_val[static_cast<size_t>(e)])) * xr[q.perm[static_cast<size_t>(c / 16)] * 16 + c % 16];
              }
            for (int64_t c = 0; c < sh.k; ++c) {   // stored column order
              if (is_out[static_cast<size_t>(c)]) continue;
              const int64_t p = c / 16, orig = q.perm[static_cast<size_t>(p)] * 16 + c % 16;
              const double dv = (static_cast<double>(q.codes[static_cast<size_t>(r * sh.k + c)]) - q.zero[static_cast<size_t>(r * q.groups() + p)]) *
                                q.scale(r, p);
              acc += dv * xq[static_cast<size_t>(orig)];
              b += std::fabs(dv) * s / 508.0;
            }
            want[static_cast<size_t>(mm * sh.n + r)] = static_cast<float>(acc);
            bound[static_cast<size_t>(mm * sh.n + r)] = b;
          }
        }
        const std::vector<double> scale = abs_scale(x, wd, m, sh.n, sh.k);
        cuda::DeviceBuffer<uint8_t> xfrag(cuda::mixed24a_xfrag_bytes(sh.k));
        cuda::DeviceBuffer<float> xmax_d(xmax);
        for (cuda::GemvPath path : {cuda::GemvPath::Dp2aStream, cuda::GemvPath::Int8MmaStream})
        for (cuda::OutlierMode mode : {cuda::OutlierMode::Fused, cuda::OutlierMode::SpMV}) {
          if (!outliers && mode == cuda::OutlierMode::SpMV) continue;
          if (path == cuda::GemvPath::Dp2aStream && m > 2) continue;
          std::vector<float> first;
          for (bool given : {false, true}) {
            LOWBIT_CUDA_CHECK(cudaMemset(xfrag.get(), 0xFF, xfrag.bytes()));
            const auto got = run_poisoned(x, m * sh.n, [&](const float* xd, float* yd) {
              cuda::mixed24a_gemv(dw.mixed24a(), xd, m, yd, nullptr, mode, path, xfrag.get(), given ? xmax_d.get() : nullptr);
            });
            const std::string what = std::string(path == cuda::GemvPath::Dp2aStream ? "mixed24a integer-dot " : "mixed24a int8 mma ") +
                                     std::to_string(sh.n) + "x" + std::to_string(sh.k) + " m" +
                                     std::to_string(m) + (outliers ? (mode == cuda::OutlierMode::Fused ? " fused" : " spmv") : "") +
                                     (given ? " xmax given" : "");
            expect_close(got, want, scale, kGemvBudget, what + " vs twin");
            expect_within_rounding(got, ref, bound, scale, what, "fp32-x reference");
            if (!given) first = got;
            else EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(float))) << what << ": not bit-identical to its own reduction";
          }
        }
      }
    }
  // Where they do not serve: the integer-dot GEMV above batch 2; both where k is not a multiple of 256 or below 1024, or
  // without the scratch; Auto then keeps the other kernels.
  EXPECT_NE(cuda::mixed24a_auto_path(4096, 4096, 3, true), cuda::GemvPath::Dp2aStream);
  for (int m = 3; m <= 8; ++m)
    EXPECT_EQ(cuda::mixed24a_auto_path(4096, 4096, m, true), m <= cuda::kMixedMmaMaxBatch ? cuda::GemvPath::Int8MmaStream : cuda::GemvPath::TensorCoreStream);
  for (int64_t k : {640, 768})
    for (int m : {1, 4, 8}) EXPECT_NE(cuda::mixed24a_auto_path(64, k, m, true), cuda::GemvPath::Int8MmaStream);
  EXPECT_NE(cuda::mixed24a_auto_path(4096, 4096, 4, false), cuda::GemvPath::Int8MmaStream);
  EXPECT_NE(cuda::mixed24a_auto_path(64, 640, 1, true), cuda::GemvPath::Dp2aStream);
  EXPECT_NE(cuda::mixed24a_auto_path(64, 768, 1, true), cuda::GemvPath::Dp2aStream);
  EXPECT_NE(cuda::mixed24a_auto_path(4096, 4096, 1, false), cuda::GemvPath::Dp2aStream);
}

// The integer-dot GEMV (batch 1..2) and the int8 tensor-core GEMV (3..8) over a group of matrices that read the same x
// (mixed24a_gemv_group: q / k / v, gate / up; one activation kernel, one launch) write each part's outputs bit for bit as
// the part's own call: parts of 64, 17 (a part tile) and 40 rows, k 2304 and 11008 (part chunks), outliers in some
// parts, batch 1, 2, 3, 5 and 8, outliers fused and as the CSR pass. It refuses parts of different k, more than three
// parts and batches it does not serve.
TEST(CudaKernels, Mixed24aGroupedGemvEqualsItsParts) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 950;
  for (int64_t k : {2304, 11008}) {
    std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
    const int64_t ns[3] = {64, 17, 40};
    std::vector<cuda::DevicePackedWeight> dw;
    for (int p = 0; p < 3; ++p) dw.emplace_back(pack_mixed24a(test::random_mixed24a(ns[p], k, p != 1, seed++), storage));
    for (int m : {1, 2, 3, 5, 8}) {
      const std::vector<float> x = test::random_x(m, k, seed++);
      cuda::DeviceBuffer<float> xd(x);
      cuda::DeviceBuffer<uint8_t> xfrag(cuda::mixed24a_xfrag_bytes(k));
      const cuda::GemvPath path = m <= 2 ? cuda::GemvPath::Dp2aStream : cuda::GemvPath::Int8MmaStream;
      ASSERT_LE(m <= 2 ? cuda::mixed24a_dp_x_bytes(k, m, 3) : cuda::mixed24a_mma_x_bytes(k, m, 3), xfrag.bytes());
      for (cuda::OutlierMode mode : {cuda::OutlierMode::Fused, cuda::OutlierMode::SpMV}) {
        std::vector<std::vector<float>> want;
        for (int p = 0; p < 3; ++p)
          want.push_back(run_poisoned(x, m * ns[p], [&](const float* xx, float* yd) {
            cuda::mixed24a_gemv(dw[static_cast<size_t>(p)].mixed24a(), xx, m, yd, nullptr, mode, path, xfrag.get());
          }));
        cuda::DeviceBuffer<float> y0(static_cast<size_t>(m * ns[0])), y1(static_cast<size_t>(m * ns[1])), y2(static_cast<size_t>(m * ns[2]));
        for (auto* b : {&y0, &y1, &y2}) LOWBIT_CUDA_CHECK(cudaMemset(b->get(), 0xFF, b->bytes()));
        const cuda::Mixed24ADevice ws[3] = {dw[0].mixed24a(), dw[1].mixed24a(), dw[2].mixed24a()};
        float* ys[3] = {y0.get(), y1.get(), y2.get()};
        cuda::mixed24a_gemv_group(ws, 3, xd.get(), m, ys, nullptr, mode, xfrag.get());
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> got[3] = {y0.download(), y1.download(), y2.download()};
        for (int p = 0; p < 3; ++p)
          EXPECT_EQ(0, std::memcmp(got[p].data(), want[static_cast<size_t>(p)].data(), got[p].size() * sizeof(float)))
              << "k " << k << " m" << m << " part " << p << (mode == cuda::OutlierMode::Fused ? " fused" : " spmv");
      }
    }
  }
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const cuda::DevicePackedWeight a(pack_mixed24a(test::random_mixed24a(16, 1024, false, 1), storage));
  const cuda::DevicePackedWeight b(pack_mixed24a(test::random_mixed24a(16, 1280, false, 2), storage));
  cuda::DeviceBuffer<float> x(static_cast<size_t>(3 * 1280)), y(static_cast<size_t>(3 * 16));
  cuda::DeviceBuffer<uint8_t> xfrag(cuda::mixed24a_xfrag_bytes(1280));
  float* ys[4] = {y.get(), y.get(), y.get(), y.get()};
  const cuda::Mixed24ADevice mixed_k[2] = {a.mixed24a(), b.mixed24a()};
  EXPECT_THROW(cuda::mixed24a_gemv_group(mixed_k, 2, x.get(), 1, ys, nullptr, cuda::OutlierMode::Fused, xfrag.get()), Error);
  const cuda::Mixed24ADevice four[4] = {a.mixed24a(), a.mixed24a(), a.mixed24a(), a.mixed24a()};
  EXPECT_THROW(cuda::mixed24a_gemv_group(four, 4, x.get(), 1, ys, nullptr, cuda::OutlierMode::Fused, xfrag.get()), Error);
  EXPECT_THROW(cuda::mixed24a_gemv_group(four, 2, x.get(), 9, ys, nullptr, cuda::OutlierMode::Fused, xfrag.get()), Error);
  EXPECT_THROW(cuda::mixed24a_gemv_group(four, 2, x.get(), 1, ys, nullptr, cuda::OutlierMode::Fused, nullptr), Error);
}

// The 2/4/16 GEMVs on int8-derived activations write them into the caller's xfrag scratch (mixed24a_xfrag_bytes(k)
// bytes, what packed_matmul and packed_matmul_group hand them): for every k they serve (multiples of 256 from 1024 to
// 131,072), every batch and 1..3 parts, the integer-dot kernel's values (batch 1..2) and the int8 tensor-core kernel's
// pieces and group sums (batch 1..8) fit. Host arithmetic only: runs without a GPU.
TEST(CudaScratch, Mixed24aActivationScratchFitsXfrag) {
  for (int64_t k = 1024; k <= 131072; k += 256)
    for (int parts = 1; parts <= 3; ++parts)
      for (int m = 1; m <= cuda::kMaxGemvBatch; ++m) {
        ASSERT_TRUE(cuda::mixed24a_mma_fits(4096, k, m));
        ASSERT_LE(cuda::mixed24a_mma_x_bytes(k, m, parts), cuda::mixed24a_xfrag_bytes(k)) << "k " << k << " m " << m << " parts " << parts;
        if (m <= 2) {
          ASSERT_LE(cuda::mixed24a_dp_x_bytes(k, m, parts), cuda::mixed24a_xfrag_bytes(k)) << "k " << k << " m " << m;
        }
      }
  // The batch forms: 1..4 share the 4-column form, 5..8 the 8-column one.
  EXPECT_EQ(cuda::mixed24a_mma_x_bytes(4096, 1), cuda::mixed24a_mma_x_bytes(4096, 4));
  EXPECT_EQ(cuda::mixed24a_mma_x_bytes(4096, 5), cuda::mixed24a_mma_x_bytes(4096, 8));
  EXPECT_LT(cuda::mixed24a_mma_x_bytes(4096, 4), cuda::mixed24a_mma_x_bytes(4096, 5));
}

// argmax_rows, split over blocks (vocabularies of 16K and up, with scratch) and in one block per row, against the host:
// the largest value's index, the lowest on ties, NaN never chosen, 0 for a row of -inf; vocabularies from 100 to
// Qwen2's 151,936, 1..8 rows, the maximum planted in the first, a middle and the last slice.
TEST(CudaKernels, ArgmaxRowsMatchesHostEitherWay) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-10.0f, 10.0f);
  for (int vocab : {100, 16384, 32000, 128256, 151936})
    for (int rows : {1, 3, 8}) {
      std::vector<float> h(static_cast<size_t>(rows) * vocab);
      for (float& v : h) v = u(rng);
      std::vector<int32_t> want(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) {
        float* row = h.data() + static_cast<size_t>(r) * vocab;
        row[(r * 7919) % vocab] = std::nanf("");
        if (r == 2) {   // every value -inf: index 0
          std::fill(row, row + vocab, -INFINITY);
          want[static_cast<size_t>(r)] = 0;
          continue;
        }
        const int first = r % 3 == 0 ? vocab / 64 : r % 3 == 1 ? vocab / 2 + 3 : vocab - 2;   // first / middle / last slice
        row[first] = 20.0f;
        row[std::min(vocab - 1, first + 1 + r)] = 20.0f;   // a tie after it: the lower index wins
        if (r % 3 == 2) row[vocab - 1] = 20.0f;
        want[static_cast<size_t>(r)] = first;
      }
      cuda::DeviceBuffer<float> d(h);
      cuda::DeviceBuffer<uint64_t> scratch(static_cast<size_t>(rows) * cuda::kArgmaxSlices);
      for (bool split : {false, true}) {
        std::vector<int32_t> poison(static_cast<size_t>(rows), -1);
        cuda::DeviceBuffer<int32_t> out(poison);
        cuda::argmax_rows(d.get(), rows, vocab, out.get(), nullptr, split ? scratch.get() : nullptr);
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(out.download(), want) << "vocab " << vocab << " rows " << rows << (split ? " split" : " one block");
      }
    }
}

// The dequantize kernels write exactly fp16(the value the packed data encodes), outliers included, original order.
TEST(CudaKernels, DequantizeKernelsAreBitExact) {
  SKIP_WITHOUT_GPU();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  for (const Shape& sh : {Shape{7, 1100}, Shape{33, 2048}}) {
    const AnyPrecQuantized q = test::random_anyprec(sh.n, sh.k, true, 7);
    const cuda::DevicePackedWeight dw(pack_anyprec(q, storage));
    for (int bits = 2; bits <= 8; ++bits) {
      cuda::DeviceBuffer<__half> out(static_cast<size_t>(sh.n * sh.k));
      LOWBIT_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.bytes()));
      cuda::anyprec_dequant_f16(dw.anyprec(), bits, out.get(), nullptr);
      const std::vector<__half> got = out.download();
      std::vector<float> want(static_cast<size_t>(sh.n * sh.k));
      q.dequantize(bits, want.data());
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += __half_as_ushort(got[i]) != f32_to_f16(want[i]);
      EXPECT_EQ(bad, 0) << "anyprec " << sh.n << "x" << sh.k << " b" << bits;
    }
  }
  for (const Shape& sh : {Shape{17, 576}, Shape{40, 1600}, Shape{16, 2048}}) {
    const Mixed24AQuantized q = test::random_mixed24a(sh.n, sh.k, true, 9);
    const cuda::DevicePackedWeight dw(pack_mixed24a(q, storage));
    cuda::DeviceBuffer<__half> out(static_cast<size_t>(sh.n * sh.k));
    LOWBIT_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.bytes()));
    cuda::mixed24a_dequant_f16(dw.mixed24a(), out.get(), nullptr);
    const std::vector<__half> got = out.download();
    std::vector<float> want(static_cast<size_t>(sh.n * sh.k));
    q.dequantize(want.data());
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += __half_as_ushort(got[i]) != f32_to_f16(want[i]);
    EXPECT_EQ(bad, 0) << "mixed24a " << sh.n << "x" << sh.k;
  }
  for (int bits = 2; bits <= 8; ++bits)
    for (bool act_order : {false, true}) {
      const UniformQuantized q = uniform_weight(19, 1100, bits, 128, bits % 2 == 0, act_order, 40 + bits);
      const cuda::DevicePackedWeight dw(pack_uniform(q, storage));
      cuda::DeviceBuffer<__half> out(static_cast<size_t>(19 * 1100));
      LOWBIT_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.bytes()));
      cuda::uniform_dequant_f16(dw.uniform(), out.get(), nullptr);
      const std::vector<__half> got = out.download();
      std::vector<float> want(static_cast<size_t>(19 * 1100));
      q.dequantize(want.data());
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += __half_as_ushort(got[i]) != f32_to_f16(want[i]);
      EXPECT_EQ(bad, 0) << "uniform w" << bits << (act_order ? " act-order" : "");
    }
}

// Batches above 8: dequantize + cuBLAS, within fp16 rounding of the CPU reference.
TEST(CudaKernels, LargeBatchPathMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t s;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&s));
  {
    cuda::GemmContext ctx(s);
    const AnyPrecQuantized qa = test::random_anyprec(96, 1100, true, 21);
    const PackedWeight pa = pack_anyprec(qa, storage);
    const Mixed24AQuantized qm = test::random_mixed24a(80, 640, true, 22);
    const PackedWeight pm = pack_mixed24a(qm, storage);
    for (int64_t m : {9, 16, 64}) {
      for (int bits : {3, 8}) {
        const cuda::DevicePackedWeight dw(pa);
        const auto x = test::random_x(m, 1100, static_cast<uint32_t>(m + bits));
        std::vector<float> want(static_cast<size_t>(m * 96)), wd(96 * 1100);
        make_packed_linear(pa, nullptr, "t")->forward_ref(x.data(), m, want.data(), bits);
        qa.dequantize(bits, wd.data());
        const auto got = run_packed(dw, bits, x, m, ctx);
        expect_close(got, want, abs_scale(x, wd, m, 96, 1100), kCublasBudget, "anyprec cuBLAS m" + std::to_string(m));
      }
      const cuda::DevicePackedWeight dm(pm);
      const auto x = test::random_x(m, 640, static_cast<uint32_t>(m));
      std::vector<float> want(static_cast<size_t>(m * 80)), wd(80 * 640);
      mixed24a_gemm_packed_ref(pm, x.data(), m, nullptr, want.data());
      qm.dequantize(wd.data());
      const auto got = run_packed(dm, 0, x, m, ctx);
      expect_close(got, want, abs_scale(x, wd, m, 80, 640), kCublasBudget, "mixed24a cuBLAS m" + std::to_string(m));
      const UniformQuantized qu = uniform_weight(72, 1100, 4, 128, false, true, static_cast<uint32_t>(m));
      const PackedWeight pu = pack_uniform(qu, storage);
      const cuda::DevicePackedWeight du(pu);
      const auto xu = test::random_x(m, 1100, static_cast<uint32_t>(m + 7));
      std::vector<float> want_u(static_cast<size_t>(m * 72)), wdu(72 * 1100);
      make_packed_linear(pu, nullptr, "t")->forward_ref(xu.data(), m, want_u.data(), 0);
      qu.dequantize(wdu.data());
      const auto got_u = run_packed(du, 0, xu, m, ctx);
      expect_close(got_u, want_u, abs_scale(xu, wdu, m, 72, 1100), kCublasBudget, "uniform cuBLAS m" + std::to_string(m));
    }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(s));
}

// The uniform mixed-input GEMM (above batch 8 on Hopper, uniform_fused.h) against two CPU twins on the same packed
// bytes: (1) its own arithmetic, each weight fp16(q * s + fp16(-z * s)) times fp16(x), summed in fp64: within
// the fp32-accumulation budget; (2) the format's reference forward (exact weights, fp32 x): within kMixedInputBudget.
// 4 and 8 bits; groups of 64, 128 and whole rows; symmetric and not; k a multiple of 32 but not of the 64-column k tile
// (a part last group); n a multiple of 8 not of the 128-row tile; batches 9 (one part token tile) to 300 (three), each
// with the 128- and the 256-token tile.
// packed_matmul takes it (asserted) and gives the same bits; LOWBIT_FUSED_GEMM=0 takes dequantize + cuBLAS. Weights it
// does not serve (3 bits, act-order, groups of 32) are refused by uniform_gemm with a reason.
TEST(CudaKernels, UniformFusedGemmMatchesCpuTwins) {
  SKIP_WITHOUT_GPU();
  // A widened weight differs from (q - z) s by one fp16 rounding of it plus the zero term's (half a unit of |z s|, up to
  // 2^bits s against |(q - z) s|), and x is rounded to fp16: 4e-3 of sum |x| |w| bounds both with room.
  constexpr double kMixedInputBudget = 4e-3;
  if (!kCutlassBuilt || !cuda::sm90a_available()) GTEST_SKIP() << "needs the CUTLASS build and a compute capability 9.0 GPU";
  struct Case {
    int64_t n, k, group;
    bool symmetric;
  };
  const Case cases[] = {{8, 64, 64, false},     {136, 1024, 128, false}, {72, 1120, 64, true},
                        {264, 4096, 0, false},  {40, 2048, 256, false},  {1032, 576, 64, false}};
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t st;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&st));
  {
    cuda::GemmContext ctx(st);
    uint32_t seed = 900;
    for (const Case& c : cases)
      for (int bits : {4, 8}) {
        const UniformQuantized q = uniform_weight(c.n, c.k, bits, c.group, c.symmetric, false, seed++);
        const PackedWeight pw = pack_uniform(q, storage);
        const cuda::DevicePackedWeight dw(pw);
        const cuda::UniformDevice u = dw.uniform();
        const std::string what = "uniform fused w" + std::to_string(bits) + " " + std::to_string(c.n) + "x" +
                                 std::to_string(c.k) + " g" + std::to_string(c.group) + (c.symmetric ? " sym" : "");
        ASSERT_TRUE(cuda::uniform_gemm_serves(u)) << what;
        ASSERT_NE(u.scales_mn, nullptr) << what;
        // The widened weights, as the kernel forms them.
        const int64_t G = q.groups();
        std::vector<double> wide(static_cast<size_t>(c.n * c.k));
        std::vector<float> wd(static_cast<size_t>(c.n * c.k));
        q.dequantize(wd.data());
        for (int64_t r = 0; r < c.n; ++r)
          for (int64_t j = 0; j < c.k; ++j) {
            const int64_t g = j / q.group_size;
            const float sc = f16_to_f32(q.scales[static_cast<size_t>(r * G + g)]);
            const float z = c.symmetric ? static_cast<float>(1 << (bits - 1)) : static_cast<float>(q.zeros[static_cast<size_t>(r * G + g)]);
            // q s is exact in fp32, and so is its sum with the fp16 zero term (their exponents differ by at most 8):
            // one rounding, as the kernel's fused multiply-add.
            const float qs = static_cast<float>(q.codes[static_cast<size_t>(r * c.k + j)]) * sc;
            wide[static_cast<size_t>(r * c.k + j)] = f16_to_f32(f32_to_f16(qs + f16_to_f32(f32_to_f16(-z * sc))));
          }
        for (int64_t m : {9, 64, 129, 300}) {
          const std::vector<float> x = test::random_x(m, c.k, seed++);
          std::vector<float> exact(static_cast<size_t>(m * c.n)), twin(exact.size());
          make_packed_linear(pw, nullptr, "t")->forward_ref(x.data(), m, exact.data(), 0);
          for (int64_t t = 0; t < m; ++t)
            for (int64_t r = 0; r < c.n; ++r) {
              double acc = 0;
              for (int64_t j = 0; j < c.k; ++j)
                acc += wide[static_cast<size_t>(r * c.k + j)] * f16_to_f32(f32_to_f16(x[static_cast<size_t>(t * c.k + j)]));
              twin[static_cast<size_t>(t * c.n + r)] = static_cast<float>(acc);
            }
          const std::vector<double> scale = abs_scale(x, wd, m, c.n, c.k);
          const auto got = run_poisoned(x, m * c.n, [&](const float* xd, float* yd) {
            cuda::uniform_gemm(u, xd, m, yd, ctx);
          });
          expect_close(got, twin, scale, kGemvBudget, what + " m" + std::to_string(m) + " (its arithmetic)");
          expect_close(got, exact, scale, kMixedInputBudget, what + " m" + std::to_string(m) + " (the format)");
          for (int tile : {128, 256}) {   // both token tiles, whichever the runtime takes at this m
            const auto t = run_poisoned(x, m * c.n, [&](const float* xd, float* yd) {
              cuda::uniform_gemm(u, xd, m, yd, ctx, tile);
            });
            expect_close(t, twin, scale, kGemvBudget, what + " m" + std::to_string(m) + " tile " + std::to_string(tile));
          }
          const cuda::LinearProblem p{FormatId::Uniform, c.n, c.k, m, bits, true, c.group};
          EXPECT_EQ(cuda::pick_kernel(p, cuda::runtime_gpu()), cuda::Kernel::UniformFused) << what << " m" << m;
          const auto via = run_packed(dw, 0, x, m, ctx);
          EXPECT_EQ(via, got) << what << " m" << m << ": packed_matmul runs the same kernel";
          if (m == 64) {
            set_knob(Knob::FusedGemm, 0);
            EXPECT_EQ(cuda::pick_kernel(p, cuda::runtime_gpu()), cuda::Kernel::DequantCublas) << what;
            const auto deq = run_packed(dw, 0, x, m, ctx);
            reset_knob(Knob::FusedGemm);
            expect_close(deq, exact, scale, kCublasBudget, what + " m64 dequantize + cuBLAS");
          }
        }
      }
    // Not served: the reason, and nothing launched.
    for (const auto& [bits, group, act_order] : {std::tuple{3, 128, false}, std::tuple{4, 128, true}, std::tuple{4, 32, false}}) {
      const UniformQuantized q = uniform_weight(64, 512, bits, group, false, act_order, seed++);
      const cuda::DevicePackedWeight dw(pack_uniform(q, storage));
      EXPECT_FALSE(cuda::uniform_gemm_serves(dw.uniform()));
      EXPECT_EQ(dw.uniform().scales_mn, nullptr) << "no MN-major operands derived for a weight the GEMM does not serve";
      cuda::DeviceBuffer<float> xd(static_cast<size_t>(16 * 512)), yd(static_cast<size_t>(16 * 64));
      test::expect_refused([&] { cuda::uniform_gemm(dw.uniform(), xd.get(), 16, yd.get(), ctx); }, "not served");
    }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(st));
}

// The fp16 dense GEMV (batch 1..8, dense_gemv.cu) against the fp64 product of the same fp16 weights: every batch, every
// rows-per-warp form, fp32 and fp16 activations, with and without the bias, on shapes whose rows are shorter than one
// warp's chunk (k = 8, 40), not a multiple of the 256-column step (264, 4104), long (11008), and n not a multiple of
// a CTA's rows (1, 7, 300, 1100). fp16 x is compared with the reference fed the same rounded x. Budget: the GEMVs'
// fp32-accumulation budget. Shapes it does not serve are refused.
TEST(CudaKernels, DenseF16GemvMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const Shape shapes[] = {{1, 8}, {7, 40}, {300, 264}, {1100, 4104}, {64, 11008}};
  for (const Shape& sh : shapes) {
    const int64_t n = sh.n, k = sh.k;
    std::mt19937 rng(static_cast<uint32_t>(n * 31 + k));
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::vector<uint16_t> wbits(static_cast<size_t>(n * k));
    std::vector<float> w(wbits.size()), bias(static_cast<size_t>(n));
    for (size_t i = 0; i < w.size(); ++i) {
      wbits[i] = f32_to_f16(nd(rng));
      w[i] = f16_to_f32(wbits[i]);
    }
    for (float& b : bias) b = nd(rng);
    const cuda::DeviceBuffer<uint16_t> wd(wbits);
    const cuda::DeviceBuffer<float> bd(bias);
    const auto* wh = reinterpret_cast<const __half*>(wd.get());
    for (int m = 1; m <= cuda::kMaxGemvBatch; ++m) {
      std::vector<float> x = test::random_x(m, k, static_cast<uint32_t>(m * 7 + k));
      std::vector<float> xr(x.size());   // x rounded to fp16 (the fp16-x form's input)
      std::vector<uint16_t> xbits(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xbits[i] = f32_to_f16(x[i]);
        xr[i] = f16_to_f32(xbits[i]);
      }
      const cuda::DeviceBuffer<uint16_t> xhd(xbits);
      for (bool half_x : {false, true}) {
        const std::vector<float>& xin = half_x ? xr : x;
        const std::vector<double> scale = abs_scale(xin, w, m, n, k);
        for (bool with_bias : {false, true}) {
          std::vector<float> want(static_cast<size_t>(m * n));
          for (int64_t t = 0; t < m; ++t)
            for (int64_t r = 0; r < n; ++r) {
              double a = with_bias ? bias[static_cast<size_t>(r)] : 0.0;
              for (int64_t c = 0; c < k; ++c)
                a += static_cast<double>(xin[static_cast<size_t>(t * k + c)]) * w[static_cast<size_t>(r * k + c)];
              want[static_cast<size_t>(t * n + r)] = static_cast<float>(a);
            }
          for (int rows : {0, 1, 2, 4}) {
            const auto got = run_poisoned(x, m * n, [&](const float* xd, float* yd) {
              const float* b = with_bias ? bd.get() : nullptr;
              if (half_x) cuda::dense_f16_gemv(wh, n, k, reinterpret_cast<const __half*>(xhd.get()), m, b, yd, nullptr, rows);
              else cuda::dense_f16_gemv(wh, n, k, xd, m, b, yd, nullptr, rows);
            });
            expect_close(got, want, scale, kGemvBudget,
                         "dense " + std::to_string(n) + "x" + std::to_string(k) + " m" + std::to_string(m) + " rows" +
                             std::to_string(rows) + (half_x ? " fp16 x" : " fp32 x") + (with_bias ? " bias" : ""));
          }
        }
      }
    }
  }
  cuda::DeviceBuffer<uint16_t> w(16 * 64);
  cuda::DeviceBuffer<float> x(9 * 64), y(9 * 16);
  const auto* wh = reinterpret_cast<const __half*>(w.get());
  EXPECT_TRUE(cuda::dense_gemv_fits(wh, 16, 64, 8, x.get()));
  EXPECT_FALSE(cuda::dense_gemv_fits(wh, 16, 64, 9, x.get()));        // batch above 8
  EXPECT_FALSE(cuda::dense_gemv_fits(wh, 16, 60, 1, x.get()));        // k not a multiple of 8
  EXPECT_FALSE(cuda::dense_gemv_fits(wh, 16, 64, 1, x.get() + 1));    // x not 16-byte aligned
  EXPECT_FALSE(cuda::dense_gemv_fits(wh + 4, 16, 64, 1, x.get()));    // W not 16-byte aligned
  try {
    cuda::dense_f16_gemv(wh, 16, 60, x.get(), 1, nullptr, y.get(), nullptr);
    ADD_FAILURE() << "k = 60 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k a positive multiple of 8"), std::string::npos) << e.what();
  }
  try {
    cuda::dense_f16_gemv(wh, 16, 64, x.get(), 1, nullptr, y.get(), nullptr, 3);
    ADD_FAILURE() << "3 rows per warp ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows per warp must be 1, 2 or 4"), std::string::npos) << e.what();
  }
}

// The fused any-precision GEMM (batches above 8: the staged kernel at 2..4 bits, the two-tile GEMVs at 2..8 bits and
// batch 9..16) against the CPU reference on the same packed bytes:
// without outliers, against the reference fed x rounded to fp16 (what the kernel multiplies), within the GEMV's
// fp32-accumulation budget; with outliers (added in fp32 by the CSR pass), against the fp32 reference within the
// x-rounding budget. Shapes: rows of a multiple of 4 words (16-byte plane copies) and not (1100 columns: 35 words),
// n not a multiple of the CTA's 128 rows, a split-k shape (few rows, long rows); batches across the 16 / 32 / 64-token
// tiles and several token blocks.
TEST(CudaKernels, AnyPrecFusedGemmMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t s;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&s));
  {
    cuda::GemmContext ctx(s);
    // 8000 rows: 500 register-table CTAs, the compact form at 2..3 bits (3..4 CTAs per SM); 8200 rows: the tall 8-bit
    // shared-table form (> 8192 rows); both at batch 9..16 only (the CPU reference's time).
    const struct {
      Shape sh;
      bool outliers;
      int64_t max_m;
    } cases[] = {{{96, 1100}, false, 520}, {{300, 4096}, false, 150}, {{136, 8192}, false, 150}, {{200, 1100}, true, 300},
                 {{130, 2048}, true, 150},  {{8000, 512}, false, 16},  {{8200, 512}, false, 16}};
    for (const auto& cs : cases) {
      const int64_t n = cs.sh.n, k = cs.sh.k;
      const AnyPrecQuantized q = test::random_anyprec(n, k, cs.outliers, static_cast<uint32_t>(n + k));
      const PackedWeight p = pack_anyprec(q, storage);
      const cuda::DevicePackedWeight dw(p);
      const auto lin = make_packed_linear(p, nullptr, "t");
      for (int bits : {2, 3, 4, 5, 8}) {
        std::vector<float> wd(static_cast<size_t>(n * k));
        q.dequantize(bits, wd.data());
        for (int64_t m : {9, 16, 17, 29, 33, 64, 70, 150, 260, 520}) {
          if ((k > 4096 && m > 64) || m > cs.max_m) continue;   // the CPU reference's time
          if (!cuda::anyprec_gemm_serves(bits, cuda::GemmKernel::Staged) && m > 16) continue;   // two tiles only
          const auto x = test::random_x(m, k, static_cast<uint32_t>(7 * m + bits));
          std::vector<float> xr = x;
          if (!cs.outliers)
            for (float& v : xr) v = f16_to_f32(f32_to_f16(v));
          std::vector<float> want(static_cast<size_t>(m * n));
          lin->forward_ref(xr.data(), m, want.data(), bits);
          const auto scale = abs_scale(xr, wd, m, n, k);
          for (cuda::GemmKernel kind : {cuda::GemmKernel::Staged, cuda::GemmKernel::TwoTiles, cuda::GemmKernel::WgmmaWs}) {
            if ((kind == cuda::GemmKernel::TwoTiles && m > 16) || !cuda::anyprec_gemm_serves(bits, kind)) continue;
            const auto got = run_poisoned(x, m * n, [&](const float* xd, float* yd) {
              cuda::anyprec_gemm(dw.anyprec(), bits, xd, m, yd, ctx, kind);
              LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
            });
            const std::string what = std::string(cuda::gemm_kernel_name(kind)) + " GEMM " +
                                     std::to_string(n) + "x" + std::to_string(k) + " " + std::to_string(bits) + "-bit m" +
                                     std::to_string(m) + (cs.outliers ? " outliers" : "");
            expect_close(got, want, scale, cs.outliers ? kFp16XBudget : kGemvBudget, what);
          }
        }
      }
    }
    // The warp-specialized kernel past one wave of tiles: 135 row blocks at 130 tokens, the first 132 tiles over all of
    // k written straight into y, the last 3 split in k (8 quads: 2 splits) and summed by the tile reduction.
    if (cuda::anyprec_gemm_serves(3, cuda::GemmKernel::WgmmaWs)) {
      const int64_t n = 128 * 135, k = 1024, m = 130;
      const AnyPrecQuantized q = test::random_anyprec(n, k, false, 11);
      const PackedWeight p = pack_anyprec(q, storage);
      const cuda::DevicePackedWeight dw(p);
      const auto lin = make_packed_linear(p, nullptr, "t");
      std::vector<float> wd(static_cast<size_t>(n * k));
      q.dequantize(3, wd.data());
      const auto x = test::random_x(m, k, 12);
      std::vector<float> xr = x;
      for (float& v : xr) v = f16_to_f32(f32_to_f16(v));
      std::vector<float> want(static_cast<size_t>(m * n));
      lin->forward_ref(xr.data(), m, want.data(), 3);
      const auto got = run_poisoned(x, m * n, [&](const float* xd, float* yd) {
        cuda::anyprec_gemm(dw.anyprec(), 3, xd, m, yd, ctx, cuda::GemmKernel::WgmmaWs);
        LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
      });
      expect_close(got, want, abs_scale(xr, wd, m, n, k), kGemvBudget, "warp-specialized wgmma GEMM 17280x1024 3-bit m130");
    }
    // On Hopper (compute capability 9.0) the wgmma kernel must have run above, not been skipped.
    int major = 0, minor = 0;
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    if (major == 9 && minor == 0) {
      EXPECT_TRUE(cuda::anyprec_gemm_serves(3, cuda::GemmKernel::WgmmaWs));
    }
    // Widths the fused GEMM does not serve are refused, not run.
    const cuda::DevicePackedWeight dw(pack_anyprec(test::random_anyprec(16, 256, false, 5), storage));
    cuda::DeviceBuffer<float> xd(static_cast<size_t>(16 * 256)), yd(static_cast<size_t>(16 * 16));
    EXPECT_THROW(cuda::anyprec_gemm(dw.anyprec(), 5, xd.get(), 16, yd.get(), ctx, cuda::GemmKernel::Staged), Error);
    EXPECT_THROW(cuda::anyprec_gemm(dw.anyprec(), 3, xd.get(), 8, yd.get(), ctx, cuda::GemmKernel::TwoTiles), Error);
    EXPECT_THROW(cuda::anyprec_gemm(dw.anyprec(), 5, xd.get(), 16, yd.get(), ctx, cuda::GemmKernel::WgmmaWs), Error);
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(s));
}

// The 2/4/16 two-tile GEMV (batch 9..16: the streamed tensor-core kernel with x entries of two fp16 columns) against
// the CPU reference on the same packed bytes: without outliers against the reference fed fp16-rounded x within the
// GEMV budget, with outliers (the CSR pass, fp32) against the fp32 reference within the x-rounding budget. k of 1024
// and 2048 (the streamed kernel's multiples of 256), n not a multiple of 16, and 4500 rows (282 tiles: more than the
// persistent grid's CTAs, so CTAs loop over tiles and reuse the epilogue's two buffers).
TEST(CudaKernels, Mixed24aTwoTileGemvMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  cudaStream_t s;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&s));
  {
    const struct {
      Shape sh;
      bool outliers;
    } cases[] = {{{100, 1024}, false}, {{300, 2048}, false}, {{130, 1024}, true}, {{4500, 1024}, true}};
    for (const auto& cs : cases) {
      const int64_t n = cs.sh.n, k = cs.sh.k;
      const Mixed24AQuantized q = test::random_mixed24a(n, k, cs.outliers, static_cast<uint32_t>(n + k));
      const PackedWeight p = pack_mixed24a(q, storage);
      const cuda::DevicePackedWeight dw(p);
      std::vector<float> wd(static_cast<size_t>(n * k));
      q.dequantize(wd.data());
      cuda::DeviceBuffer<uint8_t> xfrag(cuda::mixed24a_xfrag_bytes(k));
      for (int64_t m : {9, 13, 16}) {
        const auto x = test::random_x(m, k, static_cast<uint32_t>(3 * m + k));
        std::vector<float> xr = x;
        if (!cs.outliers)
          for (float& v : xr) v = f16_to_f32(f32_to_f16(v));
        std::vector<float> want(static_cast<size_t>(m * n));
        mixed24a_gemm_packed_ref(p, xr.data(), m, nullptr, want.data());
        const auto got = run_poisoned(x, m * n, [&](const float* xd, float* yd) {
          cuda::mixed24a_gemv_two_tiles(dw.mixed24a(), xd, static_cast<int>(m), yd, s, xfrag.get());
          LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
        });
        expect_close(got, want, abs_scale(xr, wd, m, n, k), cs.outliers ? kFp16XBudget : kGemvBudget,
                     "mixed24a two-tile " + std::to_string(n) + "x" + std::to_string(k) + " m" + std::to_string(m) +
                         (cs.outliers ? " outliers" : ""));
      }
    }
    const cuda::DevicePackedWeight dw(pack_mixed24a(test::random_mixed24a(16, 640, false, 9), storage));
    cuda::DeviceBuffer<float> xd(static_cast<size_t>(16 * 640)), yd(static_cast<size_t>(16 * 16));
    cuda::DeviceBuffer<uint8_t> xfrag(cuda::mixed24a_xfrag_bytes(640));
    EXPECT_THROW(cuda::mixed24a_gemv_two_tiles(dw.mixed24a(), xd.get(), 16, yd.get(), s, xfrag.get()), Error) << "k 640";
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(s));
}

// The CPU Sampler's rules, exactly, as probabilities: temperature, top-k (ties by the lower index), then the smallest
// descending prefix whose mass reaches top-p (all ties at its boundary kept, as the GPU does).
std::vector<double> kept_distribution(const std::vector<float>& logits, const cuda::GpuSamplingParams& p) {
  const int V = static_cast<int>(logits.size());
  std::vector<int> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::vector<float> x(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) x[static_cast<size_t>(i)] = logits[static_cast<size_t>(i)] * (1.0f / p.temperature);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]; });
  const int k = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  const double mx = x[static_cast<size_t>(order[0])];
  double z = 0;
  for (int r = 0; r < k; ++r) z += std::exp(static_cast<double>(x[static_cast<size_t>(order[static_cast<size_t>(r)])]) - mx);
  int keep = k;
  if (p.top_p < 1.0f) {
    double cum = 0;
    keep = 0;
    while (keep < k) {
      cum += std::exp(static_cast<double>(x[static_cast<size_t>(order[static_cast<size_t>(keep)])]) - mx) / z;
      ++keep;
      if (cum >= p.top_p) break;
    }
    while (keep < k && x[static_cast<size_t>(order[static_cast<size_t>(keep)])] == x[static_cast<size_t>(order[static_cast<size_t>(keep - 1)])]) ++keep;
  }
  std::vector<double> prob(static_cast<size_t>(V), 0.0);
  double s = 0;
  for (int r = 0; r < keep; ++r) s += prob[static_cast<size_t>(order[static_cast<size_t>(r)])] = std::exp(static_cast<double>(x[static_cast<size_t>(order[static_cast<size_t>(r)])]) - mx);
  for (double& q : prob) q /= s;
  return prob;
}

// With N stratified uniforms u_i = (i + 0.5) / N, inverse-CDF sampling draws every token within one count of
// p_j * N: the GPU's empirical frequencies must match the CPU rules' probabilities to 1.5 / N, and never pick a
// token outside the kept set.
TEST(CudaKernels, SamplingDrawsTheCpuSamplersDistribution) {
  SKIP_WITHOUT_GPU();
  const int V = 3001, N = 4096;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> row(static_cast<size_t>(V));
  for (float& v : row) v = nd(rng);
  row[17] = row[18] = row[40] = 7.5f;   // ties at the top
  std::vector<float> logits;
  for (int i = 0; i < N; ++i) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<float> u(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) u[static_cast<size_t>(i)] = (static_cast<float>(i) + 0.5f) / static_cast<float>(N);
  cuda::DeviceBuffer<float> ld(logits), ud(u);
  cuda::DeviceBuffer<int32_t> out(static_cast<size_t>(N));
  for (const cuda::GpuSamplingParams& p : {cuda::GpuSamplingParams{1.0f, 0, 1.0f}, cuda::GpuSamplingParams{0.7f, 50, 1.0f},
                                          cuda::GpuSamplingParams{1.3f, 0, 0.8f}, cuda::GpuSamplingParams{1.0f, 20, 0.5f},
                                          cuda::GpuSamplingParams{1.0f, 2, 1.0f}, cuda::GpuSamplingParams{1.0f, 1, 1.0f}}) {
    LOWBIT_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.bytes()));
    cuda::sample_rows(ld.get(), N, V, p, ud.get(), out.get(), nullptr);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = out.download();
    const std::vector<double> want = kept_distribution(row, p);
    std::vector<int> count(static_cast<size_t>(V), 0);
    int outside = 0;
    for (int32_t t : got) {
      if (t < 0 || t >= V || want[static_cast<size_t>(t)] == 0) ++outside;
      else ++count[static_cast<size_t>(t)];
    }
    EXPECT_EQ(outside, 0) << "T " << p.temperature << " k " << p.top_k << " p " << p.top_p;
    double worst = 0;
    for (int j = 0; j < V; ++j) worst = std::max(worst, std::fabs(count[static_cast<size_t>(j)] / static_cast<double>(N) - want[static_cast<size_t>(j)]));
    EXPECT_LE(worst, 1.5 / N) << "T " << p.temperature << " k " << p.top_k << " p " << p.top_p;
  }
  // top-k 1 picks the lowest-index maximum (17 of the three tied), whatever u is.
  const std::vector<int32_t> last = out.download();
  EXPECT_EQ(std::count(last.begin(), last.end(), 17), N);
}

// The GPU attention against a CPU twin on the same fp16 cache: every head dimension path (the compile-time 64 / 128
// / 256 kernels and the generic one), GQA, a sliding window, key splits merged by the combine kernel and (up to 8
// splits) inside thread-block clusters, the two bit for bit the same, rows of two sequences at different positions.
// Output poisoned with NaN first.
TEST(CudaKernels, AttentionMatchesCpuTwinEveryHeadDimWindowAndSplit) {
  SKIP_WITHOUT_GPU();
  const int layers = 2, layer = 1, capacity = 300, seqs = 2;
  // 4 rows: the decode form of the kernel (values prefetched with the keys); 12 rows: the prefill form.
  for (const auto& [seq, pos] : std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>{
           {{0, 0, 1, 1}, {0, 41, 7, 299}},
           {{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1}, {0, 5, 41, 100, 200, 299, 7, 8, 50, 150, 250, 298}}})
  for (const int rows : {static_cast<int>(seq.size())})
  for (const int hd : {8, 64, 96, 128, 256})
    for (const auto& [heads, kv_heads] : std::vector<std::pair<int, int>>{{4, 4}, {8, 2}})
      for (const int window : {0, 37})
        for (const int splits : {1, 3, 8, 9}) {
          const int kvd = kv_heads * hd;
          std::mt19937 rng(static_cast<uint32_t>(hd * 1000 + heads * 10 + window + splits));
          std::normal_distribution<float> nd;
          std::vector<uint16_t> kc(static_cast<size_t>(seqs) * layers * capacity * kvd), vc(kc.size());
          for (auto& v : kc) v = f32_to_f16(nd(rng));
          for (auto& v : vc) v = f32_to_f16(nd(rng));
          std::vector<float> q(static_cast<size_t>(rows) * heads * hd);
          for (auto& v : q) v = nd(rng);
          // CPU twin: softmax(q k / sqrt(hd)) v over keys [first, pos] of the row's sequence, in double.
          std::vector<float> want(q.size());
          double scale_out = 0;
          for (int r = 0; r < rows; ++r)
            for (int h = 0; h < heads; ++h) {
              const int kvh = h / (heads / kv_heads), p = pos[static_cast<size_t>(r)];
              const int first = window > 0 ? std::max(0, p - window + 1) : 0;
              const size_t base = ((static_cast<size_t>(seq[static_cast<size_t>(r)]) * layers + layer) * capacity) * kvd + static_cast<size_t>(kvh) * hd;
              std::vector<double> sc;
              double mx = -1e300;
              for (int j = first; j <= p; ++j) {
                double d = 0;
                for (int i = 0; i < hd; ++i)
                  d += static_cast<double>(q[(static_cast<size_t>(r) * heads + h) * hd + i]) * f16_to_f32(kc[base + static_cast<size_t>(j) * kvd + i]);
                sc.push_back(d / std::sqrt(static_cast<double>(hd)));
                mx = std::max(mx, sc.back());
              }
              double l = 0;
              for (double& v : sc) l += (v = std::exp(v - mx));
              for (int i = 0; i < hd; ++i) {
                double a = 0;
                for (int j = first; j <= p; ++j) a += sc[static_cast<size_t>(j - first)] * f16_to_f32(vc[base + static_cast<size_t>(j) * kvd + i]);
                want[(static_cast<size_t>(r) * heads + h) * hd + i] = static_cast<float>(a / l);
                scale_out = std::max(scale_out, std::fabs(a / l));
              }
            }
          // The same cache paged (KvMap): blocks of 16 positions in a shuffled order, two spare blocks in the pool.
          const int block = 16, max_blocks = (capacity + block - 1) / block, pool = seqs * max_blocks + 2;
          std::vector<int32_t> table(static_cast<size_t>(seqs) * max_blocks);
          std::vector<int32_t> order(static_cast<size_t>(pool));
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), rng);
          std::copy_n(order.begin(), table.size(), table.begin());
          std::vector<uint16_t> kp(static_cast<size_t>(pool) * layers * block * kvd), vp(kp.size());
          for (int b = 0; b < seqs; ++b)
            for (int l = 0; l < layers; ++l)
              for (int j = 0; j < capacity; ++j) {
                const size_t from = ((static_cast<size_t>(b) * layers + l) * capacity + j) * kvd;
                const size_t to = ((static_cast<size_t>(table[static_cast<size_t>(b) * max_blocks + j / block]) * layers + l) * block + j % block) * kvd;
                std::copy_n(kc.begin() + static_cast<std::ptrdiff_t>(from), kvd, kp.begin() + static_cast<std::ptrdiff_t>(to));
                std::copy_n(vc.begin() + static_cast<std::ptrdiff_t>(from), kvd, vp.begin() + static_cast<std::ptrdiff_t>(to));
              }
          cuda::DeviceBuffer<uint16_t> kd(kc), vd(vc), kpd(kp), vpd(vp);
          cuda::DeviceBuffer<int32_t> sd(seq), pd(pos), td(table);
          const cuda::KvMap contiguous{nullptr, 1, 31, capacity, layers};
          const cuda::KvMap paged{td.get(), max_blocks, 4, block, layers};
          cuda::DeviceBuffer<float> scratch(static_cast<size_t>(rows) * heads * splits * (hd + 2));
          // single_token: the decode form's keys loaded before the PDL wait (the cache is complete here either way).
          const bool cluster_was = cuda::cluster_combine_enabled();
          for (const bool single_token : {false, true}) {
            std::vector<float> by_kernel;
            for (const bool cluster : {false, true})
            for (const bool is_paged : {false, true}) {
              cuda::set_cluster_combine(cluster);
              const std::vector<float> got = run_poisoned(q, static_cast<int64_t>(q.size()), [&](const float* qd, float* out) {
                cuda::attention(qd, sd.get(), pd.get(), rows, heads, kv_heads, hd, layer, is_paged ? paged : contiguous,
                                window, reinterpret_cast<const __half*>((is_paged ? kpd : kd).get()),
                                reinterpret_cast<const __half*>((is_paged ? vpd : vd).get()), out, splits, scratch.get(),
                                single_token, nullptr);
              });
              const std::string what = "attention hd " + std::to_string(hd) + " heads " + std::to_string(heads) + "/" +
                                       std::to_string(kv_heads) + " window " + std::to_string(window) + " splits " +
                                       std::to_string(splits) + (single_token ? " single token" : "") +
                                       (cuda::attention_combines_in_cluster(splits) ? " (cluster)" : "") +
                                       (is_paged ? " paged" : "");
              double worst = 0;
              int bad = 0;
              for (size_t i = 0; i < got.size(); ++i) {
                const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
                worst = std::max(worst, err);
                if (!(err <= 1e-4 * std::max(1.0, scale_out))) ++bad;   // NaN (unwritten) counts as bad
              }
              EXPECT_EQ(bad, 0) << what << ": worst |error| " << worst;
              // Every form (cluster merge or combine kernel, paged or contiguous) sums the same keys in the same
              // order: the same bits.
              if (!cluster && !is_paged) by_kernel = got;
              else EXPECT_EQ(0, std::memcmp(got.data(), by_kernel.data(), sizeof(float) * got.size())) << what << ": not the contiguous combine kernel's bits";
            }
          }
          cuda::set_cluster_combine(cluster_was);
          if (splits > 1 && splits <= 8) {
            EXPECT_TRUE(cuda::attention_combines_in_cluster(splits) || !cluster_was);
          }
        }
}

// The fused residual add + RMSNorm (+ fp16 copy) against a CPU twin: the float4 kernel (dim a multiple of 4, one to
// four float4 per thread) and the generic one (other widths), with and without the residual.
TEST(CudaKernels, ResidualRmsNormMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  for (const int dim : {32, 576, 4096, 8192, 16384, 4098, 20000})
    for (const bool residual : {false, true}) {
      const int rows = 3;
      const float eps = 1e-5f;
      const std::vector<float> x = test::random_x(rows, dim, static_cast<uint32_t>(dim)), d = test::random_x(rows, dim, 99),
                               w = test::random_x(1, dim, 7);
      std::vector<float> want_x = x, want_y(x.size());
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) {
          float& v = want_x[static_cast<size_t>(r) * dim + i];
          if (residual) v += d[static_cast<size_t>(r) * dim + i];
          ss += static_cast<double>(v) * v;
        }
        const double inv = 1.0 / std::sqrt(ss / dim + eps);
        for (int i = 0; i < dim; ++i)
          want_y[static_cast<size_t>(r) * dim + i] = static_cast<float>(w[static_cast<size_t>(i)] * (want_x[static_cast<size_t>(r) * dim + i] * inv));
      }
      cuda::DeviceBuffer<float> xd(x), dd(d), wd(w), yd(x.size());
      cuda::DeviceBuffer<uint16_t> hd(x.size());
      LOWBIT_CUDA_CHECK(cudaMemset(yd.get(), 0xFF, yd.bytes()));
      LOWBIT_CUDA_CHECK(cudaMemset(hd.get(), 0xFF, hd.bytes()));
      cuda::rmsnorm(xd.get(), residual ? dd.get() : nullptr, wd.get(), yd.get(), reinterpret_cast<__half*>(hd.get()), rows,
                    dim, eps, nullptr);
      LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got_x = xd.download(), got_y = yd.download();
      const std::vector<uint16_t> got_h = hd.download();
      int bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        bad += !(std::fabs(got_x[i] - want_x[i]) <= 1e-6f * (1.0f + std::fabs(want_x[i])));
        bad += !(std::fabs(got_y[i] - want_y[i]) <= 1e-5f * (1.0f + std::fabs(want_y[i])));
        bad += !(std::fabs(f16_to_f32(got_h[i]) - want_y[i]) <= 1e-3f * (1.0f + std::fabs(want_y[i])));
      }
      EXPECT_EQ(bad, 0) << "rmsnorm dim " << dim << (residual ? " with residual" : "");
    }
}

TEST(CudaKernels, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  AnyPrecQuantized q = test::random_codes(4, 64, 4, 0x18u, 3);   // serves 3 and 4 only
  const cuda::DevicePackedWeight dw(pack_anyprec(q, storage));
  cuda::DeviceBuffer<float> x(64 * 9), y(4 * 9);
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 5, x.get(), 1, y.get(), nullptr); }, "width 5 is not served");
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 3, x.get(), 9, y.get(), nullptr); }, "batch 9 outside 1..8");
  cuda::DeviceBuffer<uint8_t> xfrag(cuda::anyprec_xfrag_bytes(64));
  AnyPrecQuantized q5 = test::random_codes(4, 64, 5, 0x20u, 4);   // serves 5 only
  const cuda::DevicePackedWeight dw5(pack_anyprec(q5, storage));
  test::expect_refused([&] { cuda::anyprec_gemv(dw5.anyprec(), 5, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                cuda::GemvPath::TensorCoreRegisterLut, xfrag.get()); },
       "register tables serve 2..4 bits");
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 3, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                cuda::GemvPath::TensorCoreRegisterLut); },
       "no xfrag scratch");
  const PackedWeight mp = pack_mixed24a(test::random_mixed24a(16, 64, false, 5), storage);
  const cuda::DevicePackedWeight dm(mp);
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                 cuda::GemvPath::TensorCoreRegisterLut); },
       "register tables are an any-precision path");
  // The streamed kernels refuse shapes and formats they do not serve rather than running another path.
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 3, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                cuda::GemvPath::TensorCoreRegisterLutStream, xfrag.get()); },
       "streamed register-table kernel needs k a multiple of 128 and >= 2048");
  test::expect_refused([&] { cuda::anyprec_gemv(dw5.anyprec(), 5, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                cuda::GemvPath::TensorCoreSharedLutStream, xfrag.get()); },
       "streamed shared-table kernel serves 5..8 bits with pre-split activations, k a multiple of 64 and >= 2048");
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 3, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                cuda::GemvPath::TensorCoreStream, xfrag.get()); },
       "the streamed tensor-core kernel is a 2/4/16 path");
  cuda::DeviceBuffer<uint8_t> mfrag(cuda::mixed24a_xfrag_bytes(64));
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                 cuda::GemvPath::TensorCoreStream, mfrag.get()); },
       "streamed tensor-core kernel needs pre-split activations and k a multiple of 256");
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                 cuda::GemvPath::TensorCoreRegisterLutStream, mfrag.get()); },
       "register tables are an any-precision path");
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 3, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                cuda::GemvPath::TensorCoreInt8LutStream, xfrag.get()); },
       "int8 GEMV: needs k a multiple of 128 and >= 2048");
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                 cuda::GemvPath::TensorCoreInt8LutStream, mfrag.get()); },
       "register tables are an any-precision path");
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                 cuda::GemvPath::Dp2aStream, mfrag.get()); },
       "the integer-dot kernel needs an xfrag scratch, batch 1..2 and k a multiple of 256");
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused, cuda::GemvPath::Dp2aStream); },
       "no xfrag");
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 3, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused, cuda::GemvPath::Dp2aStream,
                                mfrag.get()); },
       "the integer-dot and int8 tensor-core 2/4/16 kernels are 2/4/16 paths");
  test::expect_refused([&] { cuda::anyprec_gemv(dw.anyprec(), 3, x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused, cuda::GemvPath::Int8MmaStream,
                                mfrag.get()); },
       "the integer-dot and int8 tensor-core 2/4/16 kernels are 2/4/16 paths");
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused,
                                 cuda::GemvPath::Int8MmaStream, mfrag.get()); },
       "the int8 tensor-core kernel needs an xfrag scratch and k a multiple of 256");
  test::expect_refused([&] { cuda::mixed24a_gemv(dm.mixed24a(), x.get(), 1, y.get(), nullptr, cuda::OutlierMode::Fused, cuda::GemvPath::Int8MmaStream); },
       "no xfrag");
  test::expect_refused([&] { (void)dw.mixed24a(); }, "a mixed24a view of a anyprec weight");
  PackedWeight no_act = pack_quik(test::random_quik(4, 64, 4, 8, false, 2, 1), storage);
  no_act.params.erase("abits");
  test::expect_refused([&] { cuda::DevicePackedWeight bad(no_act); }, "stays on the CPU: its activation parameters are missing");
}

}  // namespace
}  // namespace lowbit

#else
TEST(CudaKernels, SkippedWithoutCudaToolkit) { GTEST_SKIP() << "GPU tests skipped: lowbit was built without CUDA"; }
#endif
