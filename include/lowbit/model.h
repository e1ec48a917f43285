// lowbit::api::Model: a loaded model (Hugging Face directory, .gguf, llama2.c .bin, or a .lowbit file) on one
// device, with its tokenizer. It generates text and scores perplexity at any width an any-precision file serves,
// switching width per call with no reload.
//
//   auto m = lowbit::api::Model::open("smollm2.anyprec-3to8.lowbit");       // device Auto: the GPU when present
//   for (int b : m.widths()) std::printf("%d ", b);                          // 3 4 8
//   lowbit::api::GenerateParams g;  g.bits = 3;  g.chat = true;  g.max_tokens = 64;
//   m.generate("Why is the sky blue?", g,
//              [](std::string_view piece) { std::fwrite(piece.data(), 1, piece.size(), stdout); });
//   lowbit::api::PplParams p;  p.ctx = 512;  p.max_windows = 4;  p.bits = 8;
//   double ppl = m.perplexity_file("wiki.test.raw", p).perplexity;
//
// Every method throws lowbit::Error (lowbit/error.h) with a one-line message on bad input. A Model is movable, not
// copyable, and not safe to use from two threads at once (it owns one KV cache workspace and, on the GPU, one stream).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/types.h"

namespace lowbit::api {

struct OpenOptions {
  Device device = Device::Auto;
  // llama2.c checkpoints: the tokenizer file ("" = tokenizer.bin or tok512.bin beside the model). Other formats
  // carry their tokenizer; giving one for them is refused.
  std::string tokenizer_path;
  // QUIK models only: the activation width every QUIK linear runs at instead of the stored one: "4", "8", "16"
  // (activations not quantized) or "fp8" (FP8-E4M3, 4-bit weights only). "" = as stored.
  std::string quik_abits;
  // The scalar reference forward (one token at a time, double accumulation): slow, CPU only; the test oracle.
  bool reference = false;
};

// One message of a chat conversation.
struct ChatMessage {
  std::string role;      // "system" | "user" | "assistant"
  std::string content;
};

class Model;

// Decoding settings. validate() states the valid ranges; generate() checks them before any work.
struct GenerateParams {
  int max_tokens = 128;             // new tokens at most, >= 0
  float temperature = 0.0f;         // >= 0; 0 = greedy (argmax), otherwise sample softmax(logits / temperature)
  // top_k, top_p and seed shape sampling only (temperature > 0); greedy decoding does not read them.
  int top_k = 0;                    // >= 0; keep the k most likely tokens before sampling (0 = off)
  float top_p = 1.0f;               // in (0, 1]; keep the smallest set of tokens holding this mass (1 = off)
  float repetition_penalty = 1.0f;  // > 0; CTRL / Hugging Face convention: logits of seen tokens divided (if positive)
                                    // or multiplied (if negative) by it (1 = off)
  // OpenAI convention, in [-2, 2], over the generated tokens: logit -= presence * (seen) + frequency * count (0 = off)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;                // sampling RNG seed: the same seed gives the same text on the same device
  int bits = 0;                     // any-precision models: the width to generate with (0 = the widest)
  bool chat = false;                // text prompts: wrap the prompt as a user turn in the model's chat template
  std::string system;               // chat: system message ("" = the template's default, if it has one)
  bool stop_at_eos = true;          // stop at EOS or the chat template's end-of-turn token
  int ctx = 0;                      // KV cache capacity in tokens (0 = min(model context, prompt + max_tokens))
  // Stop strings (non-empty): generation ends where the text first contains one, found across token boundaries; the
  // text, and the bytes streamed to the callback, end just before it. While they are set the callback receives a
  // piece only once it can no longer be the start of a stop string.
  std::vector<std::string> stop;
  // Set from another thread to end the generation before its next token (StopReason::Cancelled); null = never.
  const std::atomic<bool>* cancel = nullptr;
  // Batch generation only (Batch::add; generate() refuses it): >= 0 records each generated token's log-probability
  // (log-softmax of the model's logits, before penalties and temperature) and this many most likely alternatives
  // (0..20) in GenerateResult::logprobs. -1 = off.
  int logprobs = -1;
  // Speculative decoding: draft_bits > 0 drafts with this any-precision width of the same model
  // (below `bits`), or with `draft` (a separate model with the same vocabulary, at draft_bits; 0 = its widest);
  // the target checks the drafts in one forward and the output is the target's (greedy: its tokens; sampling: its
  // distribution). draft_k: draft tokens per round (0 = adaptive, 1..8). Batch::add takes draft_bits (the same
  // model, two slots), not a separate draft model.
  int draft_bits = 0;
  int draft_k = 0;
  Model* draft = nullptr;
};

// A generated token's log-probability and the most likely tokens at its position (GenerateParams::logprobs).
struct TokenLogprobs {
  int32_t id = 0;
  std::string text;     // the token's bytes (may be part of a UTF-8 character)
  float logprob = 0;
  struct Alternative {
    int32_t id;
    std::string text;
    float logprob;
  };
  std::vector<Alternative> top;   // most likely first
};

enum class StopReason {
  Eos,       // the model produced EOS / end-of-turn (not included in the output)
  Length,    // max_tokens reached
  Context,   // the KV cache (ctx) is full
  Stop,      // a stop string appeared (not included in the output)
  Cancelled, // GenerateParams::cancel was set
};
const char* stop_reason_name(StopReason r);   // "eos", "length", "context", "stop", "cancelled"

struct GenerateResult {
  std::vector<int32_t> prompt_ids;  // the prompt as run (chat template and BOS applied)
  std::vector<int32_t> new_ids;     // generated tokens, EOS excluded
  std::string text;                 // the generated tokens' bytes, concatenated
  StopReason stop_reason = StopReason::Length;
  std::vector<TokenLogprobs> logprobs;   // one per new id when GenerateParams::logprobs >= 0
  // Speculative decoding: target forwards after the prompt, draft tokens proposed, kept, and rejected (a round ends
  // at its first rejected draft; the drafts after it are not checked). 0 without it.
  int64_t target_forwards = 0, drafted_tokens = 0, accepted_tokens = 0, rejected_tokens = 0;
  double prefill_seconds = 0;       // the prompt's forward pass
  double decode_seconds = 0;        // every generated token after the first
  double prefill_tokens_per_s() const { return prefill_seconds > 0 ? prompt_ids.size() / prefill_seconds : 0.0; }
  double decode_tokens_per_s() const { return decode_seconds > 0 ? new_ids.size() / decode_seconds : 0.0; }
};

// Called with the bytes of each generated token as soon as it is sampled. A piece may be part of a UTF-8 character
// (byte-level vocabularies split characters); concatenated, the pieces are GenerateResult::text.
using TokenCallback = std::function<void(std::string_view piece)>;

// How an evaluation text becomes documents.
enum class TextMode {
  Auto,        // WikiText for *.raw / *.tokens files whose name holds "wiki", Jsonl for *.jsonl, Documents when a
               // doc_separator is given, else Plain
  Plain,       // the text as is: one document
  WikiText,    // GPTQ / SqueezeLLM / QUIK protocol for wiki.test.raw: rows joined with "\n\n", one document
  Jsonl,       // one document per JSON line (field jsonl_field), joined with "\n\n" into one text (C4)
  Documents,   // split on doc_separator; each document scored on its own from BOS, truncated to ctx
};

// Perplexity settings. Plain / WikiText / Jsonl: the text is tokenized once (BOS first when the tokenizer's config
// says so) and cut into non-overlapping windows of ctx tokens, the shorter tail dropped (GPTQ's protocol); each
// window is scored from a fresh context. perplexity = exp(mean NLL over every predicted token: ctx - 1 per window).
struct PplParams {
  int ctx = 2048;                   // window length in tokens, >= 2; longer than the model's context: capped to it
  int max_windows = 0;              // score only the first N windows (0 = all): a quick subset
  int bits = 0;                     // any-precision models: the width to score (0 = the widest)
  TextMode mode = TextMode::Auto;
  std::string jsonl_field = "text"; // Jsonl: the field that holds each document's text
  std::string doc_separator;        // Documents: the string between documents (e.g. "<|endoftext|>")
};

// The windows a text was cut into, ready to score (possibly at several widths).
struct EvalWindows {
  std::vector<std::vector<int32_t>> windows;   // token ids; each window is scored from a fresh context
  TextMode mode = TextMode::Plain;             // the resolved mode
  int documents = 0;                           // documents the text held (Jsonl, Documents; 1 otherwise)
  int64_t text_tokens = 0;                     // tokens in the whole text
  int64_t truncated_tokens = 0;                // Documents: tokens past ctx, not scored
  int ctx = 0;                                 // the window length used (PplParams::ctx capped to the model)
  std::string description;                     // e.g. "512 jsonl documents joined with "\n\n", 1048575 bytes"
};

struct PplResult {
  double perplexity = 0;            // exp(mean_nll)
  double mean_nll = 0;              // nats per predicted token
  double top1 = 0;                  // fraction of predicted tokens that were the argmax
  int64_t predicted_tokens = 0;     // tokens whose probability was scored
  int64_t evaluated_tokens = 0;     // tokens run through the model
  int windows = 0;                  // windows scored
  int windows_total = 0;            // windows the text gave (windows < windows_total: a max_windows subset)
  double seconds = 0;
  double tokens_per_s() const { return seconds > 0 ? evaluated_tokens / seconds : 0.0; }
};

// Continuous batching (what `lowbit serve` runs): settings of Model::new_batch.
struct BatchParams {
  int max_seqs = 8;              // generations in flight at most
  int ctx = 0;                   // positions per generation, prompt and completion (0 = the model's context)
  int prefill_chunk = 512;       // prompt tokens one step() runs at most, so that running streams keep moving
  // The paged KV cache's size: > 0 this many bytes; 0: what the device has free (the GPU: its free memory less a
  // margin; the CPU: unbounded, pages committed as written), at most every generation at ctx positions.
  uint64_t kv_cache_bytes = 0;
};

// Many generations on one model, advanced together: each step() runs a chunk of the waiting prompts and then one
// token of every running generation (any-precision models: each generation at its own width, from the one copy of
// the weights; on the GPU up to 8 rows of different widths share one forward, otherwise one forward per width). The KV cache is paged: generations take blocks of it as they
// grow, so many short ones share the memory of a few long ones; when blocks run out, prompts wait, and a running
// generation may be preempted and later resumed (its context run again), its output unchanged. A generation ends, streams and stops exactly as
// Model::generate would run it (tokens picked on the host by the CPU sampler; greedy requests give generate()'s
// tokens up to rounding of the batched matrix products). Not safe to use from two threads at once; it borrows the
// Model, which must outlive it and must not generate on its own meanwhile.
class Batch {
 public:
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  int slots() const;        // generations in flight at most
  int free_slots() const;
  int active() const;       // generations started and not yet ended
  int ctx() const;          // positions per generation
  // Starts a generation of a tokenized prompt (Model::prompt_ids for text); params.cancel is honoured before every
  // token. Returns its id. Errors (nothing started): no free slot, a bad prompt or setting, an unserved width.
  // on_logprobs (optional, with params.logprobs >= 0): each token's log-probabilities as it is taken.
  uint64_t add(const std::vector<int32_t>& prompt_ids, const GenerateParams& params, TokenCallback on_token = nullptr,
               std::function<void(const TokenLogprobs&)> on_logprobs = nullptr);
  struct Finished {
    uint64_t id;
    GenerateResult result;
  };
  // One round; on_token callbacks run inside it. Returns the generations that ended (their slots free again).
  std::vector<Finished> step();

  int last_decode_rows() const;        // generations that ran a decode step in the last round
  int last_decode_forwards() const;    // forwards that step took (one per width present)
  int64_t kv_positions_used() const;   // KV positions the active generations have filled
  int64_t kv_positions_total() const;  // positions in the paged cache's blocks
  int kv_blocks_used() const;          // blocks held by the active generations
  int kv_blocks_total() const;
  int64_t preemptions() const;         // generations preempted for KV blocks so far
  uint64_t kv_bytes() const;           // device memory of the KV cache

  class Impl;

 private:
  friend class Model;
  explicit Batch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Called after each window: windows done so far, windows to score, predicted tokens so far, seconds so far.
using PplProgress = std::function<void(int done, int total, int64_t predicted_tokens, double seconds)>;

// Decode / prefill speed measurement (`lowbit bench MODEL`).
struct SpeedParams {
  int prefill = 512;   // prompt tokens of the prefill measurement (capped so that the prompt and the decode steps
                       // fit the context)
  int decode = 64;     // tokens of the decode measurement, >= 3
  int reps = 3;        // prefill repetitions; the median is reported
  int bits = 0;        // any-precision models: the width (0 = the widest)
};
struct SpeedResult {
  int prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0;       // median of reps: one forward of prefill_tokens tokens
  double decode_seconds = 0;        // decode_tokens single-token steps after the prompt
  uint64_t weight_bytes_per_token = 0;   // weight bytes one decode step reads at this width
  double prefill_tokens_per_s() const { return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0.0; }
  double decode_tokens_per_s() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0; }
};

class Model {
 public:
  // Reads the file (format detected from its contents), checks every tensor's presence and shape, and places the
  // weights on the device. Errors: missing or malformed file, unsupported architecture, Device::Cuda unavailable.
  static Model open(const std::string& path, const OpenOptions& opts = {});

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;
  Device device() const;                  // Cpu or Cuda: where this model runs (Auto resolved)
  std::string device_name() const;        // "cpu" or "cuda: NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
  // Widths an any-precision model serves, ascending (e.g. {3, 4, 8}); empty for a single-precision model.
  std::vector<int> widths() const;
  // Refuses (Error) a width the model does not serve; 0 (the widest / the only one) is always accepted.
  void check_bits(int bits) const;
  // Bytes of weights one decode step reads at this width (linears at their stored size, and the output head).
  uint64_t weight_bytes_per_token(int bits = 0) const;
  uint64_t file_bytes() const;            // size of the model on disk (all files of a directory)

  // --- tokenizer (Error when the model carries none) ---
  bool has_tokenizer() const;
  // add_bos: prepend BOS (when the vocabulary has one). parse_special: text such as "<|im_start|>" becomes its
  // control token instead of being encoded as characters (leave it off for untrusted text).
  std::vector<int32_t> tokenize(std::string_view text, bool add_bos, bool parse_special = false) const;
  // Whether the tokenizer's own configuration prepends BOS (Hugging Face add_bos_token, GGUF add_bos_token).
  bool adds_bos_by_default() const;
  // Inverse of tokenize: tokenize's text back (the SentencePiece dummy-prefix space dropped). render_special writes
  // control tokens (BOS, <|im_end|>, ...) as their text instead of dropping them.
  std::string detokenize(const std::vector<int32_t>& ids, bool render_special = false) const;
  bool has_chat_template() const;
  // The prompt text the model's chat template makes of messages, with the assistant turn opened. Error when the
  // model has no chat template or lowbit does not recognise it (ChatML, Llama 3 and Llama 2 / Mistral are).
  std::string apply_chat_template(const std::vector<ChatMessage>& messages) const;

  // --- generation ---
  // A text prompt: with params.chat, wrapped in the chat template (parse_special on, for the template's tokens);
  // otherwise tokenized as text (BOS first when the tokenizer prepends it or is SentencePiece).
  GenerateResult generate(const std::string& prompt, const GenerateParams& params,
                          const TokenCallback& on_token = nullptr);
  // A tokenized prompt (params.chat and params.system must be unset).
  GenerateResult generate(const std::vector<int32_t>& prompt_ids, const GenerateParams& params,
                          const TokenCallback& on_token = nullptr);

  // The token ids generate(prompt, params) runs for a text prompt (chat template, BOS).
  std::vector<int32_t> prompt_ids(const std::string& prompt, const GenerateParams& params) const;

  // --- continuous batching ---
  std::unique_ptr<Batch> new_batch(const BatchParams& params);

  // --- perplexity ---
  // Reads a text file and cuts it into windows under params (mode, ctx, jsonl_field, doc_separator).
  EvalWindows eval_windows_from_file(const std::string& path, const PplParams& params) const;
  // The same for text in memory (TextMode::Auto means Plain, or Documents when doc_separator is set).
  EvalWindows eval_windows_from_text(std::string_view text, const PplParams& params) const;
  // Scores prepared windows at params.bits (params.max_windows applies; ctx and the text fields are not used).
  PplResult perplexity(const EvalWindows& windows, const PplParams& params, const PplProgress& progress = nullptr);
  // Windows of tokens given directly, each scored from a fresh context (at least 2 tokens each).
  PplResult perplexity(const std::vector<std::vector<int32_t>>& windows, const PplParams& params,
                       const PplProgress& progress = nullptr);
  // eval_windows_from_file + perplexity.
  PplResult perplexity_file(const std::string& path, const PplParams& params, const PplProgress& progress = nullptr);

  // --- speed ---
  // Times a prefill of params.prefill random tokens (median of reps, fresh cache each, after one untimed run) and
  // params.decode greedy single-token steps after it (after two untimed steps), on this model's device.
  SpeedResult measure_speed(const SpeedParams& params);

  class Impl;   // defined in the library only

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Refuses (Error) sampling settings out of range, naming the option and the value; generate() calls it first.
void validate(const GenerateParams& params);
// Refuses (Error) perplexity settings out of range (ctx < 2, max_windows < 0, bits < 0, Documents without separator).
void validate(const PplParams& params);

}  // namespace lowbit::api
