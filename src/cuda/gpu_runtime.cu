#include "cuda/gpu_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

namespace lowbit::cuda {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

PplResult perplexity_gpu(GpuModel& model, const std::vector<std::vector<int32_t>>& windows, const PplOptions& opts) {
  LOWBIT_CHECK(!opts.reference_path, "perplexity: the reference path runs on the CPU (--device cpu)");
  PplResult r;
  r.windows_total = static_cast<int>(windows.size());
  const int n_windows = opts.max_windows > 0 ? std::min<int>(opts.max_windows, r.windows_total) : r.windows_total;
  LOWBIT_CHECK(n_windows > 0, "perplexity: the text is shorter than one window of ", opts.ctx, " tokens");
  size_t longest = 0;
  for (int w = 0; w < n_windows; ++w) longest = std::max(longest, windows[static_cast<size_t>(w)].size());
  GpuKVCache cache = model.new_cache(1, static_cast<int>(longest));
  double nll_sum = 0;
  int64_t correct = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int w = 0; w < n_windows; ++w) {
    const auto& toks = windows[static_cast<size_t>(w)];
    const int n = static_cast<int>(toks.size());
    if (n < 2) continue;
    double s = 0;
    int64_t hits = 0;
    model.score_window(toks.data(), n, cache, opts.bits, &s, &hits);
    nll_sum += s;
    correct += hits;
    r.predicted += n - 1;
    r.evaluated += n;
    r.windows = w + 1;
    r.seconds = seconds_since(t0);
    if (opts.progress) opts.progress(w + 1, n_windows, r.predicted, r.seconds);
  }
  r.mean_nll = r.predicted > 0 ? nll_sum / static_cast<double>(r.predicted) : 0;
  r.ppl = std::exp(r.mean_nll);
  r.top1 = r.predicted > 0 ? static_cast<double>(correct) / static_cast<double>(r.predicted) : 0;
  return r;
}

GenerateResult generate_gpu(GpuModel& model, const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                            const GenerateOptions& opts, const std::function<void(const std::string&)>& on_text) {
  const ModelConfig& c = model.config();
  LOWBIT_CHECK(!prompt_ids.empty(), "generate: empty prompt (no tokens)");
  LOWBIT_CHECK(opts.max_new_tokens >= 0, "--max-tokens must be >= 0");
  validate_sampling(opts.sampling);
  const int want = static_cast<int>(prompt_ids.size()) + opts.max_new_tokens;
  const int capacity = opts.ctx > 0 ? opts.ctx : std::min(c.max_seq_len, want);
  LOWBIT_CHECK(static_cast<int>(prompt_ids.size()) < capacity || opts.max_new_tokens == 0, "the prompt has ",
               prompt_ids.size(), " tokens, which fills the context of ", capacity);
  GpuKVCache cache = model.new_cache(1, std::max(capacity, static_cast<int>(prompt_ids.size())));
  const std::vector<int32_t> stops = stop_tokens(c, tok);
  const bool on_device = opts.sampling.temperature == 0.0f && opts.sampling.repetition_penalty == 1.0f;
  // Temperature / top-k / top-p without a repetition penalty sample on the GPU too (the penalty needs the history:
  // that path downloads the logits and uses the CPU Sampler).
  const bool gpu_sampling = !on_device && opts.sampling.repetition_penalty == 1.0f;
  GpuSamplingParams gp;
  gp.temperature = opts.sampling.temperature;
  gp.top_k = opts.sampling.top_k;
  gp.top_p = opts.sampling.top_p;
  std::mt19937_64 rng(opts.sampling.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);

  GenerateResult r;
  r.prompt_ids = prompt_ids;
  Sampler sampler(opts.sampling);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> history = prompt_ids;
  const auto t0 = std::chrono::steady_clock::now();
  const float* dlog = model.forward(prompt_ids.data(), 1, static_cast<int>(prompt_ids.size()), cache, false, opts.bits);
  if (on_device) model.greedy_from_last_logits(1);
  model.synchronize();
  r.prefill_seconds = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  r.stop_reason = "length";
  for (int i = 0; i < opts.max_new_tokens; ++i) {
    int32_t next;
    if (on_device) {
      next = model.get_decode_tokens(1)[0];
    } else if (gpu_sampling) {
      const float u = std::min(static_cast<float>(uniform(rng)), 0x1.fffffep-1f);   // [0, 1) after rounding to float
      model.sample_from_last_logits(1, gp, {u});
      next = model.get_decode_tokens(1)[0];
    } else {
      // The model's stream is non-blocking: the copy must be queued on it, then waited for.
      LOWBIT_CUDA_CHECK(cudaMemcpyAsync(logits.data(), dlog, sizeof(float) * logits.size(), cudaMemcpyDeviceToHost,
                                        model.stream()));
      model.synchronize();
      next = sampler.sample(logits.data(), c.vocab_size, history);
    }
    if (!accept_token(next, stops, opts, tok, r, history, on_text)) break;
    if (i + 1 == opts.max_new_tokens) break;
    if (cache.len[0] >= cache.capacity) {
      r.stop_reason = "context";
      break;
    }
    if (on_device) model.decode_step_greedy(cache, opts.bits, /*use_graph=*/true);
    else dlog = model.forward(&next, 1, 1, cache, false, opts.bits);
  }
  model.synchronize();
  r.decode_seconds = seconds_since(t1);
  return r;
}

}  // namespace lowbit::cuda
