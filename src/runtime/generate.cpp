#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"

namespace lowbit {

std::vector<int32_t> stop_tokens(const ModelConfig& c, const Tokenizer& tok) {
  // End-of-turn tokens of chat models count as EOS too.
  std::vector<int32_t> stops;
  if (c.eos_id >= 0) stops.push_back(c.eos_id);
  if (tok.eos_id() >= 0) stops.push_back(tok.eos_id());
  for (const char* s : {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"}) {
    const int32_t id = tok.piece_to_id(s);
    if (id >= 0) stops.push_back(id);
  }
  return stops;
}

bool accept_token(int32_t next, const std::vector<int32_t>& stops, const GenerateOptions& opts, const Tokenizer& tok,
                  GenerateResult& r, std::vector<int32_t>& history,
                  const std::function<void(const std::string&)>& on_text) {
  if (opts.stop_at_eos && std::find(stops.begin(), stops.end(), next) != stops.end()) {
    r.stop_reason = "eos";
    return false;
  }
  r.new_ids.push_back(next);
  history.push_back(next);
  const std::string piece = tok.token_bytes(next);
  r.text += piece;
  if (on_text) on_text(piece);
  return true;
}

GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt_ids, const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text) {
  const ModelConfig& c = backend.config();
  const Tokenizer& tok = backend.tokenizer();
  LOWBIT_CHECK(!prompt_ids.empty(), "generate: empty prompt (no tokens)");
  LOWBIT_CHECK(opts.max_new_tokens >= 0, "--max-tokens must be >= 0");
  validate_sampling(opts.sampling);
  const int want = static_cast<int>(prompt_ids.size()) + opts.max_new_tokens;
  const int capacity = opts.ctx > 0 ? opts.ctx : std::min(c.max_seq_len, want);
  LOWBIT_CHECK(static_cast<int>(prompt_ids.size()) < capacity || opts.max_new_tokens == 0,
               "the prompt has ", prompt_ids.size(), " tokens, which fills the context of ", capacity);
  const std::unique_ptr<Sequence> seq =
      backend.new_sequence(std::max(capacity, static_cast<int>(prompt_ids.size())));

  const std::vector<int32_t> stops = stop_tokens(c, tok);

  GenerateResult r;
  r.prompt_ids = prompt_ids;
  const std::unique_ptr<Decoder> decoder = backend.new_decoder(*seq, opts.sampling, opts.bits);
  std::vector<int32_t> history = prompt_ids;
  const auto t0 = std::chrono::steady_clock::now();
  decoder->prefill(prompt_ids);
  const auto t1 = std::chrono::steady_clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.stop_reason = "length";
  for (int i = 0; i < opts.max_new_tokens; ++i) {
    const int32_t next = decoder->next(history);
    if (!accept_token(next, stops, opts, tok, r, history, on_text)) break;
    if (i + 1 == opts.max_new_tokens) break;
    if (seq->length() >= seq->capacity()) {
      r.stop_reason = "context";
      break;
    }
    decoder->advance(next);
  }
  decoder->wait();
  r.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

GenerateResult generate(const Model& model, const std::vector<int32_t>& prompt_ids, const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text) {
  CpuBackend backend(model);
  return generate(backend, prompt_ids, opts, on_text);
}

}  // namespace lowbit
