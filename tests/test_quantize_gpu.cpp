// The streaming GPU quantizer against the CPU reference on the same model and calibration: the fp32 calibration
// block and the Hessians against their CPU twins, RTN bit for bit, every calibrated method's file within a named
// budget of the CPU file's quality, and checkpoints (interrupt, resume, refusals). Checkpoint and device-error tests
// run everywhere; the GPU tests skip out loud without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#ifdef LOWBIT_WITH_CUDA
#include "backend_cuda/common/common.h"
#include "backend_cuda/quantize/block_f32.h"
#include "backend_cuda/quantize/block_loader.h"
#include "backend_cuda/quantize/input_stats_gpu.h"
#endif
#include "io/lowbit_file.h"
#include "lowbit/quantize.h"
#include "lowbit/system.h"
#include "model/model.h"
#include "quantize/capture.h"
#include "quantize/checkpoint.h"
#include "quantize/quantize_model.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace lowbit {
namespace {

#ifdef LOWBIT_WITH_CUDA

#endif

// fp32 block on the GPU vs the CPU forward (same arithmetic, different summation order in the sgemms).
constexpr double kBlockBudget = 1e-4;
// GPU Hessian vs the CPU's (fp32 chunks into fp64 sums on both; only the order of fp32 additions differs).
constexpr double kHessianBudget = 1e-5;
// A GPU-quantized file's mean NLL vs the CPU-quantized file's, relative, on stories260K's TinyStories sample
// (tiny layers make single rounding flips visible; SmolLM2's full-test figures are in docs/QUANTIZE.md).
constexpr double kNllBudget = 0.01;

std::string stories() {
  const std::string p = test::shared_path("models/stories260K/stories260K.bin");
  return p;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

#ifdef LOWBIT_WITH_CUDA
std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  LOWBIT_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}
#endif

// Mean next-token NLL of a model file over the TinyStories sample's stories (CPU, exact fp32 forward).
double mean_nll(const std::string& path) {
  auto m = Model::load(path);
  const auto docs = test::tinystories_docs(*m);
  double nll = 0;
  int64_t count = 0;
  const int V = m->config().vocab_size;
  for (const auto& d : docs) {
    const int T = std::min<int>(static_cast<int>(d.size()), m->config().max_seq_len);
    KVCache cache = m->new_cache(T);
    std::vector<float> logits(static_cast<size_t>(T) * V);
    m->forward(d.data(), T, cache, logits.data(), true);
    for (int t = 0; t + 1 < T; ++t) {
      const float* l = logits.data() + static_cast<size_t>(t) * V;
      double mx = l[0];
      for (int i = 1; i < V; ++i) mx = std::max(mx, static_cast<double>(l[i]));
      double s = 0;
      for (int i = 0; i < V; ++i) s += std::exp(l[i] - mx);
      nll += std::log(s) + mx - l[d[static_cast<size_t>(t) + 1]];
      ++count;
    }
  }
  return nll / static_cast<double>(count);
}

QuantizeOptions small_calibration(QuantMethod m) {
  QuantizeOptions o;
  o.method = m;
  o.calib.samples = 16;
  o.calib.seqlen = 128;
  o.gptq.spec.bits = 4;
  o.gptq.spec.group_size = 32;
  o.anyprec.parent_bits = 6;
  o.anyprec.max_iter = 20;
  o.quik.outliers = 8;
  return o;
}

// Compares every packed part of two .lowbit files byte for byte; returns the number of differing parts.
int differing_parts(const std::string& a, const std::string& b) {
  const WeightSet wa = read_lowbit(a), wb = read_lowbit(b);
  EXPECT_EQ(wa.packed.size(), wb.packed.size());
  int diff = 0;
  for (const auto& [name, pa] : wa.packed) {
    const auto it = wb.packed.find(name);
    if (it == wb.packed.end()) {
      ++diff;
      continue;
    }
    EXPECT_EQ(pa.params, it->second.params) << name;
    for (const auto& [part, va] : pa.parts) {
      const TensorView& vb = it->second.parts.at(part);
      if (va.nbytes != vb.nbytes || std::memcmp(va.data, vb.data, va.nbytes) != 0) {
        ++diff;
        ADD_FAILURE() << name << " part " << part << " differs";
      }
    }
  }
  for (const auto& [name, ta] : wa.tensors) {
    const TensorView& tb = wb.tensors.at(name);
    EXPECT_TRUE(ta.nbytes == tb.nbytes && std::memcmp(ta.data, tb.data, ta.nbytes) == 0) << "dense " << name;
  }
  return diff;
}

// ---- everywhere (no GPU needed) ----

TEST(QuantCheckpoint, SavesLoadsAndRefusesOtherRuns) {
  const std::string dir = test::temp_dir(), out = dir + "/m.lowbit";
  UniformQuantized q;
  q.bits = 4;
  q.n = 3;
  q.k = 8;
  q.group_size = 4;
  q.codes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  q.scales.assign(6, 0x3c00);
  q.zeros.assign(6, 7);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  {
    QuantCheckpoint ck(out, R"({"method":"rtn"})", 3, false);
    EXPECT_EQ(ck.finished_blocks(), 0);
    ck.save_block(1, {{"w1", pack_uniform(q, storage)}}, {{"hessian_error", 2.5}});
    EXPECT_TRUE(ck.has_block(1));
    EXPECT_EQ(ck.first_missing(), 0);
  }
  // Without --resume an existing checkpoint is refused (it would discard finished work).
  try {
    QuantCheckpoint again(out, R"({"method":"rtn"})", 3, false);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
  // A different run is refused.
  try {
    QuantCheckpoint other(out, R"({"method":"gptq"})", 3, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different run"), std::string::npos) << e.what();
  }
  QuantCheckpoint ck(out, R"({"method":"rtn"})", 3, true);
  EXPECT_EQ(ck.finished_blocks(), 1);
  std::map<std::string, double> figures;
  const auto blocks = ck.load_block(1, &figures);
  EXPECT_EQ(figures.at("hessian_error"), 2.5);
  const UniformQuantized back = unpack_uniform(blocks.at("w1"), "checkpoint");
  EXPECT_EQ(back.codes, q.codes);
  EXPECT_EQ(back.scales, q.scales);
  EXPECT_EQ(back.zeros, q.zeros);
  ck.remove();
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

TEST(QuantizeDevice, CudaWithoutGpuIsAClearError) {
  std::string why;
  if (api::cuda_available(&why)) GTEST_SKIP() << "a GPU is present: the no-GPU error cannot be shown here";
  if (stories().empty()) GTEST_SKIP() << "missing shared/models/stories260K";
  api::QuantizeOptions o;
  o.method = api::QuantMethod::Rtn;
  o.device = api::Device::Cuda;
  const std::string out = test::temp_dir() + "/x.lowbit";
  try {
    api::quantize(stories(), out, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--device"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_FALSE(test::file_exists(out));
  // --resume belongs to the GPU quantizer.
  o.device = api::Device::Cpu;
  o.resume = true;
  EXPECT_THROW(api::quantize(stories(), out, o), Error);
}

// ---- GPU ----
#ifdef LOWBIT_WITH_CUDA

TEST(QuantizeGpu, BlockForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  if (stories().empty()) GTEST_SKIP() << "missing shared/models/stories260K";
  auto m = Model::load(stories());
  const ModelConfig& c = m->config();
  const int T = 96;
  std::mt19937 rng(1);
  std::vector<int32_t> tok(T);
  for (int& t : tok) t = static_cast<int>(rng() % static_cast<unsigned>(c.vocab_size));
  std::vector<float> x(static_cast<size_t>(T) * c.dim);
  m->embed(tok.data(), T, x.data());
  cuda::BlockWorkspace ws(c, T, false);
  cuda::DeviceF32 dx(x);
  std::vector<float> scratch;
  for (int l = 0; l < c.n_layers; ++l) {
    std::map<LinearSlot, std::vector<float>> cpu_in, gpu_in;
    KVCache cache(c.n_layers, T, c.kv_dim());
    const LinearInputHook hook = [&](int, LinearSlot s, const float* in, int n, int64_t k) {
      cpu_in[s].assign(in, in + n * k);
    };
    m->layer_forward(l, x.data(), T, 0, cache, &hook);
    const cuda::DeviceBlock blk = cuda::load_block_f32(m->weights(), l, scratch, nullptr);
    const cuda::BlockCaptureFn cap = [&](LinearSlot s, const float* in, int n, int64_t k) {
      gpu_in[s] = download(in, static_cast<size_t>(n * k));
    };
    cuda::block_forward_f32(blk.view(), dx.get(), T, ws, nullptr, &cap);
    const std::vector<float> y = download(dx.get(), x.size());
    double err = 0;
    for (size_t i = 0; i < y.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(y[i] - x[i])));
    EXPECT_LT(err / max_abs(x), kBlockBudget) << "block " << l;
    for (const auto& [slot, v] : cpu_in) {
      const std::vector<float>& g = gpu_in.at(slot);
      ASSERT_EQ(g.size(), v.size());
      double e = 0;
      for (size_t i = 0; i < v.size(); ++i) e = std::max(e, static_cast<double>(std::fabs(g[i] - v[i])));
      EXPECT_LT(e / std::max(max_abs(v), 1e-30), kBlockBudget) << "block " << l << " slot " << static_cast<int>(slot);
    }
    // Continue from the CPU's output so each block is compared on the same input.
    dx.upload(x.data(), x.size());
  }
}

TEST(QuantizeGpu, HessianMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t k : {96, 576}) {
    const int64_t rows = 4500;   // three chunks of the 2048-row fp32 reduction
    std::mt19937 rng(static_cast<unsigned>(k));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(rows * k));
    for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % static_cast<size_t>(k) == 3 ? 20.f : 1.f);
    InputStats cpu(k);
    cpu.add(x.data(), rows);
    cuda::GpuInputStats gpu(k, true);
    cuda::DeviceF32 dx(x);
    cublasHandle_t h = nullptr;
    ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    gpu.add(dx.get(), 1000, h, nullptr);
    gpu.add(dx.get() + 1000 * k, rows - 1000, h, nullptr);
    cublasDestroy(h);
    const std::vector<double> hc = cpu.hessian();
    std::vector<double> hg(hc.size());
    LOWBIT_CUDA_CHECK(cudaMemcpy(hg.data(), gpu.hessian(nullptr), hg.size() * sizeof(double), cudaMemcpyDeviceToHost));
    double err = 0, ref = 0;
    for (size_t i = 0; i < hc.size(); ++i) {
      err = std::max(err, std::fabs(hg[i] - hc[i]));
      ref = std::max(ref, std::fabs(hc[i]));
    }
    EXPECT_LT(err / ref, kHessianBudget) << "k " << k;
    std::printf("Hessian k=%lld: max |GPU - CPU| / max |H| = %.3g\n", static_cast<long long>(k), err / ref);
    const std::vector<double> mc = cpu.max_abs(), mg = gpu.max_abs();
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(mc[static_cast<size_t>(i)], mg[static_cast<size_t>(i)]);
  }
}

TEST(QuantizeGpu, RtnIsBitIdenticalToCpu) {
  SKIP_WITHOUT_GPU();
  if (stories().empty()) GTEST_SKIP() << "missing shared/models/stories260K";
  const std::string dir = test::temp_dir();
  for (bool clip : {false, true}) {
    QuantizeOptions o = small_calibration(QuantMethod::Rtn);
    o.gptq.spec.mse_clip = clip;
    auto m = Model::load(stories());
    quantize_to_file(*m, o, dir + "/cpu.lowbit");
    const QuantizeReport r = quantize_to_file_gpu(read_weights(stories()), o, dir + "/gpu.lowbit");
    EXPECT_EQ(differing_parts(dir + "/cpu.lowbit", dir + "/gpu.lowbit"), 0) << "mse_clip " << clip;
    EXPECT_GT(r.peak_gpu_bytes, 0u);
    EXPECT_FALSE(std::filesystem::exists(dir + "/gpu.lowbit.partial"));
  }
}

struct MethodCase {
  const char* name;
  QuantMethod method;
  std::function<void(QuantizeOptions&)> tweak;
};

TEST(QuantizeGpu, CalibratedMethodsMatchCpuQuality) {
  SKIP_WITHOUT_GPU();
  if (stories().empty() || test::tinystories_sample().empty()) GTEST_SKIP() << "missing stories260K or its sample";
  const std::string dir = test::temp_dir();
  const std::vector<MethodCase> cases = {
      {"gptq w4 g32", QuantMethod::Gptq, [](QuantizeOptions&) {}},
      {"gptq w3 g32 act-order", QuantMethod::Gptq, [](QuantizeOptions& o) { o.gptq.spec.bits = 3; o.gptq.act_order = true; }},
      {"quik w4a8", QuantMethod::Quik, [](QuantizeOptions&) {}},
      {"mixed24", QuantMethod::Mixed24, [](QuantizeOptions&) {}},
      {"anyprec fisher 3->6", QuantMethod::AnyPrec, [](QuantizeOptions&) {}},
      {"anyprec hessian-diag 3->6", QuantMethod::AnyPrec, [](QuantizeOptions& o) { o.sensitivity = Sensitivity::HessianDiag; }},
  };
  for (const MethodCase& mc : cases) {
    QuantizeOptions o = small_calibration(mc.method);
    mc.tweak(o);
    auto m = Model::load(stories());
    const QuantizeReport rc = quantize_to_file(*m, o, dir + "/cpu.lowbit");
    const QuantizeReport rg = quantize_to_file_gpu(read_weights(stories()), o, dir + "/gpu.lowbit");
    const double nc = mean_nll(dir + "/cpu.lowbit"), ng = mean_nll(dir + "/gpu.lowbit");
    std::printf("%-26s mean NLL CPU %.5f GPU %.5f (%.3f%%); objective CPU %.5g GPU %.5g; avg bits %.4f / %.4f\n",
                mc.name, nc, ng, 100.0 * (ng - nc) / nc, rc.hessian_error_sum, rg.hessian_error_sum, rc.avg_bits,
                rg.avg_bits);
    EXPECT_LT(std::fabs(ng - nc) / nc, kNllBudget) << mc.name;
    EXPECT_DOUBLE_EQ(rc.avg_bits, rg.avg_bits) << mc.name;
    if (rc.hessian_error_sum > 0) {
      EXPECT_LT(std::fabs(rg.hessian_error_sum - rc.hessian_error_sum) / rc.hessian_error_sum, 0.02) << mc.name;
    }
  }
}

TEST(QuantizeGpu, InterruptedRunResumesToTheSameFile) {
  SKIP_WITHOUT_GPU();
  if (stories().empty()) GTEST_SKIP() << "missing shared/models/stories260K";
  const std::string dir = test::temp_dir();
  QuantizeOptions o = small_calibration(QuantMethod::Gptq);
  const WeightSet ws = read_weights(stories());
  quantize_to_file_gpu(ws, o, dir + "/whole.lowbit");
  const std::string out = dir + "/cut.lowbit";
  // Stop after two blocks, as a crash would.
  EXPECT_THROW(quantize_to_file_gpu(ws, o, out,
                                    [](int done, int, const std::string&) {
                                      if (done == 2) throw Error("interrupted");
                                    }),
               Error);
  EXPECT_FALSE(test::file_exists(out)) << "an interrupted run must not leave a file that looks complete";
  EXPECT_TRUE(std::filesystem::exists(out + ".partial"));
  // Without --resume the checkpoint is refused, not overwritten.
  EXPECT_THROW(quantize_to_file_gpu(ws, o, out), Error);
  o.resume = true;
  const QuantizeReport r = quantize_to_file_gpu(ws, o, out);
  EXPECT_EQ(r.resumed_blocks, 2);
  EXPECT_EQ(differing_parts(dir + "/whole.lowbit", out), 0);
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

#else
TEST(QuantizeGpu, SkippedWithoutCudaToolkit) { GTEST_SKIP() << "GPU tests skipped: lowbit was built without CUDA"; }
#endif

}  // namespace
}  // namespace lowbit
