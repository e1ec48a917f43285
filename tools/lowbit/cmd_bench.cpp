// lowbit bench MODEL: prefill and decode speed (api::Model::measure_speed), each beside a ceiling measured in the
// same run on the same device:
//   CPU  prefill — model FLOP/s vs OpenBLAS sgemm FLOP/s on the model's own widest FFN shape at the same m;
//        decode  — weight bytes streamed per second vs a measured memcpy bandwidth (decode is bandwidth-bound);
//   GPU  decode  — weight bytes per second vs a device-to-device copy (bench/bench_e2e.h).
// lowbit bench --kernels / --e2e: the GPU kernel and random-weight end-to-end benchmarks (bench/*.h), which
// measure the library rather than use it.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include "commands.h"
#ifdef LOWBIT_WITH_CUDA
#include "bench/bench_e2e.h"
#include "bench/bench_serve.h"
#include "bench/bench_kernels.h"
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

struct BenchArgs {
  std::string model, device = "auto", formats = "fp16,anyprec,mixed24a,uniform,quik";
  bool kernels = false, e2e = false, serve = false, spec = false;
  int spec_target = 8;
  // bench MODEL --draft-bits: speculative decoding on real text.
  std::vector<int> draft_bits, target_bits = {8};
  std::vector<std::string> spec_texts;
  int spec_prompts = 8, spec_prompt_len = 64;
  std::vector<int> concurrency = {1, 8, 32, 64};
  double serve_kv_gb = 0;
  api::SpeedParams speed;
  std::vector<std::string> shapes = {"4096x4096",  "11008x4096", "4096x11008", "14336x4096",
                                     "8192x8192", "28672x8192", "8192x28672"};
  std::vector<int> kernel_bits = {3, 4, 8};
  std::vector<int> batches = {1, 2, 4, 8, 16, 64, 512};
  int iters = 50;
  std::vector<std::string> e2e_shapes = {"llama2-7b"};
  std::vector<std::string> e2e_weights = {"fp16", "anyprec", "mixed24a"};
  std::vector<int> decode_batches = {1, 8};
};

// The GPU benchmarks that need no model; refuse when this build or machine has no GPU.
void require_gpu(const char* what) {
  std::string why;
  if (!api::cuda_available(&why)) fail("bench ", what, " needs a GPU: ", why);
}

void bench_model(const BenchArgs& a, const Common& common) {
  api::OpenOptions oo;
  oo.device = parse_device(a.device);
  oo.tokenizer_path = common.tokenizer;
  api::Model model = api::Model::open(a.model, oo);
  const api::SpeedResult s = model.measure_speed(a.speed);
  const api::ModelInfo& c = model.info();
  const double bytes = static_cast<double>(s.weight_bytes_per_token);
  if (model.device() == api::Device::Cuda) {
#ifdef LOWBIT_WITH_CUDA
    const double bw = cuda::device_copy_bandwidth();
    std::printf("model: %s on %s\n", a.model.c_str(), model.device_name().c_str());
    std::printf("copy bandwidth (device-to-device, read + write): %.0f GB/s\n", bw / 1e9);
    std::printf("prefill         (%d tokens):      %8.1f tokens/s\n", s.prefill_tokens, s.prefill_tokens_per_s());
    std::printf("decode          (%d tokens after %d): %8.1f tokens/s  %8.1f GB/s of weights = %.0f%% of the copy\n",
                s.decode_tokens, s.prefill_tokens, s.decode_tokens_per_s(), bytes * s.decode_tokens_per_s() / 1e9,
                100.0 * bytes * s.decode_tokens_per_s() / bw);
#endif
    return;
  }
  // Linear-layer FLOPs per token (2 per multiply-add) plus the head; attention over the causal half added per pair.
  const double q_dim = static_cast<double>(c.n_heads) * c.head_dim, kv_dim = static_cast<double>(c.n_kv_heads) * c.head_dim;
  const double lin = 2.0 * c.n_layers * (c.dim * (q_dim + 2 * kv_dim) + q_dim * c.dim + 3.0 * c.dim * c.hidden_dim) +
                     2.0 * c.dim * c.vocab_size;
  const double attn_per_pair = 2.0 * 2.0 * c.n_layers * q_dim;   // QK and PV, per (query, key) pair
  const int P = s.prefill_tokens;
  // Ceiling 1: sgemm at the model's widest FFN shape, m = P.
  const int m = P, n = c.hidden_dim, k = c.dim;
  std::vector<float> A(static_cast<size_t>(m) * k, 0.5f), B(static_cast<size_t>(n) * k, 0.25f), C(static_cast<size_t>(m) * n);
  const double t_gemm = median_seconds(a.speed.reps + 2, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, A.data(), k, B.data(), k, 0.0f, C.data(), n);
  });
  const double gemm_flops = 2.0 * m * n * k / t_gemm;
  // Ceiling 2: memcpy bandwidth over a buffer far larger than the caches (bytes read + written).
  const size_t copy_bytes = 256u << 20;
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
  const double t_copy = median_seconds(a.speed.reps + 2, [&] { std::memcpy(dst.data(), src.data(), copy_bytes); });
  const double copy_bw = 2.0 * copy_bytes / t_copy;
  const double prefill_flops = (lin * P + attn_per_pair * P * (P + 1) / 2.0) / s.prefill_seconds;
  const double t_decode = s.decode_seconds / s.decode_tokens;
  std::printf("model: %s (%d layers, dim %d, %.1f M linear params, fp32 on CPU)\n", a.model.c_str(), c.n_layers, c.dim,
              lin / 2.0 / 1e6);
  std::printf("sgemm ceiling   (m=%d n=%d k=%d): %8.1f GFLOP/s\n", m, n, k, gemm_flops / 1e9);
  std::printf("prefill         (%d tokens):      %8.1f tokens/s  %8.1f GFLOP/s = %.0f%% of sgemm\n", P,
              s.prefill_tokens_per_s(), prefill_flops / 1e9, 100.0 * prefill_flops / gemm_flops);
  std::printf("memcpy ceiling:                      %8.2f GB/s\n", copy_bw / 1e9);
  std::printf("decode          (%d tokens):       %8.1f tokens/s  %8.2f GB/s of weights = %.0f%% of memcpy\n",
              s.decode_tokens, s.decode_tokens_per_s(), bytes / t_decode / 1e9, 100.0 * bytes / t_decode / copy_bw);
}

// Speculative decoding on real text: for each text, spec_prompts prompts of spec_prompt_len tokens (windows spread
// over the text), each continued greedily for `decode` tokens (EOS ignored) by the target alone and with each draft
// width: acceptance, tokens per target forward, and the decode speed of both, timed in the same run.
void bench_speculative(const BenchArgs& a, const Common& common) {
  api::OpenOptions oo;
  oo.device = parse_device(a.device);
  oo.tokenizer_path = common.tokenizer;
  api::Model model = api::Model::open(a.model, oo);
  if (a.spec_texts.empty()) fail("--draft-bits: give the prompts' text with --spec-text FILE (wiki.test.raw, a .jsonl)");
  std::printf("model: %s on %s; greedy, %d new tokens after %d-token prompts, EOS ignored; adaptive k\n", a.model.c_str(),
              model.device_name().c_str(), a.speed.decode, a.spec_prompt_len);
  std::printf("text | target | draft | prompts | draft tokens kept | per-position match | mean kept per round | "
              "tokens per target forward | target alone tok/s | speculative tok/s | speedup | outputs equal to the "
              "target's\n");
  std::printf("(kept: of all drafted, including those after a rejection, which are never checked; per-position match: "
              "kept / (kept + rejected), the chance the target keeps a draft token it checks)\n");
  for (const std::string& text : a.spec_texts) {
    api::PplParams pp;
    pp.ctx = a.spec_prompt_len;
    const api::EvalWindows w = model.eval_windows_from_file(text, pp);
    if (static_cast<int>(w.windows.size()) < a.spec_prompts)
      fail(text, ": ", w.windows.size(), " windows of ", a.spec_prompt_len, " tokens, fewer than --spec-prompts ", a.spec_prompts);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < a.spec_prompts; ++i)
      prompts.push_back(w.windows[static_cast<size_t>(i) * w.windows.size() / static_cast<size_t>(a.spec_prompts)]);
    const std::string name = std::filesystem::path(text).filename().string();
    for (int t : a.target_bits) {
      api::GenerateParams g;
      g.bits = t;
      g.max_tokens = a.speed.decode;
      g.stop_at_eos = false;
      std::vector<api::GenerateResult> alone;
      double alone_s = 0;
      int64_t alone_tokens = 0;
      model.generate(prompts[0], g);   // warm-up (workspace, graphs)
      for (const auto& p : prompts) {
        alone.push_back(model.generate(p, g));
        alone_s += alone.back().decode_seconds + alone.back().prefill_seconds;
        alone_tokens += static_cast<int64_t>(alone.back().new_ids.size());
      }
      for (int d : a.draft_bits) {
        if (d >= t) continue;
        api::GenerateParams s = g;
        s.draft_bits = d;
        model.generate(prompts[0], s);   // warm-up
        int64_t drafted = 0, kept = 0, rejected = 0, rounds = 0, tokens = 0;
        double spec_s = 0;
        int equal = 0;
        for (size_t i = 0; i < prompts.size(); ++i) {
          const api::GenerateResult r = model.generate(prompts[i], s);
          drafted += r.drafted_tokens;
          kept += r.accepted_tokens;
          rejected += r.rejected_tokens;
          rounds += r.target_forwards;
          tokens += static_cast<int64_t>(r.new_ids.size());
          spec_s += r.decode_seconds + r.prefill_seconds;
          equal += r.new_ids == alone[i].new_ids;
        }
        std::printf("%s | %d-bit | %d-bit | %zu | %.1f%% | %.3f | %.2f | %.2f | %.1f | %.1f | %.2fx | %d of %zu\n",
                    name.c_str(), t, d, prompts.size(), drafted > 0 ? 100.0 * kept / drafted : 0.0,
                    kept + rejected > 0 ? static_cast<double>(kept) / (kept + rejected) : 0.0,
                    rounds > 0 ? static_cast<double>(kept) / rounds : 0.0,
                    rounds > 0 ? static_cast<double>(tokens) / rounds : 0.0, alone_tokens / alone_s, tokens / spec_s,
                    (tokens / spec_s) / (alone_tokens / alone_s), equal, prompts.size());
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

void register_bench(CLI::App& app, Common& common) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Prefill/decode speed vs measured ceilings; GPU kernel benchmarks");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, llama2.c .bin, or .lowbit (not with --kernels/--e2e)");
  sub->add_option("--prefill", a->speed.prefill, "Prompt tokens for the prefill measurement (default 512; also --e2e)")
      ->check(in_range(1, 1 << 16));
  sub->add_option("--decode", a->speed.decode, "Tokens for the decode measurement (default 64)")
      ->check(in_range(3, 1 << 16));
  sub->add_option("--reps", a->speed.reps, "Repetitions (median reported; default 3)")->check(in_range(1, 100));
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->add_option("--bits", a->speed.bits, "Any-precision models: the width to run (default: the widest)")
      ->check(at_least(0, "0 = the widest"));
  add_device_option(sub, a->device);
  sub->add_flag("--kernels", a->kernels, "GPU kernel benchmark beside cuBLAS fp16 (no model)");
  sub->add_option("--shapes", a->shapes, "--kernels: weight shapes NxK (N outputs, K inputs)")->delimiter(',');
  sub->add_option("--kernel-bits", a->kernel_bits, "--kernels / --e2e: any-precision widths")
      ->delimiter(',')
      ->check(in_range(2, 8));
  sub->add_option("--batch", a->batches, "--kernels: batch sizes (tokens)")->delimiter(',')->check(in_range(1, 65536));
  sub->add_option("--iters", a->iters, "--kernels: timed launches per point (median reported)")
      ->check(in_range(3, 10000));
  sub->add_option("--formats", a->formats, "--kernels: anyprec, mixed24a, uniform, quik, fp16 (comma-separated)");
  sub->add_flag("--e2e", a->e2e, "GPU end-to-end prefill/decode on random-weight model shapes (no model)");
  sub->add_option("--model-shapes", a->e2e_shapes, "--e2e: llama2-7b, llama3-8b, llama2-70b")->delimiter(',');
  sub->add_option("--weights", a->e2e_weights, "--e2e: fp16, anyprec, mixed24a, uniform-w4g128, uniform-w3g128, quik-w4a8, quik-w8a8, quik-w4fp8")->delimiter(',');
  sub->add_option("--decode-batches", a->decode_batches, "--e2e: decode batch sizes (sequences)")
      ->delimiter(',')
      ->check(in_range(1, 256));
  sub->add_option("--draft-bits", a->draft_bits,
                  "Speculative decoding on real text: draft widths of the any-precision MODEL (comma-separated)")
      ->delimiter(',')
      ->check(in_range(2, 8));
  sub->add_option("--target-bits", a->target_bits, "--draft-bits: target widths (default 8)")->delimiter(',')->check(in_range(2, 8));
  sub->add_option("--spec-text", a->spec_texts, "--draft-bits: text(s) the prompts come from (repeatable)");
  sub->add_option("--spec-prompts", a->spec_prompts, "--draft-bits: prompts per text (default 8)")->check(in_range(1, 10000));
  sub->add_option("--spec-prompt-len", a->spec_prompt_len, "--draft-bits: prompt tokens (default 64)")
      ->check(in_range(2, 1 << 16));
  sub->add_flag("--spec", a->spec,
                "--e2e: speculative decoding step times (draft widths --kernel-bits, target --spec-target) and the "
                "speedup they model");
  sub->add_option("--spec-target", a->spec_target, "--e2e --spec: the target width (default 8)")->check(in_range(2, 8));
  sub->add_flag("--serve", a->serve,
                "GPU serving load: the continuous batch of lowbit serve under closed-loop clients, on random-weight "
                "model shapes (no model; docs/SERVE.md)");
  sub->add_option("--concurrency", a->concurrency, "--serve: requests in flight (comma-separated)")
      ->delimiter(',')
      ->check(in_range(1, 512));
  sub->add_option("--kv-cache-gb", a->serve_kv_gb,
                  "--serve: the paged KV cache's size in GB (default: every request's whole context, as without paging)")
      ->check(at_least(0, "0 = every request's whole context"));
  sub->callback([a, sub, &common] {
    apply_threads(common);
    refuse_unless(sub, {"--kernels"}, !a->e2e && !a->serve, "and --e2e / --serve are separate benchmarks: give one");
    refuse_unless(sub, {"--e2e"}, !a->serve, "and --serve are separate benchmarks: give one");
    refuse_unless(sub, {"--shapes", "--batch", "--iters", "--formats"}, a->kernels, "applies to --kernels only");
    refuse_unless(sub, {"--model-shapes", "--weights"}, a->e2e || a->serve, "applies to --e2e and --serve only");
    refuse_unless(sub, {"--decode-batches"}, a->e2e, "applies to --e2e only");
    refuse_unless(sub, {"--concurrency", "--kv-cache-gb"}, a->serve, "applies to --serve only");
    refuse_unless(sub, {"--spec", "--spec-target"}, a->e2e, "applies to --e2e only");
    refuse_unless(sub, {"--kernel-bits"}, a->kernels || a->e2e || a->serve, "applies to --kernels, --e2e and --serve only");
    const bool no_model = a->kernels || a->e2e || a->serve;
    refuse_unless(sub, {"--decode", "--reps", "--bits", "--device", "--tokenizer", "--draft-bits"}, !no_model,
                  "applies to a MODEL's benchmark, not to --kernels / --e2e / --serve");
    refuse_unless(sub, {"--prefill"}, !a->kernels && !a->serve, "applies to a MODEL's benchmark and to --e2e");
    if (no_model) {
      const char* what = a->kernels ? "--kernels" : a->e2e ? "--e2e" : "--serve";
      if (!a->model.empty()) fail("bench ", what, " takes no MODEL (got ", a->model, ")");
      require_gpu(what);
#ifdef LOWBIT_WITH_CUDA
      if (a->serve) {
        cuda::ServeBenchOptions o;
        o.shapes = a->e2e_shapes;
        if (sub->count("--weights") > 0) o.kinds = a->e2e_weights;
        o.bits = a->kernel_bits;
        o.concurrency = a->concurrency;
        o.kv_cache_bytes = static_cast<uint64_t>(a->serve_kv_gb * 1e9);
        cuda::run_serve_bench(o, std::cout);
        return;
      }
      if (a->e2e) {
        cuda::E2EBenchOptions o;
        o.shapes = a->e2e_shapes;
        o.kinds = a->e2e_weights;
        o.bits = a->kernel_bits;
        o.batches = a->decode_batches;
        if (sub->count("--prefill") > 0) o.prefill = a->speed.prefill;
        if (a->spec) {
          o.spec_target = a->spec_target;
          cuda::run_speculative_timing(o, std::cout);
          return;
        }
        cuda::run_e2e_bench(o, std::cout);
        return;
      }
      cuda::KernelBenchOptions o;
      for (const std::string& sh : a->shapes) {
        const size_t x = sh.find('x');
        char* end = nullptr;
        const long long n = x == std::string::npos ? 0 : std::strtoll(sh.c_str(), &end, 10);
        const long long k = x == std::string::npos ? 0 : std::strtoll(sh.c_str() + x + 1, &end, 10);
        if (!(n >= 1 && k >= 1 && end != nullptr && *end == '\0' && n * k <= (1ll << 32)))
          fail("--shapes: '", sh, "' is not NxK (positive, at most 2^32 weights)");
        o.shapes.emplace_back(n, k);
      }
      o.bits = a->kernel_bits;
      o.batches = a->batches;
      o.iters = a->iters;
      o.anyprec = a->formats.find("anyprec") != std::string::npos;
      o.mixed24a = a->formats.find("mixed24a") != std::string::npos;
      o.fp16 = a->formats.find("fp16") != std::string::npos;
      o.uniform = a->formats.find("uniform") != std::string::npos;
      o.quik = a->formats.find("quik") != std::string::npos;
      if (!(o.anyprec || o.mixed24a || o.fp16 || o.uniform || o.quik))
        fail("--formats: expected anyprec, mixed24a, uniform, quik and/or fp16, got '", a->formats, "'");
      cuda::run_kernel_bench(o, std::cout);
#endif
      return;
    }
    if (a->model.empty()) fail("bench: a MODEL is required (or --kernels / --e2e / --serve)");
    refuse_unless(sub, {"--target-bits", "--spec-text", "--spec-prompts", "--spec-prompt-len"}, !a->draft_bits.empty(),
                  "needs --draft-bits");
    if (!a->draft_bits.empty()) return bench_speculative(*a, common);
    bench_model(*a, common);
  });
}

}  // namespace lowbit::cli
