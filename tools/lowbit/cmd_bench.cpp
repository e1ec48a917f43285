// lowbit bench MODEL: CPU prefill and decode speed, each beside a ceiling measured in the same run:
//   prefill — model FLOP/s vs OpenBLAS sgemm FLOP/s on the model's own largest linear shape at the same m;
//   decode  — weight bytes streamed per second vs a measured memcpy bandwidth (decode is bandwidth-bound).
// lowbit bench --kernels: the GPU kernels beside cuBLAS fp16 (src/cuda/bench_kernels.h).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>

#include "commands.h"
#include "core/error.h"
#include "model/model.h"
#ifdef LOWBIT_WITH_CUDA
#include "cuda/bench_e2e.h"
#include "cuda/bench_kernels.h"
#include "cuda/gpu_model.h"
#include "cuda/common.h"
#endif

namespace lowbit::cli {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <typename F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double a = now_s();
    f();
    t.push_back(now_s() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

void register_bench(CLI::App& app, Common& common) {
  auto path = std::make_shared<std::string>();
  auto prefill = std::make_shared<int>(512);
  auto decode = std::make_shared<int>(64);
  auto reps = std::make_shared<int>(3);
  auto bits = std::make_shared<int>(0);
  CLI::App* sub = app.add_subcommand("bench", "CPU prefill/decode speed vs sgemm and memory-bandwidth ceilings");
  // FLOPs counted: every linear layer and the head for every prompt token, attention over the causal half only.
  auto kernels = std::make_shared<bool>(false);
  auto shapes = std::make_shared<std::vector<std::string>>(std::vector<std::string>{
      "4096x4096", "11008x4096", "4096x11008", "14336x4096", "8192x8192", "28672x8192", "8192x28672"});
  auto kbits = std::make_shared<std::vector<int>>(std::vector<int>{3, 4, 8});
  auto batches = std::make_shared<std::vector<int>>(std::vector<int>{1, 2, 4, 8, 16, 64, 512});
  auto iters = std::make_shared<int>(50);
  auto kinds = std::make_shared<std::string>("fp16,anyprec,mixed24a");
  sub->add_option("model", *path, "Model: HF directory, .gguf, or llama2.c .bin (not with --kernels)");
  sub->add_flag("--kernels", *kernels, "GPU kernel benchmark beside cuBLAS fp16 (no model)");
  auto e2e = std::make_shared<bool>(false);
  auto e2e_shapes = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"llama2-7b"});
  auto e2e_kinds = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"fp16", "anyprec", "mixed24a"});
  sub->add_flag("--e2e", *e2e, "GPU end-to-end prefill/decode on random-weight model shapes (no model)");
  sub->add_option("--model-shapes", *e2e_shapes, "--e2e: llama2-7b, llama3-8b, llama2-70b")->delimiter(',');
  sub->add_option("--weights", *e2e_kinds, "--e2e: fp16, anyprec, mixed24a")->delimiter(',');
  auto e2e_batches = std::make_shared<std::vector<int>>(std::vector<int>{1, 8});
  sub->add_option("--decode-batches", *e2e_batches, "--e2e: decode batch sizes (sequences)")->delimiter(',')->check(CLI::Range(1, 256));
  sub->add_option("--shapes", *shapes, "--kernels: weight shapes NxK (N outputs, K inputs)")->delimiter(',');
  sub->add_option("--kernel-bits", *kbits, "--kernels: any-precision widths")->delimiter(',')->check(CLI::Range(2, 8));
  sub->add_option("--batch", *batches, "--kernels: batch sizes (tokens)")->delimiter(',')->check(CLI::Range(1, 65536));
  sub->add_option("--iters", *iters, "--kernels: timed launches per point (median reported)")->check(CLI::Range(3, 10000));
  sub->add_option("--formats", *kinds, "--kernels: anyprec, mixed24a, fp16 (comma-separated)");
  sub->add_option("--prefill", *prefill, "Prompt tokens for the prefill measurement")->check(CLI::Range(1, 1 << 16));
  sub->add_option("--decode", *decode, "Tokens for the decode measurement")->check(CLI::Range(1, 1 << 16));
  sub->add_option("--reps", *reps, "Repetitions (median reported)")->check(CLI::Range(1, 100));
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->add_option("--bits", *bits, "Any-precision models: the width to run (default: the widest)");
  auto device = std::make_shared<std::string>("auto");
  add_device_option(sub, *device);
  sub->callback([=, &common] {
    if (*e2e) {
#ifdef LOWBIT_WITH_CUDA
      std::string why;
      LOWBIT_CHECK(cuda::device_available(&why), "bench --e2e needs a GPU: ", why);
      cuda::E2EBenchOptions o;
      o.shapes = *e2e_shapes;
      o.kinds = *e2e_kinds;
      o.bits = *kbits;
      o.batches = *e2e_batches;
      cuda::run_e2e_bench(o, std::cout);
      return;
#else
      fail("bench --e2e: this lowbit was built without CUDA");
#endif
    }
    if (*kernels) {
#ifdef LOWBIT_WITH_CUDA
      std::string why;
      LOWBIT_CHECK(cuda::device_available(&why), "bench --kernels needs a GPU: ", why);
      cuda::KernelBenchOptions o;
      for (const std::string& sh : *shapes) {
        const size_t x = sh.find('x');
        char* end = nullptr;
        const long long n = x == std::string::npos ? 0 : std::strtoll(sh.c_str(), &end, 10);
        const long long k = x == std::string::npos ? 0 : std::strtoll(sh.c_str() + x + 1, &end, 10);
        LOWBIT_CHECK(n >= 1 && k >= 1 && end != nullptr && *end == '\0' && n * k <= (1ll << 32), "--shapes: '", sh,
                     "' is not NxK (positive, at most 2^32 weights)");
        o.shapes.emplace_back(n, k);
      }
      o.bits = *kbits;
      o.batches = *batches;
      o.iters = *iters;
      o.anyprec = kinds->find("anyprec") != std::string::npos;
      o.mixed24a = kinds->find("mixed24a") != std::string::npos;
      o.fp16 = kinds->find("fp16") != std::string::npos;
      LOWBIT_CHECK(o.anyprec || o.mixed24a || o.fp16, "--formats: expected anyprec, mixed24a and/or fp16, got '", *kinds, "'");
      cuda::run_kernel_bench(o, std::cout);
      return;
#else
      fail("bench --kernels: this lowbit was built without CUDA");
#endif
    }
    LOWBIT_CHECK(!path->empty(), "bench: a MODEL is required (or --kernels)");
    apply_threads(common);
    LoadOptions lo;
    lo.tokenizer_path = common.tokenizer;
    auto model = Model::load(*path, lo);
    model->check_bits(*bits);
    const ModelConfig& c = model->config();
    const int P = std::min(*prefill, c.max_seq_len - *decode);
    LOWBIT_CHECK(P >= 1, "--prefill + --decode exceed the model context of ", c.max_seq_len);
    if (use_cuda(*device, *model)) {
#ifdef LOWBIT_WITH_CUDA
      // GPU: prefill of P tokens, greedy decode (CUDA-graph steps) at batch 1, weight bandwidth vs a device copy.
      LOWBIT_CHECK(*decode >= 3, "bench --device cuda: --decode must be >= 3");
      cuda::GpuModel g(*model);
      const double bw = cuda::device_copy_bandwidth();
      const double pre = cuda::time_prefill(g, *bits, P);
      double kv = 0;
      const double dec = cuda::time_decode(g, *bits, P, *decode, 1, &kv);
      const double bytes = static_cast<double>(g.weight_bytes_per_token(*bits));
      std::printf("model: %s on %s (%.1f MB of weights on the GPU%s)\n", path->c_str(), device_description().c_str(),
                  static_cast<double>(g.weight_bytes()) / 1e6,
                  g.dequantized_linears() > 0 ? ", some linears as fp16 copies: no kernel for their format" : "");
      std::printf("copy bandwidth (device-to-device, read + write): %.0f GB/s\n", bw / 1e9);
      std::printf("prefill         (%d tokens):      %8.1f tokens/s\n", P, pre);
      std::printf("decode          (%d tokens after %d): %8.1f tokens/s  %8.1f GB/s of weights = %.0f%% of the copy\n",
                  *decode, P, dec, bytes * dec / 1e9, 100.0 * bytes * dec / bw);
      return;
#endif
    }
    // Linear-layer FLOPs per token (2 per multiply-add) plus the head; attention added per position.
    const double lin = 2.0 * c.n_layers * (static_cast<double>(c.dim) * (c.q_dim() + 2 * c.kv_dim()) +
                                           static_cast<double>(c.q_dim()) * c.dim + 3.0 * c.dim * c.hidden_dim) +
                       2.0 * c.dim * c.vocab_size;
    const double attn_per_pair = 2.0 * 2.0 * c.n_layers * c.q_dim();   // QK and PV, per (query, key) pair
    std::mt19937 rng(1);
    std::vector<int32_t> toks(static_cast<size_t>(P + *decode));
    for (auto& t : toks) t = static_cast<int32_t>(rng() % static_cast<unsigned>(c.vocab_size));

    // Ceiling 1: sgemm at the model's widest FFN shape, m = P.
    const int m = P, n = c.hidden_dim, k = c.dim;
    std::vector<float> A(static_cast<size_t>(m) * k, 0.5f), B(static_cast<size_t>(n) * k, 0.25f), C(static_cast<size_t>(m) * n);
    const double t_gemm = median_seconds(*reps + 2, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, A.data(), k, B.data(), k, 0.0f, C.data(), n);
    });
    const double gemm_flops = 2.0 * m * n * k / t_gemm;

    // Ceiling 2: memcpy bandwidth over a buffer far larger than the caches (bytes read + written).
    const size_t bytes = 256u << 20;
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    const double t_copy = median_seconds(*reps + 2, [&] { std::memcpy(dst.data(), src.data(), bytes); });
    const double copy_bw = 2.0 * bytes / t_copy;

    // Model prefill with logits for every position, as `ppl` runs it (fresh cache each time), then decode.
    std::vector<float> all_logits(static_cast<size_t>(P) * c.vocab_size);
    const double t_prefill = median_seconds(*reps, [&] {
      KVCache cache = model->new_cache(P + *decode);
      model->forward(toks.data(), P, cache, all_logits.data(), true, *bits);
    });
    const double prefill_flops = (lin * P + attn_per_pair * P * (P + 1) / 2.0) / t_prefill;
    KVCache cache = model->new_cache(P + *decode);
    model->forward(toks.data(), P, cache, nullptr, false, *bits);
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    const double t0 = now_s();
    for (int i = 0; i < *decode; ++i) model->forward(&toks[static_cast<size_t>(P + i)], 1, cache, logits.data(), false, *bits);
    const double t_decode = (now_s() - t0) / *decode;
    const double weight_bytes = static_cast<double>(model->weight_bytes_per_token(*bits));   // read once per token
    std::printf("model: %s (%d layers, dim %d, %.1f M linear params, fp32 on CPU)\n", path->c_str(), c.n_layers,
                c.dim, lin / 2.0 / 1e6);
    std::printf("sgemm ceiling   (m=%d n=%d k=%d): %8.1f GFLOP/s\n", m, n, k, gemm_flops / 1e9);
    std::printf("prefill         (%d tokens):      %8.1f tokens/s  %8.1f GFLOP/s = %.0f%% of sgemm\n", P, P / t_prefill,
                prefill_flops / 1e9, 100.0 * prefill_flops / gemm_flops);
    std::printf("memcpy ceiling:                      %8.2f GB/s\n", copy_bw / 1e9);
    std::printf("decode          (%d tokens):       %8.1f tokens/s  %8.2f GB/s of weights = %.0f%% of memcpy\n",
                *decode, 1.0 / t_decode, weight_bytes / t_decode / 1e9, 100.0 * weight_bytes / t_decode / copy_bw);
  });
}

}  // namespace lowbit::cli
