// The mixed-width any-precision GEMV (anyprec_gemv_mixed: each activation row at its own width, the planes read once
// for the widest) on the same packed bytes as the format's CPU reference: every row against the reference GEMM at
// that row's width, and against the single-width GEMV run on that row alone; both forms (CUDA cores; tensor cores with
// x split in the loop or read pre-split); max_bits 2..8 over an 8-bit parent, and a 6-plane parent serving 3, 4 and 6;
// batches 1..8; mixes of one width, of every width, random ones and padding (rows repeating the last real row); with
// and without outliers. A captured CUDA graph of one launch replayed with new widths gives each mix's answer, and a row
// at a width the weight does not serve comes out NaN. Outputs are poisoned with NaN before every launch, so an element
// a kernel fails to write fails the test. Without a GPU every test skips and says why.
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LOWBIT_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "backend_cuda/anyprec/anyprec.h"
#include "core/half.h"
#include "formats/format_table.h"
#include "packed_fixtures.h"

namespace lowbit {
namespace {

// Error budget, relative to sum_c |x_c| |w_rc| of each output (the scale of its rounding error), as the single-width
// GEMV tests (test_cuda_kernels.cpp): fp32 accumulation in another order than the fp64 reference; the tensor-core form
// multiplies the exact fp16 centroids by x split into fp16 hi + lo (~22 bits), so its products carry no more error than
// the accumulation. The same budget holds between the mixed GEMV and the single-width one (both within it of the
// reference, and in practice within fp32 rounding of each other: a row sums the same products).
constexpr double kGemvBudget = 1e-5;

constexpr int kSources = cuda::kMaxGemvBatch;   // activation rows a mix draws from

// One packed weight on the device with, for each served width b and source row s of x [kSources, k], the CPU
// reference y (forward_ref, fp64 sums) and each output's scale sum_c |x_c| |w_rc|.
struct Fixture {
  AnyPrecQuantized q;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  PackedWeight pw;
  std::unique_ptr<cuda::DevicePackedWeight> dw;
  std::vector<float> x;                                 // [kSources, k]
  std::map<int, std::vector<std::vector<float>>> ref;   // width -> source -> [n]
  std::map<int, std::vector<std::vector<double>>> scale;

  Fixture(AnyPrecQuantized quant, uint32_t seed) : q(std::move(quant)) {
    pw = pack_anyprec(q, storage);
    validate_packed(pw, "t");
    dw = std::make_unique<cuda::DevicePackedWeight>(pw);
    x = test::random_x(kSources, q.k, seed);
    const auto cpu = make_packed_linear(pw, nullptr, "t");
    std::vector<float> wd(static_cast<size_t>(q.n * q.k));
    for (int b : q.served_widths()) {
      q.dequantize(b, wd.data());
      auto& rb = ref[b];
      auto& sb = scale[b];
      for (int s = 0; s < kSources; ++s) {
        const float* xs = x.data() + static_cast<size_t>(s) * q.k;
        rb.emplace_back(static_cast<size_t>(q.n));
        cpu->forward_ref(xs, 1, rb.back().data(), b);
        std::vector<double>& sc = sb.emplace_back(static_cast<size_t>(q.n));
        for (int64_t r = 0; r < q.n; ++r) {
          double a = 0;
          for (int64_t c = 0; c < q.k; ++c) a += std::fabs(static_cast<double>(xs[c]) * wd[static_cast<size_t>(r * q.k + c)]);
          sc[static_cast<size_t>(r)] = a;
        }
      }
    }
  }
  // x rows src[0..m-1], one after another.
  std::vector<float> gather(const std::vector<int>& src) const {
    std::vector<float> out;
    for (int s : src) out.insert(out.end(), x.begin() + static_cast<int64_t>(s) * q.k, x.begin() + static_cast<int64_t>(s + 1) * q.k);
    return out;
  }
};

// Each output row r of y [m, n] within kGemvBudget (relative to its scale at width bits[r]) of want(r) [n].
template <typename Want>
void expect_rows_close(const Fixture& f, const std::vector<float>& y, const std::vector<int>& bits, const std::vector<int>& src,
                       Want want, const std::string& what) {
  const int64_t n = f.q.n;
  ASSERT_EQ(y.size(), static_cast<size_t>(n) * bits.size());
  int bad = 0;
  for (size_t r = 0; r < bits.size(); ++r) {
    const std::vector<float>& w = want(r);
    const std::vector<double>& sc = f.scale.at(bits[r])[static_cast<size_t>(src[r])];
    for (int64_t i = 0; i < n; ++i) {
      const double got = y[r * n + static_cast<size_t>(i)], err = std::fabs(got - w[static_cast<size_t>(i)]);
      if (!(err <= kGemvBudget * sc[static_cast<size_t>(i)] + 1e-30) && bad++ < 3)   // NaN (unwritten) fails here too
        ADD_FAILURE() << what << ": row " << r << " (width " << bits[r] << ") output " << i << " got " << got << " want "
                      << w[static_cast<size_t>(i)] << " (budget " << kGemvBudget * sc[static_cast<size_t>(i)] << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::string mix_name(const std::vector<int>& bits) {
  std::string s;
  for (int b : bits) {
    if (!s.empty()) s += '/';
    s += std::to_string(b);
  }
  return s;
}

// The forms the mixed GEMV runs in: CUDA cores; tensor cores splitting x in the loop; tensor cores reading x pre-split.
struct Form {
  cuda::GemvPath path;
  bool presplit;
  const char* name;
};
constexpr Form kForms[] = {{cuda::GemvPath::Scalar, false, "CUDA cores"},
                           {cuda::GemvPath::TensorCore, false, "tensor cores"},
                           {cuda::GemvPath::TensorCore, true, "tensor cores, x pre-split"}};

// Runs the mixed GEMV (y poisoned) on x rows src at widths bits; returns y [m, n].
std::vector<float> run_mixed(const Fixture& f, int max_bits, const std::vector<int>& bits, const std::vector<int>& src, const Form& form) {
  const int m = static_cast<int>(bits.size());
  const int64_t n = f.q.n, k = f.q.k;
  cuda::DeviceBuffer<float> xd(f.gather(src)), yd(static_cast<size_t>(m * n));
  cuda::DeviceBuffer<int32_t> bd(std::vector<int32_t>(bits.begin(), bits.end()));
  cuda::DeviceBuffer<uint8_t> xfrag(cuda::anyprec_xfrag_bytes(k));
  LOWBIT_CUDA_CHECK(cudaMemset(yd.get(), 0xFF, yd.bytes()));
  LOWBIT_CUDA_CHECK(cudaMemset(xfrag.get(), 0xFF, xfrag.bytes()));   // every fragment read must have been written
  cuda::anyprec_gemv_mixed(f.dw->anyprec(), max_bits, bd.get(), xd.get(), m, yd.get(), nullptr, form.path,
                           form.presplit ? xfrag.get() : nullptr);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  return yd.download();
}

// The single-width GEMV on one source row at width b, in the form that matches the mixed one (CUDA cores, or the
// shared-table tensor-core kernel splitting x in its loop: the tensor-core mixed kernel's arithmetic), cached.
class SingleRows {
 public:
  explicit SingleRows(const Fixture& f) : f_(f) {}
  const std::vector<float>& get(int b, int s, cuda::GemvPath path) {
    auto key = std::make_tuple(b, s, path);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const int64_t n = f_.q.n;
    cuda::DeviceBuffer<float> xd(f_.gather({s})), yd(static_cast<size_t>(n));
    LOWBIT_CUDA_CHECK(cudaMemset(yd.get(), 0xFF, yd.bytes()));
    cuda::anyprec_gemv(f_.dw->anyprec(), b, xd.get(), 1, yd.get(), nullptr, cuda::OutlierMode::Fused, path);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    return cache_[key] = yd.download();
  }

 private:
  const Fixture& f_;
  std::map<std::tuple<int, int, cuda::GemvPath>, std::vector<float>> cache_;
};

// The mixes of m rows whose widths are served and at most max_bits (widths: those, ascending), each with its source
// rows: all rows at max_bits (when served) and all at the narrowest; every width in turn; random widths from random
// sources; padding (the real rows first, then copies of the last real row, source and width).
struct Mix {
  std::vector<int> bits, src;
};
std::vector<Mix> mixes_for(const std::vector<int>& widths, int max_bits, int m, std::mt19937& rng) {
  std::vector<Mix> out;
  std::vector<int> ident(static_cast<size_t>(m));
  for (int r = 0; r < m; ++r) ident[static_cast<size_t>(r)] = r;
  if (widths.back() == max_bits) out.push_back({std::vector<int>(static_cast<size_t>(m), max_bits), ident});
  if (widths.front() != max_bits) out.push_back({std::vector<int>(static_cast<size_t>(m), widths.front()), ident});
  Mix cycle{{}, ident};
  for (int r = 0; r < m; ++r) cycle.bits.push_back(widths[static_cast<size_t>(r) % widths.size()]);
  out.push_back(cycle);
  Mix rnd;
  for (int r = 0; r < m; ++r) {
    rnd.bits.push_back(widths[rng() % widths.size()]);
    rnd.src.push_back(static_cast<int>(rng() % kSources));
  }
  out.push_back(rnd);
  if (m >= 2) {
    const int real = 1 + static_cast<int>(rng() % static_cast<unsigned>(m - 1));
    Mix pad;
    for (int r = 0; r < m; ++r) {
      if (r < real) {
        pad.bits.push_back(widths[rng() % widths.size()]);
        pad.src.push_back(r);
      } else {
        pad.bits.push_back(pad.bits.back());
        pad.src.push_back(pad.src.back());
      }
    }
    out.push_back(pad);
  }
  return out;
}

// Every mix at every max_bits and batch against the reference and the single-width GEMV, in every form.
void check_all_mixes(const Fixture& f, uint32_t seed, const std::string& what) {
  SingleRows single(f);
  std::mt19937 rng(seed);
  const int top = std::min(f.q.planes, 8);
  for (int max_bits = 2; max_bits <= top; ++max_bits) {
    std::vector<int> widths;
    for (int b : f.q.served_widths())
      if (b <= max_bits) widths.push_back(b);
    if (widths.empty()) continue;
    for (int m = 1; m <= cuda::kMaxGemvBatch; ++m)
      for (const Mix& mix : mixes_for(widths, max_bits, m, rng))
        for (const Form& form : kForms) {
          const std::vector<float> y = run_mixed(f, max_bits, mix.bits, mix.src, form);
          const std::string name = what + " " + form.name + " max_bits " + std::to_string(max_bits) + " m" + std::to_string(m) +
                                   " widths " + mix_name(mix.bits);
          expect_rows_close(f, y, mix.bits, mix.src,
                            [&](size_t r) -> const std::vector<float>& { return f.ref.at(mix.bits[r])[static_cast<size_t>(mix.src[r])]; },
                            name + " vs CPU reference");
          const cuda::GemvPath single_path = form.path == cuda::GemvPath::Scalar ? cuda::GemvPath::Scalar : cuda::GemvPath::TensorCore;
          expect_rows_close(f, y, mix.bits, mix.src,
                            [&](size_t r) -> const std::vector<float>& { return single.get(mix.bits[r], mix.src[r], single_path); },
                            name + " vs the single-width GEMV on the row alone");
          if (::testing::Test::HasFailure()) return;   // the first failing case says enough
        }
  }
}

struct Shape {
  int64_t n, k;
};
// k: one word; three words (a part group of 4); not a multiple of 32 / 256 / 1024 with a short last tile (1100: 35 words,
// the last tile 3); 2348 (74 words); a multiple of 4 words ending in a part group (4200); a 28672-wide input. n: 1 row;
// 5 and 33 (a part 16-row tensor-core tile, part rows per CUDA-core warp); 257 (17 tiles, the last of one row).
constexpr Shape kShapes[] = {{1, 32}, {130, 96}, {5, 1100}, {33, 2348}, {64, 4096}, {37, 4200}, {257, 1024}, {3, 28672 + 37}};

// One test per shape (CudaMixedWidth/AnyPrecMixedSweep.RowsMatchTheirWidth/i), as the single-width sweep.
class AnyPrecMixedSweep : public ::testing::TestWithParam<int> {};
TEST_P(AnyPrecMixedSweep, RowsMatchTheirWidth) {
  SKIP_WITHOUT_GPU();
  const Shape sh = kShapes[GetParam()];
  const uint32_t seed = 7 + 1000 * static_cast<uint32_t>(GetParam());
  for (bool outliers : {false, true}) {
    const Fixture f(test::random_anyprec(sh.n, sh.k, outliers, seed + (outliers ? 1 : 0)), seed + 2);
    check_all_mixes(f, seed + 3, std::to_string(sh.n) + "x" + std::to_string(sh.k) + (outliers ? " outliers" : ""));
    if (HasFailure()) return;
  }
}
INSTANTIATE_TEST_SUITE_P(CudaMixedWidth, AnyPrecMixedSweep, ::testing::Range(0, static_cast<int>(std::size(kShapes))));

// A 6-plane parent serving 3, 4 and 6 only: max_bits up to the planes, max_bits 5 (planes read, no table of its own),
// and the narrowest served width above 2.
TEST(CudaMixedWidth, SixPlaneParentServingThreeFourSix) {
  SKIP_WITHOUT_GPU();
  for (bool outliers : {false, true}) {
    const Fixture f(test::random_anyprec(45, 2100, outliers, 31, 6, (1u << 3) | (1u << 4) | (1u << 6)), 32);
    check_all_mixes(f, 33, std::string("45x2100 6-plane") + (outliers ? " outliers" : ""));
    if (HasFailure()) return;
  }
}

// One captured launch per form, replayed with the widths changed in device memory between replays: each replay gives
// its mix's answer (the widths are read by the kernels, not baked into the launch).
TEST(CudaMixedWidth, GraphReplaysFollowNewWidths) {
  SKIP_WITHOUT_GPU();
  const Fixture f(test::random_anyprec(96, 2348, true, 41), 42);
  const int64_t n = f.q.n, k = f.q.k;
  const int m = cuda::kMaxGemvBatch;
  std::vector<int> src(static_cast<size_t>(m));
  for (int r = 0; r < m; ++r) src[static_cast<size_t>(r)] = r;
  const std::vector<std::vector<int>> mixes = {{3, 4, 8, 3, 4, 8, 3, 4}, {8, 8, 8, 8, 8, 8, 8, 8}, {2, 3, 4, 5, 6, 7, 8, 3}, {3, 8, 3, 8, 8, 8, 8, 8}};
  cudaStream_t s = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (const Form& form : kForms) {
    cuda::DeviceBuffer<float> xd(f.gather(src)), yd(static_cast<size_t>(m * n));
    cuda::DeviceBuffer<int32_t> bd(static_cast<size_t>(m));
    cuda::DeviceBuffer<uint8_t> xfrag(cuda::anyprec_xfrag_bytes(k));
    bd.upload(std::vector<int32_t>(mixes[0].begin(), mixes[0].end()).data(), static_cast<size_t>(m));
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());   // the uploads (legacy stream) before work on s, which does not wait for it
    // Once outside the capture (as the runtime warms up before it captures), then captured.
    cuda::anyprec_gemv_mixed(f.dw->anyprec(), 8, bd.get(), xd.get(), m, yd.get(), s, form.path, form.presplit ? xfrag.get() : nullptr);
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LOWBIT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuda::anyprec_gemv_mixed(f.dw->anyprec(), 8, bd.get(), xd.get(), m, yd.get(), s, form.path, form.presplit ? xfrag.get() : nullptr);
    LOWBIT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    LOWBIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; ++rep)
      for (const std::vector<int>& bits : mixes) {
        const std::vector<int32_t> host(bits.begin(), bits.end());
        LOWBIT_CUDA_CHECK(cudaMemcpyAsync(bd.get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
        LOWBIT_CUDA_CHECK(cudaMemsetAsync(yd.get(), 0xFF, yd.bytes(), s));
        LOWBIT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
        expect_rows_close(f, yd.download(), bits, src,
                          [&](size_t r) -> const std::vector<float>& { return f.ref.at(bits[r])[r]; },
                          std::string("graph replay ") + form.name + " widths " + mix_name(bits));
      }
    LOWBIT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    LOWBIT_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(s));
}

// A row at a width the weight does not serve, or above max_bits, is NaN; the other rows keep their answers.
TEST(CudaMixedWidth, UnservedWidthGivesNaNRow) {
  SKIP_WITHOUT_GPU();
  const Fixture f(test::random_anyprec(20, 300, true, 51, 4, (1u << 3) | (1u << 4)), 52);   // serves 3 and 4
  const std::vector<int> bits = {3, 2, 4, 5, 0, 4}, src = {0, 1, 2, 3, 4, 5};
  for (const Form& form : kForms) {
    const std::vector<float> y = run_mixed(f, 4, bits, src, form);
    for (size_t r = 0; r < bits.size(); ++r) {
      const bool served = bits[r] == 3 || bits[r] == 4;
      int wrong = 0;
      for (int64_t i = 0; i < f.q.n; ++i) {
        const float v = y[r * static_cast<size_t>(f.q.n) + static_cast<size_t>(i)];
        if (served) {
          const double want = f.ref.at(bits[r])[r][static_cast<size_t>(i)];
          wrong += !(std::fabs(v - want) <= kGemvBudget * f.scale.at(bits[r])[r][static_cast<size_t>(i)] + 1e-30);
        } else {
          wrong += !std::isnan(v);
        }
      }
      EXPECT_EQ(wrong, 0) << form.name << ": row " << r << " at width " << bits[r] << (served ? " (served)" : " (not served: NaN)");
    }
  }
}

TEST(CudaMixedWidth, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const cuda::DevicePackedWeight dw(pack_anyprec(test::random_codes(4, 64, 4, 0x18u, 3), storage));   // serves 3 and 4
  const cuda::DevicePackedWeight dw5(pack_anyprec(test::random_codes(4, 64, 5, 0x20u, 4), storage));  // serves 5 only
  cuda::DeviceBuffer<float> x(64 * 9), y(4 * 9);
  cuda::DeviceBuffer<int32_t> bits(9);
  test::expect_refused([&] { cuda::anyprec_gemv_mixed(dw.anyprec(), 5, bits.get(), x.get(), 1, y.get(), nullptr); }, "max_bits 5 outside 2..4");
  test::expect_refused([&] { cuda::anyprec_gemv_mixed(dw.anyprec(), 1, bits.get(), x.get(), 1, y.get(), nullptr); }, "max_bits 1 outside 2..4");
  test::expect_refused([&] { cuda::anyprec_gemv_mixed(dw5.anyprec(), 4, bits.get(), x.get(), 1, y.get(), nullptr); },
       "no width up to max_bits 4 is served");
  test::expect_refused([&] { cuda::anyprec_gemv_mixed(dw.anyprec(), 4, bits.get(), x.get(), 9, y.get(), nullptr); }, "batch 9 outside 1..8");
  test::expect_refused([&] { cuda::anyprec_gemv_mixed(dw.anyprec(), 4, bits.get(), x.get(), 0, y.get(), nullptr); }, "batch 0 outside 1..8");
  test::expect_refused([&] { cuda::anyprec_gemv_mixed(dw.anyprec(), 4, nullptr, x.get(), 1, y.get(), nullptr); }, "no row widths");
  test::expect_refused([&] { cuda::anyprec_gemv_mixed(dw.anyprec(), 4, bits.get(), x.get(), 1, y.get(), nullptr, cuda::GemvPath::TensorCoreRegisterLut); },
       "runs on CUDA cores (Scalar) or tensor cores (TensorCore) only");
}

}  // namespace
}  // namespace lowbit
#else
TEST(CudaMixedWidth, SkippedWithoutCudaToolkit) { GTEST_SKIP() << "GPU tests skipped: lowbit was built without CUDA"; }
#endif
