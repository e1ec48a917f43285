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

namespace {

// The stop strings and the streamed bytes: emits r.text up to what can no longer be the start of a stop string.
class StopStrings {
 public:
  StopStrings(const std::vector<std::string>& stops, const std::function<void(const std::string&)>& on_text)
      : stops_(stops), on_text_(on_text) {
    for (const std::string& s : stops_) {
      LOWBIT_CHECK(!s.empty(), "generate: a stop string is empty");
      longest_ = std::max(longest_, s.size());
    }
  }
  // After r.text grew: true (and r.text cut before it) when it now holds a stop string.
  bool check(std::string& text) {
    const size_t from = emitted_ > longest_ ? emitted_ - longest_ : 0;
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) cut = std::min(cut, text.find(s, from));
    if (cut != std::string::npos) {
      text.resize(cut);
      flush(text);
      return true;
    }
    const size_t safe = text.size() >= longest_ ? text.size() - (longest_ > 0 ? longest_ - 1 : 0) : 0;
    emit(text, std::max(safe, emitted_));
    return false;
  }
  void flush(const std::string& text) { emit(text, text.size()); }

 private:
  void emit(const std::string& text, size_t end) {
    if (end > emitted_ && on_text_) on_text_(text.substr(emitted_, end - emitted_));
    emitted_ = std::max(emitted_, end);
  }
  const std::vector<std::string>& stops_;
  const std::function<void(const std::string&)>& on_text_;
  size_t longest_ = 0, emitted_ = 0;
};

}  // namespace

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
  StopStrings stop_strings(opts.stop, on_text);
  // Without stop strings every piece is streamed as it comes; with them, through StopStrings' hold-back.
  const std::function<void(const std::string&)> none;
  const std::function<void(const std::string&)>& direct = opts.stop.empty() ? on_text : none;
  for (int i = 0; i < opts.max_new_tokens; ++i) {
    if (opts.cancel != nullptr && opts.cancel->load()) {
      r.stop_reason = "cancelled";
      break;
    }
    const int32_t next = decoder->next(history);
    if (!accept_token(next, stops, opts, tok, r, history, direct)) break;
    if (!opts.stop.empty() && stop_strings.check(r.text)) {
      r.stop_reason = "stop";
      break;
    }
    if (i + 1 == opts.max_new_tokens) break;
    if (seq->length() >= seq->capacity()) {
      r.stop_reason = "context";
      break;
    }
    decoder->advance(next);
  }
  decoder->wait();
  if (!opts.stop.empty()) stop_strings.flush(r.text);   // whatever the hold-back kept, when another reason ended it
  r.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

GenerateResult generate(const Model& model, const std::vector<int32_t>& prompt_ids, const GenerateOptions& opts,
                        const std::function<void(const std::string&)>& on_text) {
  CpuBackend backend(model);
  return generate(backend, prompt_ids, opts, on_text);
}

}  // namespace lowbit
