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

TokenStream::TokenStream(const GenerateOptions& opts, const Tokenizer* tok, std::vector<int32_t> stops,
                         std::function<void(const std::string&)> on_text)
    : opts_(opts), tok_(tok), stops_(std::move(stops)), on_text_(std::move(on_text)) {
  for (const std::string& s : opts_.stop) {
    LOWBIT_CHECK(!s.empty(), "generate: a stop string is empty");
    longest_ = std::max(longest_, s.size());
  }
}

bool TokenStream::accept(int32_t next, GenerateResult& r, std::vector<int32_t>& history) {
  if (opts_.stop_at_eos && std::find(stops_.begin(), stops_.end(), next) != stops_.end()) {
    r.stop_reason = "eos";
    return false;
  }
  r.new_ids.push_back(next);
  history.push_back(next);
  if (tok_ != nullptr) {
    r.text += tok_->token_bytes(next);
    // Without stop strings every piece is streamed as it comes; with them, through the hold-back.
    if (opts_.stop.empty()) emit(r.text, r.text.size());
    else if (held_text_stops(r.text)) {
      r.stop_reason = "stop";
      return false;
    }
  }
  if (static_cast<int>(r.new_ids.size()) >= opts_.max_new_tokens) {
    r.stop_reason = "length";
    return false;
  }
  return true;
}

// After text grew: true (and text cut before it) when it now holds a stop string; otherwise streams what can no
// longer be the start of one.
bool TokenStream::held_text_stops(std::string& text) {
  const size_t from = emitted_ > longest_ ? emitted_ - longest_ : 0;
  size_t cut = std::string::npos;
  for (const std::string& s : opts_.stop) cut = std::min(cut, text.find(s, from));
  if (cut != std::string::npos) {
    text.resize(cut);
    emit(text, text.size());
    return true;
  }
  const size_t safe = text.size() >= longest_ ? text.size() - (longest_ > 0 ? longest_ - 1 : 0) : 0;
  emit(text, std::max(safe, emitted_));
  return false;
}

void TokenStream::finish(GenerateResult& r) { emit(r.text, r.text.size()); }

void TokenStream::emit(const std::string& text, size_t end) {
  if (end > emitted_ && on_text_) on_text_(text.substr(emitted_, end - emitted_));
  emitted_ = std::max(emitted_, end);
}

GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt_ids, const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text) {
  const ModelConfig& c = backend.config();
  const Tokenizer& tok = backend.tokenizer();
  LOWBIT_CHECK(!prompt_ids.empty(), "generate: empty prompt (no tokens)");
  LOWBIT_CHECK(opts.max_new_tokens >= 0, "--max-tokens must be >= 0");
  LOWBIT_CHECK(opts.logprobs < 0, "generate: token log-probabilities are computed by batch generation (lowbit serve)");
  validate_sampling(opts.sampling);
  const int want = static_cast<int>(prompt_ids.size()) + opts.max_new_tokens;
  const int capacity = opts.ctx > 0 ? opts.ctx : std::min(c.max_seq_len, want);
  LOWBIT_CHECK(static_cast<int>(prompt_ids.size()) < capacity || opts.max_new_tokens == 0,
               "the prompt has ", prompt_ids.size(), " tokens, which fills the context of ", capacity);
  const std::unique_ptr<Sequence> seq =
      backend.new_sequence(std::max(capacity, static_cast<int>(prompt_ids.size())));

  GenerateResult r;
  r.prompt_ids = prompt_ids;
  const std::unique_ptr<Decoder> decoder = backend.new_decoder(*seq, opts.sampling, opts.bits);
  std::vector<int32_t> history = prompt_ids;
  const auto t0 = std::chrono::steady_clock::now();
  decoder->prefill(prompt_ids);
  const auto t1 = std::chrono::steady_clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.stop_reason = "length";
  TokenStream stream(opts, &tok, stop_tokens(c, tok), on_text);
  while (static_cast<int>(r.new_ids.size()) < opts.max_new_tokens) {
    if (opts.cancel != nullptr && opts.cancel->load()) {
      r.stop_reason = "cancelled";
      break;
    }
    const int32_t next = decoder->next(history);
    if (!stream.accept(next, r, history)) break;
    if (seq->length() >= seq->capacity()) {
      r.stop_reason = "context";
      break;
    }
    decoder->advance(next);
  }
  decoder->wait();
  stream.finish(r);
  r.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

GenerateResult generate(const Model& model, const std::vector<int32_t>& prompt_ids, const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text) {
  CpuBackend backend(model);
  return generate(backend, prompt_ids, opts, on_text);
}

}  // namespace lowbit
