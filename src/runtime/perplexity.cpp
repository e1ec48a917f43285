#include "runtime/perplexity.h"

#include <chrono>
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"

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

PplResult perplexity(Backend& backend, const std::vector<std::vector<int32_t>>& windows, const PplOptions& opts) {
  PplResult r;
  r.windows_total = static_cast<int>(windows.size());
  const int n_windows = opts.max_windows > 0 ? std::min<int>(opts.max_windows, r.windows_total) : r.windows_total;
  LOWBIT_CHECK(n_windows > 0, "perplexity: the text is shorter than one window of ", opts.ctx,
               " tokens; use a smaller --ctx");
  size_t longest = 0;
  for (int w = 0; w < n_windows; ++w) longest = std::max(longest, windows[static_cast<size_t>(w)].size());
  const std::unique_ptr<Sequence> seq = backend.new_sequence(static_cast<int>(std::max<size_t>(longest, 2)));
  double nll_sum = 0;   // double: 300k terms
  int64_t correct = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int w = 0; w < n_windows; ++w) {
    const auto& toks = windows[static_cast<size_t>(w)];
    const int n = static_cast<int>(toks.size());
    if (n < 2) continue;
    const WindowScore s = backend.score_window(*seq, toks, opts.bits, opts.reference_path);
    nll_sum += s.nll_sum;
    correct += s.top1_hits;
    r.predicted += n - 1;
    r.evaluated += n;
    r.windows = w + 1;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opts.progress) opts.progress(w + 1, n_windows, r.predicted, r.seconds);
  }
  r.mean_nll = r.predicted > 0 ? nll_sum / static_cast<double>(r.predicted) : 0;
  r.ppl = std::exp(r.mean_nll);
  r.top1 = r.predicted > 0 ? static_cast<double>(correct) / static_cast<double>(r.predicted) : 0;
  return r;
}

PplResult perplexity(const Model& model, const std::vector<std::vector<int32_t>>& windows, const PplOptions& opts) {
  CpuBackend backend(model);
  return perplexity(backend, windows, opts);
}

}  // namespace lowbit
