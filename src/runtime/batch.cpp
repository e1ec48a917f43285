#include "runtime/batch.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"

namespace lowbit {

namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

struct BatchGenerator::Seq {
  Seq(uint64_t i, int sl, std::vector<int32_t> prompt, const GenerateOptions& o, const Tokenizer* tok,
      std::vector<int32_t> stops, std::function<void(const std::string&)> on_text)
      : id(i), slot(sl), opts(o), stream(opts, tok, std::move(stops), std::move(on_text)), sampler(o.sampling) {
    r.prompt_ids = std::move(prompt);
    r.stop_reason = "length";
    history = r.prompt_ids;
  }
  uint64_t id;
  int slot;
  GenerateOptions opts;   // before stream, which keeps a reference to it
  TokenStream stream;
  Sampler sampler;
  GenerateResult r;
  std::vector<int32_t> history;
  int limit = 0;              // positions this sequence may fill (generate()'s cache capacity)
  size_t prefilled = 0;       // prompt tokens (or, refilling, context tokens) run so far
  bool refill = false;        // preempted while decoding: history[0 .. size-1) runs again before the next step
  int32_t pending = -1;       // the token the next decode step runs (>= 0: decoding)
  bool ended = false;
  OnToken on_token;
  // Speculative decoding: the draft's slot (-1: none), its prompt progress, and the decoder once both prompts ran.
  int dslot = -1;
  size_t dprefilled = 0;
  SpeculativeOptions spec;
  std::unique_ptr<SpeculativeDecoder> spec_dec;
  std::chrono::steady_clock::time_point t_start{}, t_first{};
};

BatchGenerator::BatchGenerator(Backend& backend, const BatchOptions& opts)
    : b_(backend), capacity_(opts.capacity > 0 ? opts.capacity : backend.config().max_seq_len),
      chunk_(opts.prefill_chunk), vocab_(backend.config().vocab_size) {
  LOWBIT_CHECK(opts.max_seqs >= 1, "batch: max sequences must be >= 1, got ", opts.max_seqs);
  LOWBIT_CHECK(opts.prefill_chunk >= 1, "batch: the prefill chunk must be >= 1 token, got ", opts.prefill_chunk);
  LOWBIT_CHECK(capacity_ >= 2 && capacity_ <= backend.config().max_seq_len, "batch: ", capacity_,
               " positions per sequence (2 to the model's context of ", backend.config().max_seq_len, ")");
  LOWBIT_CHECK(opts.kv_blocks == 0 || opts.kv_blocks >= full_kv_blocks(1, capacity_), "batch: ", opts.kv_blocks,
               " KV blocks hold no generation of ", capacity_, " positions");
  cache_ = b_.new_batch_cache(opts.max_seqs, capacity_, opts.kv_blocks);
  slot_used_.assign(static_cast<size_t>(opts.max_seqs), false);
  if (b_.has_tokenizer()) stops_ = stop_tokens(b_.config(), b_.tokenizer());
  else if (b_.config().eos_id >= 0) stops_.push_back(b_.config().eos_id);
}

BatchGenerator::~BatchGenerator() = default;

int BatchGenerator::free_slots() const { return static_cast<int>(std::count(slot_used_.begin(), slot_used_.end(), false)); }

int64_t BatchGenerator::kv_positions_used() const {
  int64_t n = 0;
  for (const auto& s : seqs_) n += cache_->length(s->slot) + (s->dslot >= 0 ? cache_->length(s->dslot) : 0);
  return n;
}

uint64_t BatchGenerator::add(std::vector<int32_t> prompt_ids, const GenerateOptions& opts,
                             std::function<void(const std::string&)> on_text, OnToken on_token,
                             const SpeculativeOptions* spec) {
  const bool speculative = spec != nullptr && spec->draft_bits > 0;
  if (speculative) {
    check_speculative(b_, b_, opts, *spec);
    LOWBIT_CHECK(free_slots() >= 2, "batch: a speculative generation needs two free slots");
  }
  LOWBIT_CHECK(!prompt_ids.empty(), "generate: empty prompt (no tokens)");
  LOWBIT_CHECK(opts.max_new_tokens >= 0, "--max-tokens must be >= 0");
  LOWBIT_CHECK(opts.logprobs <= 20, "logprobs: at most 20 alternatives, got ", opts.logprobs);
  validate_sampling(opts.sampling);
  b_.check_bits(opts.bits);
  for (int32_t id : prompt_ids)
    LOWBIT_CHECK(id >= 0 && id < vocab_, "generate: prompt token id ", id, " is outside the vocabulary of ", vocab_);
  // generate()'s capacity, within the slot.
  const int want = static_cast<int>(prompt_ids.size()) + opts.max_new_tokens;
  const int room = speculative ? capacity_ - spec->k_max - 1 : capacity_;   // a round's drafts past the context
  const int limit = std::min(room, opts.ctx > 0 ? opts.ctx : want);
  LOWBIT_CHECK(static_cast<int>(prompt_ids.size()) <= capacity_ &&
                   (static_cast<int>(prompt_ids.size()) < limit || opts.max_new_tokens == 0),
               "the prompt has ", prompt_ids.size(), " tokens, which fills the context of ", std::max(limit, 0));
  if (speculative)
    LOWBIT_CHECK(2 * cache_->blocks_for(std::min(capacity_, limit + spec->k_max + 1)) <= cache_->blocks_total(),
                 "batch: the KV cache of ", kv_positions_total(), " positions cannot hold a speculative generation's two ",
                 "contexts of ", std::min(capacity_, limit + spec->k_max + 1), " positions");
  const auto free = std::find(slot_used_.begin(), slot_used_.end(), false);
  LOWBIT_CHECK(free != slot_used_.end(), "batch: every slot is in use");
  const int slot = static_cast<int>(free - slot_used_.begin());
  auto s = std::make_unique<Seq>(next_id_++, slot, std::move(prompt_ids), opts,
                                 b_.has_tokenizer() ? &b_.tokenizer() : nullptr, stops_, std::move(on_text));
  s->limit = std::max(limit, static_cast<int>(s->r.prompt_ids.size()));
  s->on_token = std::move(on_token);
  cache_->clear(slot);
  *free = true;
  if (speculative) {
    const auto dfree = std::find(slot_used_.begin(), slot_used_.end(), false);
    s->dslot = static_cast<int>(dfree - slot_used_.begin());
    *dfree = true;
    cache_->clear(s->dslot);
    s->spec = *spec;
  }
  seqs_.push_back(std::move(s));
  return seqs_.back()->id;
}

bool BatchGenerator::pick(Seq& s, float* logits, int32_t given) {
  if (s.r.new_ids.size() >= static_cast<size_t>(s.opts.max_new_tokens)) return false;   // max_new_tokens == 0
  if (s.opts.cancel != nullptr && s.opts.cancel->load()) {
    s.r.stop_reason = "cancelled";
    return false;
  }
  if (given < 0 && s.opts.logprobs >= 0) raw_.assign(logits, logits + vocab_);   // the penalties change logits in place
  const int32_t next = given >= 0 ? given : s.sampler.sample(logits, vocab_, s.history, s.r.prompt_ids.size());
  const size_t taken = s.r.new_ids.size();
  const bool more = s.stream.accept(next, s.r, s.history);
  if (s.r.new_ids.size() > taken) {
    const TokenLogprob* lp = nullptr;
    if (s.opts.logprobs >= 0) {
      s.r.logprobs.push_back(logprob_of(next, s.opts.logprobs));
      lp = &s.r.logprobs.back();
    }
    if (s.on_token) s.on_token(next, lp);
  }
  if (!more) return false;
  if (cache_->length(s.slot) >= s.limit) {
    s.r.stop_reason = "context";
    return false;
  }
  s.pending = next;
  return true;
}

TokenLogprob BatchGenerator::logprob_of(int32_t id, int alternatives) {
  // log-softmax of raw_ in double: lse = max + log(sum(exp(x - max))).
  const float mx = *std::max_element(raw_.begin(), raw_.end());
  double sum = 0;
  for (float x : raw_) sum += std::exp(static_cast<double>(x - mx));
  const double lse = mx + std::log(sum);
  auto text = [this](int32_t t) { return b_.has_tokenizer() ? b_.tokenizer().token_bytes(t) : std::string(); };
  TokenLogprob lp;
  lp.id = id;
  lp.text = text(id);
  lp.logprob = static_cast<float>(raw_[static_cast<size_t>(id)] - lse);
  if (alternatives > 0) {
    top_.resize(raw_.size());
    for (size_t i = 0; i < raw_.size(); ++i) top_[i] = {raw_[i], static_cast<int32_t>(i)};
    const size_t k = std::min(static_cast<size_t>(alternatives), top_.size());
    std::partial_sort(top_.begin(), top_.begin() + static_cast<std::ptrdiff_t>(k), top_.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (size_t i = 0; i < k; ++i)
      lp.top.push_back({top_[i].second, text(top_[i].second), static_cast<float>(top_[i].first - lse)});
  }
  return lp;
}

void BatchGenerator::finish(size_t index, std::vector<Finished>& out) {
  Seq& s = *seqs_[index];
  s.stream.finish(s.r);
  if (s.spec_dec) {
    const SpeculativeStats& st = s.spec_dec->stats();
    s.r.spec_rounds = st.rounds;
    s.r.spec_drafted = st.drafted;
    s.r.spec_accepted = st.accepted;
    s.r.spec_rejected = st.rejected;
  }
  const auto now = std::chrono::steady_clock::now();
  if (s.t_first == std::chrono::steady_clock::time_point{}) s.t_first = now;
  s.r.decode_seconds = seconds_between(s.t_first, now);
  slot_used_[static_cast<size_t>(s.slot)] = false;
  cache_->clear(s.slot);
  if (s.dslot >= 0) {
    slot_used_[static_cast<size_t>(s.dslot)] = false;
    cache_->clear(s.dslot);
  }
  out.push_back({s.id, std::move(s.r)});
  seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(index));
}

void BatchGenerator::preempt(Seq& s) {
  cache_->clear(s.slot);
  s.prefilled = 0;
  s.refill = s.pending >= 0;   // a sequence still in its prompt starts its prompt again
  ++preemptions_;
}

void BatchGenerator::prefill_round() {
  int budget = chunk_;
  // Blocks kept back for the decoding sequences' next positions (one each), so that new prompts do not force
  // preemptions at the next step.
  int decoding = 0;
  for (const auto& s : seqs_)
    if (!s->ended && s->pending >= 0 && !s->refill && !s->spec_dec) ++decoding;
  // Positions slot may take beyond `len` without going below the reserve.
  auto room = [&](int slot, int len) {
    const int spare = std::max(0, cache_->blocks_free() - decoding);
    return std::min(capacity_, (cache_->blocks_held(slot) + spare) * cache_->block_size()) - len;
  };
  for (auto& sp : seqs_) {
    Seq& s = *sp;
    if (budget == 0) break;
    if (s.dslot >= 0) {   // speculative: prompt[0 .. P-1) into both slots, then its decoder takes over
      if (s.ended || s.spec_dec) continue;
      const size_t head = s.r.prompt_ids.size() - 1;
      if (s.prefilled == 0 && s.dprefilled == 0) {
        // Its whole context, both slots, before it starts: its rounds then never wait for blocks.
        const int want = std::min(capacity_, s.limit + s.spec.k_max + 1);
        if (2 * cache_->blocks_for(want) > cache_->blocks_held(s.slot) + cache_->blocks_held(s.dslot) +
                                               std::max(0, cache_->blocks_free() - decoding))
          continue;
        cache_->reserve(s.slot, want);
        cache_->reserve(s.dslot, want);
        s.t_start = std::chrono::steady_clock::now();
      }
      for (auto [done, slot, bits] : {std::tuple<size_t*, int, int>{&s.prefilled, s.slot, s.opts.bits},
                                      std::tuple<size_t*, int, int>{&s.dprefilled, s.dslot, s.spec.draft_bits}}) {
        const size_t n = std::min(head - *done, static_cast<size_t>(budget));
        if (n == 0) continue;
        b_.batch_extend(*cache_, slot, std::span<const int32_t>(s.r.prompt_ids).subspan(*done, n), bits, nullptr);
        *done += n;
        budget -= static_cast<int>(n);
      }
      if (s.prefilled == head && s.dprefilled == head) {
        s.r.prefill_seconds = seconds_between(s.t_start, std::chrono::steady_clock::now());
        if (s.opts.max_new_tokens == 0) s.ended = true;
        else
          s.spec_dec = std::make_unique<SpeculativeDecoder>(b_, *cache_, s.slot, b_, *cache_, s.dslot, s.opts, s.spec,
                                                            s.limit, s.stream, s.r);
      }
      continue;
    }
    if (s.ended || (s.pending >= 0 && !s.refill)) continue;
    // The tokens to run: the prompt, or (refilling after a preemption) the context up to the pending token.
    const std::span<const int32_t> src = s.refill ? std::span<const int32_t>(s.history).first(s.history.size() - 1)
                                                  : std::span<const int32_t>(s.r.prompt_ids);
    const int len = cache_->length(s.slot);
    const size_t n = std::min({src.size() - s.prefilled, static_cast<size_t>(budget),
                               static_cast<size_t>(std::max(0, room(s.slot, len)))});
    if (n == 0) continue;   // waits for blocks
    LOWBIT_CHECK(cache_->reserve(s.slot, len + static_cast<int>(n)), "batch: KV blocks counted free are not");
    if (!s.refill && s.prefilled == 0) s.t_start = std::chrono::steady_clock::now();
    const bool last = s.prefilled + n == src.size();
    b_.batch_extend(*cache_, s.slot, src.subspan(s.prefilled, n), s.opts.bits, last && !s.refill ? logits_.data() : nullptr);
    s.prefilled += n;
    budget -= static_cast<int>(n);
    if (!last) continue;
    if (s.refill) {   // back to decoding its pending token
      s.refill = false;
      continue;
    }
    s.t_first = std::chrono::steady_clock::now();
    s.r.prefill_seconds = seconds_between(s.t_start, s.t_first);
    if (!pick(s, logits_.data())) s.ended = true;
  }
}

std::vector<BatchGenerator::Seq*> BatchGenerator::reserve_decode_rows() {
  std::vector<Seq*> rows;
  for (auto& s : seqs_)
    if (!s->ended && s->pending >= 0 && !s->refill && !s->spec_dec) rows.push_back(s.get());
  for (Seq* s : rows) {
    if (s->refill) continue;   // preempted below for an older row
    while (!cache_->reserve(s->slot, cache_->length(s->slot) + 1)) {
      // The newest sequence holding blocks that may give them up (speculative ones keep theirs); s itself at worst.
      Seq* victim = nullptr;
      for (auto it = seqs_.rbegin(); it != seqs_.rend() && victim == nullptr; ++it)
        if (!(*it)->ended && (*it)->dslot < 0 && cache_->blocks_held((*it)->slot) > 0) victim = it->get();
      LOWBIT_CHECK(victim != nullptr, "batch: no KV blocks to free for a decoding sequence");
      preempt(*victim);
      if (victim == s) break;
    }
  }
  std::erase_if(rows, [](const Seq* s) { return s->refill; });
  return rows;
}

std::vector<BatchGenerator::Finished> BatchGenerator::step() {
  std::vector<Finished> out;
  // Cancelled before their next token: ended now, whatever they were doing.
  for (auto& s : seqs_)
    if (s->opts.cancel != nullptr && s->opts.cancel->load()) {
      s->r.stop_reason = "cancelled";
      s->ended = true;
    }
  logits_.resize(static_cast<size_t>(vocab_) * std::max<size_t>(seqs_.size(), 1));
  // 1. Prefill, oldest first, at most chunk_ prompt tokens in all.
  prefill_round();
  // 2. One decode step for every sequence past its prompt, one forward per width. Those whose first token was
  // picked in this round's prefill join now: the step runs that token.
  std::vector<Seq*> group = reserve_decode_rows();
  last_rows_ = last_forwards_ = 0;
  const auto t_decode = std::chrono::steady_clock::now();
  if (!group.empty()) {
    // Rows that sample, penalise or report log-probabilities need their logits; plain greedy rows only their argmax
    // (picked on the device by the GPU): those rows go first, and only they are copied.
    auto needs_logits = [](const Seq* s) {
      return !s->sampler.greedy() || s->sampler.penalizes() || s->opts.logprobs >= 0;
    };
    std::stable_partition(group.begin(), group.end(), needs_logits);
    const size_t with_logits = static_cast<size_t>(std::count_if(group.begin(), group.end(), needs_logits));
    std::vector<int> slots, bits;
    std::vector<int32_t> tokens;
    for (Seq* s : group) {
      slots.push_back(s->slot);
      tokens.push_back(s->pending);
      bits.push_back(s->opts.bits);
    }
    greedy_.resize(group.size());
    logits_.resize(std::max(logits_.size(), with_logits * static_cast<size_t>(vocab_)));
    last_forwards_ = b_.batch_decode(*cache_, slots, tokens, bits, logits_.data(), with_logits, greedy_.data());
    last_rows_ = static_cast<int>(group.size());
    for (size_t i = 0; i < group.size(); ++i) {
      const bool ok = i < with_logits ? pick(*group[i], logits_.data() + i * static_cast<size_t>(vocab_))
                                      : pick(*group[i], nullptr, greedy_[i]);
      if (!ok) group[i]->ended = true;
    }
  }
  last_decode_s_ = seconds_between(t_decode, std::chrono::steady_clock::now());
  // 3. A draft-and-verify round for every speculative generation past its prompt.
  for (auto& s : seqs_)
    if (!s->ended && s->spec_dec) {
      if (s->t_first == std::chrono::steady_clock::time_point{}) s->t_first = std::chrono::steady_clock::now();
      if (!s->spec_dec->round()) s->ended = true;
    }
  for (size_t i = seqs_.size(); i-- > 0;)
    if (seqs_[i]->ended) finish(i, out);
  std::reverse(out.begin(), out.end());   // arrival order
  return out;
}

}  // namespace lowbit
