// Text generation on any backend (runtime/backend.h): prefill the prompt in one batched forward, then decode token by
// token with the KV cache, streaming each token's bytes to a callback. Stops at EOS (or the template's end-of-turn
// token), at max_new_tokens, when the context is full, at a stop string, or when the caller cancels.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace lowbit {

class Backend;

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  bool stop_at_eos = true;
  int ctx = 0;   // KV cache capacity; 0 = min(model max, prompt + max_new_tokens)
  int bits = 0;  // any-precision models: the width to generate with (0 = the widest)
  // Generation ends where the text first contains one of these (found across token boundaries); the text and the
  // streamed bytes end just before it. Streaming holds back the last (longest stop - 1) bytes until they cannot
  // start a stop string.
  std::vector<std::string> stop;
  const std::atomic<bool>* cancel = nullptr;   // set by another thread: generation ends before the next token
  // >= 0: each generated token's log-probability under the model (log-softmax of the raw logits, before penalties
  // and temperature) and the `logprobs` most likely alternatives (batch generation only; at most 20).
  int logprobs = -1;
};

// One generated token's log-probability and the most likely tokens at its position (GenerateOptions::logprobs).
struct TokenLogprob {
  int32_t id = 0;
  std::string text;     // the token's bytes
  float logprob = 0;
  struct Alt {
    int32_t id;
    std::string text;
    float logprob;
  };
  std::vector<Alt> top;   // most likely first
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids, new_ids;
  std::string text;                 // decoded new tokens
  std::string stop_reason;          // "eos" | "length" | "context" | "stop" | "cancelled"
  std::vector<TokenLogprob> logprobs;   // one per new id, when GenerateOptions::logprobs >= 0
  // Speculative decoding (runtime/speculative.h): rounds, draft tokens proposed, kept, rejected (one per round at most).
  int64_t spec_rounds = 0, spec_drafted = 0, spec_accepted = 0, spec_rejected = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// The tokens that end a generation: the config's and tokenizer's EOS and the chat templates' end-of-turn tokens.
std::vector<int32_t> stop_tokens(const ModelConfig& c, const Tokenizer& tok);

// One generation's bookkeeping, token by token: EOS / end-of-turn tokens, max_new_tokens, stop strings (with the
// hold-back of streamed bytes that could still start one), the text and the streamed bytes. generate() and the
// batch generator (runtime/batch.h) both drive one, so a request ends the same way on either.
class TokenStream {
 public:
  // stops: stop_tokens() of the model. tok may be null (a model without a tokenizer: ids only, no text).
  TokenStream(const GenerateOptions& opts, const Tokenizer* tok, std::vector<int32_t> stops,
              std::function<void(const std::string&)> on_text);
  // Takes the sampled token `next` into r and history. False when the generation ends here, r.stop_reason set:
  // "eos" (next not taken), "stop" (a stop string appeared; r.text cut before it) or "length" (max_new_tokens
  // reached with next).
  bool accept(int32_t next, GenerateResult& r, std::vector<int32_t>& history);
  // Streams what the stop-string hold-back kept (call once the generation has ended, whatever the reason).
  void finish(GenerateResult& r);

 private:
  bool held_text_stops(std::string& text);
  void emit(const std::string& text, size_t end);
  const GenerateOptions& opts_;
  const Tokenizer* tok_;
  std::vector<int32_t> stops_;
  std::function<void(const std::string&)> on_text_;
  size_t longest_ = 0, emitted_ = 0;
};

// The tokens come from the backend's Decoder (its fastest exact path for opts.sampling); the same seed gives the same
// tokens on the same device. prefill_seconds: the prompt's forward (and, on the GPU, its first token); decode_seconds:
// every later step, waited for.
GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt_ids, const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text = nullptr);
// The same on a loaded CPU model (a CpuBackend borrowing it).
GenerateResult generate(const Model& model, const std::vector<int32_t>& prompt_ids, const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text = nullptr);

}  // namespace lowbit
