// Perplexity under the GPTQ / SqueezeLLM / QUIK protocol: the text is tokenized once (BOS prepended when the
// tokenizer's default says so, as Hugging Face tokenizers do), cut into non-overlapping windows of ctx tokens
// (the tail shorter than ctx is dropped, as in GPTQ's nsamples = numel // ctx), and every window is scored from a
// fresh context; perplexity = exp(mean NLL over all predicted tokens, i.e. ctx - 1 per window).
// Documents mode scores each document separately ([BOS] + tokens), truncated to ctx tokens as the stories260K
// reference does (its 2,586 predicted tokens come from cutting the 620-token first story to seq_len 512).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"

namespace lowbit {

class Backend;

struct PplOptions {
  int ctx = 2048;
  int max_windows = 0;            // 0 = all
  bool reference_path = false;    // use forward_ref (slow, for tests; CPU only)
  int bits = 0;                   // any-precision models: the width to evaluate (0 = the widest)
  // Called after each window: (windows done, windows total, predicted tokens so far, seconds so far).
  std::function<void(int, int, int64_t, double)> progress;
};

struct PplResult {
  double ppl = 0, mean_nll = 0, top1 = 0;
  int64_t predicted = 0;       // tokens whose probability was scored
  int64_t evaluated = 0;       // tokens run through the model
  int64_t text_tokens = 0;     // tokens in the whole text
  int windows = 0, windows_total = 0;
  double seconds = 0;
  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(evaluated) / seconds : 0; }
};

// windows: token sequences to score independently (each predicts tokens 1..len-1; windows shorter than 2 tokens
// predict nothing and are skipped), on any backend (runtime/backend.h): one KV cache sized for the longest window,
// reused by every window.
PplResult perplexity(Backend& backend, const std::vector<std::vector<int32_t>>& windows, const PplOptions& opts);
// The same on a loaded CPU model (a CpuBackend borrowing it).
PplResult perplexity(const Model& model, const std::vector<std::vector<int32_t>>& windows, const PplOptions& opts);
// Builds the windows for a tokenized single text (GPTQ protocol) or for separate documents.
std::vector<std::vector<int32_t>> make_windows_contiguous(const std::vector<int32_t>& ids, int ctx);
// truncated_tokens (optional) receives how many tokens past ctx were dropped.
std::vector<std::vector<int32_t>> make_windows_documents(const std::vector<std::vector<int32_t>>& docs, int ctx,
                                                         int64_t* truncated_tokens = nullptr);

}  // namespace lowbit
