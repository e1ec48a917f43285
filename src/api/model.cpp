// lowbit::api::Model over the runtime's one front end (runtime/backend.h): open_backend picks the device, and
// generation, perplexity and timing go through the Backend, so the CPU and the GPU give the numbers the runtime's
// own perplexity() and generate() give.
#include "lowbit/model.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "api/internal.h"
#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/chat_template.h"
#include "runtime/batch.h"
#include "runtime/cpu_backend.h"
#include "runtime/eval_text.h"
#include "runtime/speculative.h"

namespace lowbit::api {

class Model::Impl {
 public:
  std::unique_ptr<lowbit::Backend> backend;
  ModelInfo info;
  Device device = Device::Cpu;
  uint64_t file_bytes = 0;

  const Tokenizer& tok() const { return backend->tokenizer(); }
  EvalWindows windows(const EvalText& text, const PplParams& p) const;
};

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint64_t bytes_on_disk(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    const uintmax_t n = fs::file_size(path, ec);
    return ec ? 0 : static_cast<uint64_t>(n);
  }
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file(ec)) total += static_cast<uint64_t>(e.file_size(ec));
  return total;
}

lowbit::Device internal_device(Device d) {
  switch (d) {
    case Device::Auto: return lowbit::Device::Auto;
    case Device::Cpu: return lowbit::Device::Cpu;
    case Device::Cuda: return lowbit::Device::Cuda;
  }
  return lowbit::Device::Auto;
}

lowbit::TextMode internal_mode(TextMode m) {
  switch (m) {
    case TextMode::Auto: return lowbit::TextMode::Auto;
    case TextMode::Plain: return lowbit::TextMode::Plain;
    case TextMode::WikiText: return lowbit::TextMode::WikiText;
    case TextMode::Jsonl: return lowbit::TextMode::Jsonl;
    case TextMode::Documents: return lowbit::TextMode::Documents;
  }
  return lowbit::TextMode::Auto;
}

TextMode public_mode(lowbit::TextMode m) {
  switch (m) {
    case lowbit::TextMode::Auto: return TextMode::Auto;
    case lowbit::TextMode::Plain: return TextMode::Plain;
    case lowbit::TextMode::WikiText: return TextMode::WikiText;
    case lowbit::TextMode::Jsonl: return TextMode::Jsonl;
    case lowbit::TextMode::Documents: return TextMode::Documents;
  }
  return TextMode::Plain;
}

StopReason public_stop(const std::string& s) {
  if (s == "eos") return StopReason::Eos;
  if (s == "context") return StopReason::Context;
  if (s == "stop") return StopReason::Stop;
  if (s == "cancelled") return StopReason::Cancelled;
  return StopReason::Length;
}

GenerateOptions generate_options(const GenerateParams& params) {
  GenerateOptions o;
  o.max_new_tokens = params.max_tokens;
  o.sampling.temperature = params.temperature;
  o.sampling.top_k = params.top_k;
  o.sampling.top_p = params.top_p;
  o.sampling.repetition_penalty = params.repetition_penalty;
  o.sampling.seed = params.seed;
  o.sampling.presence_penalty = params.presence_penalty;
  o.sampling.frequency_penalty = params.frequency_penalty;
  o.logprobs = params.logprobs;
  o.stop_at_eos = params.stop_at_eos;
  o.ctx = params.ctx;
  o.bits = params.bits;
  o.stop = params.stop;
  o.cancel = params.cancel;
  return o;
}

TokenLogprobs public_logprob(const lowbit::TokenLogprob& lp) {
  TokenLogprobs out;
  out.id = lp.id;
  out.text = lp.text;
  out.logprob = lp.logprob;
  for (const auto& a : lp.top) out.top.push_back({a.id, a.text, a.logprob});
  return out;
}

GenerateResult public_result(const lowbit::GenerateResult& r) {
  GenerateResult out;
  for (const lowbit::TokenLogprob& lp : r.logprobs) out.logprobs.push_back(public_logprob(lp));
  out.target_forwards = r.spec_rounds;
  out.drafted_tokens = r.spec_drafted;
  out.accepted_tokens = r.spec_accepted;
  out.rejected_tokens = r.spec_rejected;
  out.prompt_ids = r.prompt_ids;
  out.new_ids = r.new_ids;
  out.text = r.text;
  out.stop_reason = public_stop(r.stop_reason);
  out.prefill_seconds = r.prefill_seconds;
  out.decode_seconds = r.decode_seconds;
  return out;
}

}  // namespace

void validate(const GenerateParams& p) {
  LOWBIT_CHECK(p.max_tokens >= 0, "--max-tokens must be >= 0, got ", p.max_tokens);
  LOWBIT_CHECK(p.bits >= 0, "--bits must be >= 0 (0 = the widest), got ", p.bits);
  LOWBIT_CHECK(p.ctx >= 0, "generate: ctx must be >= 0 (0 = prompt + max tokens), got ", p.ctx);
  for (const std::string& s : p.stop) LOWBIT_CHECK(!s.empty(), "--stop: a stop string must not be empty");
  SamplingParams s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.repetition_penalty = p.repetition_penalty;
  s.presence_penalty = p.presence_penalty;
  s.frequency_penalty = p.frequency_penalty;
  validate_sampling(s);
  LOWBIT_CHECK(p.logprobs >= -1 && p.logprobs <= 20, "logprobs must be in [-1, 20] (-1 = off), got ", p.logprobs);
  LOWBIT_CHECK(p.draft_bits >= 0, "--draft-bits must be >= 0 (0 = off), got ", p.draft_bits);
  LOWBIT_CHECK(p.draft_k >= 0 && p.draft_k <= 8, "--draft-k must be in [0, 8] (0 = adaptive), got ", p.draft_k);
}

void validate(const PplParams& p) {
  LOWBIT_CHECK(p.ctx >= 2, "--ctx must be >= 2, got ", p.ctx);
  LOWBIT_CHECK(p.max_windows >= 0, "--max-windows must be >= 0 (0 = all), got ", p.max_windows);
  LOWBIT_CHECK(p.bits >= 0, "--bits must be >= 0 (0 = the widest), got ", p.bits);
  LOWBIT_CHECK(p.mode != TextMode::Documents || !p.doc_separator.empty(),
               "--text-mode docs needs --doc-separator (the string between documents)");
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::open(const std::string& path, const OpenOptions& opts) {
  BackendOptions bo;
  bo.device = internal_device(opts.device);
  bo.load.tokenizer_path = opts.tokenizer_path;
  bo.load.quik_abits = opts.quik_abits;
  bo.reference = opts.reference;
  auto impl = std::make_unique<Impl>();
  impl->backend = open_backend(path, bo);
  const lowbit::Backend& b = *impl->backend;
  detail::check_tokenizer_option(b.model_format(), path, opts.tokenizer_path);
  impl->info = detail::model_info(b.config(), b.model_format(), b.path());
  impl->device = dynamic_cast<const CpuBackend*>(&b) != nullptr ? Device::Cpu : Device::Cuda;
  impl->file_bytes = bytes_on_disk(path);
  return Model(std::move(impl));
}

const ModelInfo& Model::info() const { return impl_->info; }
Device Model::device() const { return impl_->device; }
std::string Model::device_name() const { return impl_->backend->device_name(); }
std::vector<int> Model::widths() const { return impl_->backend->widths(); }
void Model::check_bits(int bits) const { impl_->backend->check_bits(bits); }
uint64_t Model::weight_bytes_per_token(int bits) const {
  check_bits(bits);
  return impl_->backend->weight_bytes_per_token(bits);
}
uint64_t Model::file_bytes() const { return impl_->file_bytes; }

bool Model::has_tokenizer() const { return impl_->backend->has_tokenizer(); }

std::vector<int32_t> Model::tokenize(std::string_view text, bool add_bos, bool parse_special) const {
  return impl_->tok().encode(text, add_bos, parse_special);
}

bool Model::adds_bos_by_default() const { return impl_->tok().add_bos_default(); }

std::string Model::detokenize(const std::vector<int32_t>& ids, bool render_special) const {
  const Tokenizer& tok = impl_->tok();
  for (int32_t id : ids)
    LOWBIT_CHECK(id >= 0 && id < tok.vocab_size(), "detokenize: token id ", id, " is outside the vocabulary of ",
                 tok.vocab_size());
  return tok.decode(ids, render_special);
}

bool Model::has_chat_template() const { return has_tokenizer() && !impl_->tok().vocab().chat_template.empty(); }

std::string Model::apply_chat_template(const std::vector<ChatMessage>& messages) const {
  const Tokenizer& tok = impl_->tok();
  std::vector<lowbit::ChatMessage> msgs;
  for (const ChatMessage& m : messages) {
    LOWBIT_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "chat: unknown role '", m.role,
                 "' (system, user, assistant)");
    msgs.push_back({m.role, m.content});
  }
  const std::string bos = tok.bos_id() >= 0 ? tok.token_bytes(tok.bos_id(), true) : "";
  return lowbit::apply_chat_template(tok.vocab().chat_template, msgs, bos);
}

std::vector<int32_t> Model::prompt_ids(const std::string& prompt, const GenerateParams& params) const {
  LOWBIT_CHECK(params.chat || params.system.empty(), "--system needs --chat");
  const Tokenizer& tok = impl_->tok();
  std::vector<int32_t> ids;
  if (params.chat) {
    std::vector<ChatMessage> msgs;
    if (!params.system.empty()) msgs.push_back({"system", params.system});
    msgs.push_back({"user", prompt});
    ids = tok.encode(apply_chat_template(msgs), /*add_bos=*/false, /*parse_special=*/true);
  } else {
    ids = tok.encode(prompt, tok.add_bos_default() || tok.kind() == TokenizerKind::SentencePieceBpe,
                     /*parse_special=*/false);
  }
  return ids;
}

GenerateResult Model::generate(const std::string& prompt, const GenerateParams& params, const TokenCallback& on_token) {
  validate(params);
  const std::vector<int32_t> ids = prompt_ids(prompt, params);
  GenerateParams p = params;
  p.chat = false;
  p.system.clear();
  return generate(ids, p, on_token);
}

GenerateResult Model::generate(const std::vector<int32_t>& prompt_ids, const GenerateParams& params,
                               const TokenCallback& on_token) {
  detail::apply_cpu_threads();
  validate(params);
  LOWBIT_CHECK(!params.chat && params.system.empty(), "generate: chat and system apply to text prompts");
  check_bits(params.bits);
  const int vocab = impl_->backend->config().vocab_size;
  for (int32_t id : prompt_ids)
    LOWBIT_CHECK(id >= 0 && id < vocab, "generate: prompt token id ", id, " is outside the vocabulary of ", vocab);
  std::function<void(const std::string&)> on_text;
  if (on_token) on_text = [&on_token](const std::string& piece) { on_token(piece); };
  LOWBIT_CHECK(params.draft == nullptr || params.draft != this, "--draft: the draft must be another model (for the same "
               "model's low-bit view use draft_bits alone)");
  if (params.draft_bits == 0 && params.draft == nullptr)
    return public_result(lowbit::generate(*impl_->backend, prompt_ids, generate_options(params), on_text));
  SpeculativeOptions so;
  so.draft_bits = params.draft_bits;
  so.k = params.draft_k;
  lowbit::Backend& draft = params.draft != nullptr ? *params.draft->impl_->backend : *impl_->backend;
  return public_result(
      lowbit::generate_speculative(*impl_->backend, draft, prompt_ids, generate_options(params), so, on_text));
}

class Batch::Impl {
 public:
  Impl(lowbit::Backend& b, const BatchOptions& o) : gen(b, o) {}
  lowbit::BatchGenerator gen;
  uint64_t kv_bytes = 0;
};

Batch::Batch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Batch::~Batch() = default;
int Batch::slots() const { return impl_->gen.slots(); }
int Batch::free_slots() const { return impl_->gen.free_slots(); }
int Batch::active() const { return impl_->gen.active(); }
int Batch::ctx() const { return impl_->gen.capacity(); }
int Batch::last_decode_rows() const { return impl_->gen.last_decode_rows(); }
int Batch::last_decode_forwards() const { return impl_->gen.last_decode_forwards(); }
int64_t Batch::kv_positions_used() const { return impl_->gen.kv_positions_used(); }
int64_t Batch::kv_positions_total() const { return impl_->gen.kv_positions_total(); }
int Batch::kv_blocks_used() const { return impl_->gen.kv_blocks_used(); }
int Batch::kv_blocks_total() const { return impl_->gen.kv_blocks_total(); }
int64_t Batch::preemptions() const { return impl_->gen.preemptions(); }
uint64_t Batch::kv_bytes() const { return impl_->kv_bytes; }

uint64_t Batch::add(const std::vector<int32_t>& prompt_ids, const GenerateParams& params, TokenCallback on_token,
                    std::function<void(const TokenLogprobs&)> on_logprobs) {
  validate(params);
  LOWBIT_CHECK(!params.chat && params.system.empty(), "batch: chat and system apply to text prompts (Model::prompt_ids)");
  LOWBIT_CHECK(params.draft == nullptr, "batch: a separate draft model runs in generate() only (draft_bits drafts "
               "with the same model's low-bit view)");
  std::function<void(const std::string&)> on_text;
  if (on_token) on_text = [cb = std::move(on_token)](const std::string& piece) { cb(piece); };
  lowbit::BatchGenerator::OnToken on_id;
  if (on_logprobs)
    on_id = [cb = std::move(on_logprobs)](int32_t, const lowbit::TokenLogprob* lp) {
      if (lp != nullptr) cb(public_logprob(*lp));
    };
  SpeculativeOptions so;
  so.draft_bits = params.draft_bits;
  so.k = params.draft_k;
  return impl_->gen.add(prompt_ids, generate_options(params), std::move(on_text), std::move(on_id),
                        params.draft_bits > 0 ? &so : nullptr);
}

std::vector<Batch::Finished> Batch::step() {
  detail::apply_cpu_threads();
  std::vector<Finished> out;
  for (lowbit::BatchGenerator::Finished& f : impl_->gen.step()) out.push_back({f.id, public_result(f.result)});
  return out;
}

std::unique_ptr<Batch> Model::new_batch(const BatchParams& params) {
  lowbit::Backend& b = *impl_->backend;
  LOWBIT_CHECK(params.ctx >= 0, "batch: ctx must be >= 0 (0 = the model's context), got ", params.ctx);
  BatchOptions o;
  o.capacity = params.ctx > 0 ? std::min(params.ctx, b.config().max_seq_len) : b.config().max_seq_len;
  o.prefill_chunk = params.prefill_chunk;
  o.max_seqs = params.max_seqs;
  LOWBIT_CHECK(o.max_seqs >= 1, "batch: max sequences must be >= 1, got ", o.max_seqs);
  // The KV pool: --kv-cache-gb, or what the device has free; never more than every slot full.
  const uint64_t block_bytes = b.kv_bytes_per_position() * kKvBlock;
  const uint64_t budget = params.kv_cache_bytes > 0 ? params.kv_cache_bytes : b.kv_bytes_available();
  const uint64_t full = static_cast<uint64_t>(full_kv_blocks(o.max_seqs, o.capacity));
  const uint64_t blocks = std::min(full, budget / block_bytes);
  const uint64_t one = static_cast<uint64_t>(full_kv_blocks(1, o.capacity));
  LOWBIT_CHECK(blocks >= one, params.kv_cache_bytes > 0 ? "--kv-cache-gb: " : "the device's free memory: ",
               budget / 1e9, " GB holds no generation of ", o.capacity, " positions (", one * block_bytes / 1e9,
               " GB each); ", params.kv_cache_bytes > 0 ? "raise it" : "set --kv-cache-gb", " or lower --ctx");
  o.kv_blocks = static_cast<int>(blocks);
  auto impl = std::make_unique<Batch::Impl>(b, o);
  impl->kv_bytes = blocks * block_bytes;
  return std::unique_ptr<Batch>(new Batch(std::move(impl)));
}

EvalWindows Model::Impl::windows(const EvalText& text, const PplParams& p) const {
  validate(p);
  const Tokenizer& t = tok();
  EvalWindows w;
  w.mode = public_mode(text.mode);
  w.documents = text.documents;
  w.description = text.describe();
  w.ctx = std::min(p.ctx, backend->config().max_seq_len);
  if (text.mode == lowbit::TextMode::Documents) {
    LOWBIT_CHECK(t.bos_id() >= 0, info.path, ": documents mode needs a BOS token, the tokenizer has none");
    std::vector<std::vector<int32_t>> docs;
    for (const auto& d : text.docs) {
      docs.push_back(t.encode(d, /*add_bos=*/true, /*parse_special=*/false));
      w.text_tokens += static_cast<int64_t>(docs.back().size());
    }
    w.windows = make_windows_documents(docs, w.ctx, &w.truncated_tokens);
  } else {
    // parse_special=false: evaluation text is data, never control tokens.
    const std::vector<int32_t> ids = t.encode(text.docs[0], t.add_bos_default(), /*parse_special=*/false);
    w.text_tokens = static_cast<int64_t>(ids.size());
    w.windows = make_windows_contiguous(ids, w.ctx);
  }
  return w;
}

EvalWindows Model::eval_windows_from_file(const std::string& path, const PplParams& params) const {
  validate(params);
  return impl_->windows(load_eval_text(path, internal_mode(params.mode), params.jsonl_field, params.doc_separator),
                        params);
}

EvalWindows Model::eval_windows_from_text(std::string_view text, const PplParams& params) const {
  validate(params);
  return impl_->windows(split_eval_text(std::string(text), "", internal_mode(params.mode), params.jsonl_field,
                                        params.doc_separator),
                        params);
}

PplResult Model::perplexity(const EvalWindows& windows, const PplParams& params, const PplProgress& progress) {
  return perplexity(windows.windows, params, progress);
}

PplResult Model::perplexity(const std::vector<std::vector<int32_t>>& windows, const PplParams& params,
                            const PplProgress& progress) {
  detail::apply_cpu_threads();
  validate(params);
  check_bits(params.bits);
  const int vocab = impl_->backend->config().vocab_size;
  const size_t scored = params.max_windows > 0 ? std::min<size_t>(windows.size(), params.max_windows) : windows.size();
  LOWBIT_CHECK(scored > 0, "perplexity: no windows to score (the text is shorter than one window of ", params.ctx,
               " tokens; use a smaller --ctx)");
  for (size_t i = 0; i < scored; ++i) {
    LOWBIT_CHECK(windows[i].size() >= 2 && windows[i].size() <= static_cast<size_t>(impl_->backend->config().max_seq_len),
                 "perplexity: window ", i, " has ", windows[i].size(), " tokens (2 to the model's ",
                 impl_->backend->config().max_seq_len, ")");
    for (int32_t id : windows[i])
      LOWBIT_CHECK(id >= 0 && id < vocab, "perplexity: token id ", id, " in window ", i,
                   " is outside the vocabulary of ", vocab);
  }
  PplOptions o;
  o.ctx = params.ctx;
  o.max_windows = params.max_windows;
  o.bits = params.bits;
  if (progress) o.progress = progress;
  const lowbit::PplResult r = lowbit::perplexity(*impl_->backend, windows, o);
  PplResult out;
  out.perplexity = r.ppl;
  out.mean_nll = r.mean_nll;
  out.top1 = r.top1;
  out.predicted_tokens = r.predicted;
  out.evaluated_tokens = r.evaluated;
  out.windows = r.windows;
  out.windows_total = r.windows_total;
  out.seconds = r.seconds;
  return out;
}

PplResult Model::perplexity_file(const std::string& path, const PplParams& params, const PplProgress& progress) {
  return perplexity(eval_windows_from_file(path, params), params, progress);
}

SpeedResult Model::measure_speed(const SpeedParams& params) {
  detail::apply_cpu_threads();
  LOWBIT_CHECK(params.decode >= 3, "--decode must be >= 3, got ", params.decode);
  LOWBIT_CHECK(params.prefill >= 1, "--prefill must be >= 1, got ", params.prefill);
  LOWBIT_CHECK(params.reps >= 1, "--reps must be >= 1, got ", params.reps);
  check_bits(params.bits);
  lowbit::Backend& b = *impl_->backend;
  const ModelConfig& c = b.config();
  // Untimed decode steps before the timed ones: the GPU captures its decode graph on the first.
  constexpr int kWarmSteps = 2;
  const int P = std::min(params.prefill, c.max_seq_len - params.decode - kWarmSteps);
  LOWBIT_CHECK(P >= 1, "--prefill + --decode exceed the model context of ", c.max_seq_len);
  std::mt19937 rng(1);
  std::vector<int32_t> toks(static_cast<size_t>(P));
  for (auto& t : toks) t = static_cast<int32_t>(rng() % static_cast<unsigned>(c.vocab_size));
  const SamplingParams greedy;
  SpeedResult r;
  r.prefill_tokens = P;
  r.decode_tokens = params.decode;
  r.weight_bytes_per_token = b.weight_bytes_per_token(params.bits);
  // Prefill: one untimed run first (GPU: workspace allocation, kernel selection), then the median of reps.
  std::vector<double> t;
  for (int i = 0; i <= params.reps; ++i) {
    auto seq = b.new_sequence(P + params.decode);
    auto dec = b.new_decoder(*seq, greedy, params.bits);
    const double t0 = now_s();
    dec->prefill(toks);
    dec->wait();
    if (i > 0) t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  r.prefill_seconds = t[t.size() / 2];
  // Decode: greedy steps after the prompt, the way generate() runs them (GPU: CUDA-graph steps).
  auto seq = b.new_sequence(P + params.decode + kWarmSteps);
  auto dec = b.new_decoder(*seq, greedy, params.bits);
  dec->prefill(toks);
  std::vector<int32_t> history = toks;
  int32_t next = dec->next(history);
  for (int i = 0; i < kWarmSteps; ++i) {
    dec->advance(next);
    history.push_back(next);
    next = dec->next(history);
  }
  dec->wait();
  const double t0 = now_s();
  for (int i = 0; i < params.decode; ++i) {
    dec->advance(next);
    history.push_back(next);
    next = dec->next(history);
  }
  dec->wait();
  r.decode_seconds = now_s() - t0;
  return r;
}

}  // namespace lowbit::api
