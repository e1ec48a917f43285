#include "runtime/perplexity.h"

#include <chrono>
#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lowbit {

std::vector<std::vector<int32_t>> make_windows_contiguous(const std::vector<int32_t>& ids, int ctx) {
  LOWBIT_CHECK(ctx >= 2, "--ctx must be at least 2");
  std::vector<std::vector<int32_t>> w;
  for (size_t i = 0; i + static_cast<size_t>(ctx) <= ids.size(); i += static_cast<size_t>(ctx))
    w.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(i + ctx));
  return w;
}

std::vector<std::vector<int32_t>> make_windows_documents(const std::vector<std::vector<int32_t>>& docs, int ctx,
                                                         int64_t* truncated_tokens) {
  LOWBIT_CHECK(ctx >= 2, "--ctx must be at least 2");
  std::vector<std::vector<int32_t>> w;
  int64_t dropped = 0;
  for (const auto& d : docs) {
    const size_t len = std::min(d.size(), static_cast<size_t>(ctx));
    dropped += static_cast<int64_t>(d.size() - len);
    if (len >= 2) w.emplace_back(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(len));
  }
  if (truncated_tokens != nullptr) *truncated_tokens = dropped;
  return w;
}

PplResult perplexity(const Model& model, const std::vector<std::vector<int32_t>>& windows, const PplOptions& opts) {
  PplResult r;
  r.windows_total = static_cast<int>(windows.size());
  const int n_windows = opts.max_windows > 0 ? std::min<int>(opts.max_windows, r.windows_total) : r.windows_total;
  LOWBIT_CHECK(n_windows > 0, "perplexity: the text is shorter than one window of ", opts.ctx,
               " tokens; use a smaller --ctx");
  const int V = model.config().vocab_size;
  double nll_sum = 0;   // double: 300k terms
  int64_t correct = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  for (int w = 0; w < n_windows; ++w) {
    const auto& toks = windows[static_cast<size_t>(w)];
    const int n = static_cast<int>(toks.size());
    KVCache cache = model.new_cache(n);
    logits.resize(static_cast<size_t>(n) * V);
    if (opts.reference_path) model.forward_ref(toks.data(), n, cache, logits.data(), true, opts.bits);
    else model.forward(toks.data(), n, cache, logits.data(), true, opts.bits);
    double window_nll = 0;
    int64_t window_correct = 0;
#pragma omp parallel for reduction(+ : window_nll, window_correct) schedule(static) if (static_cast<int64_t>(n) * V >= (1 << 16))
    for (int t = 0; t < n - 1; ++t) {
      const float* lg = logits.data() + static_cast<size_t>(t) * V;
      float mx = lg[0];
      int arg = 0;
      for (int i = 1; i < V; ++i)
        if (lg[i] > mx) { mx = lg[i]; arg = i; }
      // float exp (vectorizes) with a double total: 49k terms <= 1 each, so float partial sums lose < 1e-6.
      double sum = 0;
      for (int i0 = 0; i0 < V; i0 += 1024) {
        float part = 0;
        const int i1 = std::min(V, i0 + 1024);
        for (int i = i0; i < i1; ++i) part += std::exp(lg[i] - mx);
        sum += part;
      }
      const int target = toks[static_cast<size_t>(t) + 1];
      window_nll += std::log(sum) + mx - lg[target];
      window_correct += arg == target;
    }
    nll_sum += window_nll;
    correct += window_correct;
    r.predicted += n - 1;
    r.evaluated += n;
    r.windows = w + 1;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opts.progress) opts.progress(w + 1, n_windows, r.predicted, r.seconds);
  }
  r.mean_nll = nll_sum / static_cast<double>(r.predicted);
  r.ppl = std::exp(r.mean_nll);
  r.top1 = static_cast<double>(correct) / static_cast<double>(r.predicted);
  return r;
}

}  // namespace lowbit
