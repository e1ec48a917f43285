#include "runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"

namespace lowbit {

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void check_speculative(Backend& target, Backend& draft, const GenerateOptions& opts, const SpeculativeOptions& so) {
  const ModelConfig& c = target.config();
  LOWBIT_CHECK(opts.max_new_tokens >= 0, "--max-tokens must be >= 0");
  LOWBIT_CHECK(opts.logprobs < 0, "speculative decoding reports no token log-probabilities");
  LOWBIT_CHECK(so.k >= 0 && so.k_max >= 1 && so.k <= so.k_max, "--draft-k must be in [0, ", so.k_max, "] (0 = adaptive)");
  validate_sampling(opts.sampling);
  target.check_bits(opts.bits);
  LOWBIT_CHECK(draft.config().vocab_size == c.vocab_size, "--draft: the draft model's vocabulary (",
               draft.config().vocab_size, " tokens) differs from the target's (", c.vocab_size, ")");
  if (&target == &draft) {
    const std::vector<int> w = target.widths();
    LOWBIT_CHECK(!w.empty(), "--draft-bits needs an any-precision model (this one has one precision); or give --draft MODEL");
    const int tbits = opts.bits > 0 ? opts.bits : w.back();
    LOWBIT_CHECK(so.draft_bits > 0 && so.draft_bits < tbits, "--draft-bits ", so.draft_bits,
                 " must be a served width below the target's ", tbits, " bits");
  }
  draft.check_bits(so.draft_bits);
}

namespace {
SamplingParams draft_sampling(const SamplingParams& p) {
  SamplingParams d = p;
  d.seed = p.seed ^ 0x9E3779B97F4A7C15ull;   // the draft's own draws
  return d;
}
}  // namespace

SpeculativeDecoder::SpeculativeDecoder(Backend& target, BatchCache& tcache, int tslot, Backend& draft,
                                       BatchCache& dcache, int dslot, const GenerateOptions& opts,
                                       const SpeculativeOptions& so, int capacity, TokenStream& stream,
                                       GenerateResult& r)
    : target_(target), draft_(draft), tcache_(tcache), dcache_(dcache), tslot_(tslot), dslot_(dslot), opts_(opts),
      so_(so), capacity_(capacity), cap_(std::min(tcache.reserved(tslot), dcache.reserved(dslot))), V_(target.config().vocab_size),
      P_(static_cast<int>(r.prompt_ids.size())), stream_(stream), r_(r), history_(r.prompt_ids),
      tsampler_(opts.sampling), dsampler_(draft_sampling(opts.sampling)), dl_(static_cast<size_t>(V_)),
      k_(so.k > 0 ? so.k : std::min(4, so.k_max)), draft_len_(std::max(P_ - 1, 0)) {}

bool SpeculativeDecoder::commit(int32_t t) {
  if (!stream_.accept(t, r_, history_)) return false;
  if (static_cast<int>(history_.size()) - 1 >= capacity_) {   // generate()'s context stop
    r_.stop_reason = "context";
    return false;
  }
  return true;
}

// The token the sampler picks from logits: greedy its argmax (penalties applied), else a draw; dist receives the
// distribution it came from.
int32_t SpeculativeDecoder::argmax_or_draw(Sampler& s, const float* logits, const std::vector<int32_t>& history,
                                           std::vector<double>& dist) {
  if (s.greedy() && !s.penalizes()) {   // plain greedy: the argmax, no distribution needed (acceptance compares tokens)
    dist.clear();
    return static_cast<int32_t>(std::max_element(logits, logits + V_) - logits);
  }
  std::vector<float> row(logits, logits + V_);
  s.distribution(row.data(), V_, history, static_cast<size_t>(P_), dist);
  return s.greedy() ? static_cast<int32_t>(std::max_element(dist.begin(), dist.end()) - dist.begin()) : s.draw(dist);
}

bool SpeculativeDecoder::round() {
  if (opts_.cancel != nullptr && opts_.cancel->load()) {
    r_.stop_reason = "cancelled";
    return false;
  }
  const int C = static_cast<int>(history_.size());
  const int remaining = std::min(opts_.max_new_tokens - static_cast<int>(r_.new_ids.size()), capacity_ + 1 - C);
  if (remaining <= 0) return false;
  const int kr = std::max(0, std::min({k_, remaining - 1, cap_ - C}));
  // Draft kr tokens, one step each.
  std::vector<int32_t> drafts;
  q_.resize(static_cast<size_t>(kr));
  const auto td = std::chrono::steady_clock::now();
  if (kr > 0) {
    const std::span<const int32_t> pending(history_.data() + draft_len_, static_cast<size_t>(C - draft_len_));
    if (pending.size() == 1)
      draft_.batch_decode(dcache_, std::span<const int>(&dslot_, 1), pending, std::span<const int>(&so_.draft_bits, 1),
                          dl_.data(), 1, nullptr);
    else draft_.batch_extend(dcache_, dslot_, pending, so_.draft_bits, dl_.data());
    ++st_.draft_forwards;
    draft_len_ = C;
    std::vector<int32_t> dh = history_;
    for (int i = 0; i < kr; ++i) {
      const int32_t d = argmax_or_draw(dsampler_, dl_.data(), dh, q_[static_cast<size_t>(i)]);
      drafts.push_back(d);
      dh.push_back(d);
      if (i + 1 < kr) {
        draft_.batch_decode(dcache_, std::span<const int>(&dslot_, 1), std::span<const int32_t>(&d, 1),
                            std::span<const int>(&so_.draft_bits, 1), dl_.data(), 1, nullptr);
        ++st_.draft_forwards;
      }
    }
  }
  st_.draft_seconds += since(td);
  // Verify: the last committed token and the drafts in one forward of the target.
  const auto tv = std::chrono::steady_clock::now();
  std::vector<int32_t> vin = {history_.back()};
  vin.insert(vin.end(), drafts.begin(), drafts.end());
  vl_.resize(vin.size() * static_cast<size_t>(V_));
  target_.batch_verify(tcache_, tslot_, vin, opts_.bits, vl_.data());
  st_.verify_seconds += since(tv);
  ++st_.rounds;
  st_.drafted += kr;
  bool going = true, replaced = false;
  int j = 0;
  for (; j < kr && going; ++j) {
    const int32_t d = drafts[static_cast<size_t>(j)];
    const std::vector<double>& qj = q_[static_cast<size_t>(j)];
    const float* row = vl_.data() + static_cast<size_t>(j) * V_;
    const int32_t target_pick = tsampler_.greedy() ? argmax_or_draw(tsampler_, row, history_, p_) : -1;
    if (!tsampler_.greedy()) {
      std::vector<float> r(row, row + V_);
      tsampler_.distribution(r.data(), V_, history_, static_cast<size_t>(P_), p_);
    }
    const bool keep = tsampler_.greedy() ? target_pick == d
                                         : tsampler_.uniform() * qj[static_cast<size_t>(d)] < p_[static_cast<size_t>(d)];
    if (keep) {
      ++st_.accepted;
      going = commit(d);
      continue;
    }
    // Rejected: the target's token instead (greedy: its argmax; sampling: a draw from the residual max(0, p - q)).
    int32_t t;
    if (tsampler_.greedy()) {
      t = target_pick;
    } else {
      residual_.resize(p_.size());
      double mass = 0;
      for (size_t i = 0; i < p_.size(); ++i) mass += (residual_[i] = std::max(0.0, p_[i] - qj[i]));
      t = tsampler_.draw(mass > 0 ? residual_ : p_);
    }
    replaced = true;
    ++st_.rejected;
    going = commit(t);
    break;
  }
  if (going && !replaced)   // every draft kept: the target's next token comes with the same forward
    going = commit(argmax_or_draw(tsampler_, vl_.data() + static_cast<size_t>(kr) * V_, history_, p_));
  // Drop what was not kept: the target holds every committed token but the last; the draft the committed prefix it
  // ran (of this round's drafts it ran d_0 .. d_{kr-2}; those kept stay).
  const int committed = static_cast<int>(history_.size());
  tcache_.truncate(tslot_, std::min(committed - 1, tcache_.length(tslot_)));
  if (kr > 0) {
    dcache_.truncate(dslot_, std::min({draft_len_ + std::min(j, kr - 1), committed - 1, dcache_.length(dslot_)}));
    draft_len_ = dcache_.length(dslot_);
  }
  if (so_.k == 0) {
    if (kr == k_ && j == kr && k_ < so_.k_max) ++k_;
    else if (2 * j < kr && k_ > 1) --k_;
  }
  return going;
}

GenerateResult generate_speculative(Backend& target, Backend& draft, const std::vector<int32_t>& prompt_ids,
                                    const GenerateOptions& opts, const SpeculativeOptions& so,
                                    const std::function<void(const std::string&)>& on_text, SpeculativeStats* stats) {
  LOWBIT_CHECK(!prompt_ids.empty(), "generate: empty prompt (no tokens)");
  check_speculative(target, draft, opts, so);
  const ModelConfig& c = target.config();
  const Tokenizer* tok = target.has_tokenizer() ? &target.tokenizer() : nullptr;   // none: ids only (benchmarks)
  const bool same = &target == &draft;
  const int P = static_cast<int>(prompt_ids.size());
  const int capacity = opts.ctx > 0 ? opts.ctx : std::min(c.max_seq_len, P + opts.max_new_tokens);
  LOWBIT_CHECK(P < capacity || opts.max_new_tokens == 0, "the prompt has ", P, " tokens, which fills the context of ",
               capacity);
  GenerateResult r;
  r.prompt_ids = prompt_ids;
  r.stop_reason = "length";
  if (stats) *stats = {};
  if (opts.max_new_tokens == 0) return r;
  // Room for a round's draft tokens past the logical context (they are dropped or the generation stops there).
  const int cap = std::min({c.max_seq_len, draft.config().max_seq_len, std::max(capacity, P) + so.k_max + 1});
  std::unique_ptr<BatchCache> tcache = target.new_batch_cache(same ? 2 : 1, cap);
  std::unique_ptr<BatchCache> dcache_own = same ? nullptr : draft.new_batch_cache(1, cap);
  BatchCache& dcache = same ? *tcache : *dcache_own;
  const int tslot = 0, dslot = same ? 1 : 0;
  LOWBIT_CHECK(tcache->reserve(tslot, cap) && dcache.reserve(dslot, cap), "speculative: the KV cache has no room");
  const auto t0 = std::chrono::steady_clock::now();
  if (P > 1) {
    const std::span<const int32_t> head(prompt_ids.data(), static_cast<size_t>(P - 1));
    target.batch_extend(*tcache, tslot, head, opts.bits, nullptr);
    draft.batch_extend(dcache, dslot, head, so.draft_bits, nullptr);
  }
  r.prefill_seconds = since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<int32_t> stops;
  if (tok != nullptr) stops = stop_tokens(c, *tok);
  else if (c.eos_id >= 0) stops.push_back(c.eos_id);
  TokenStream stream(opts, tok, std::move(stops), on_text);
  SpeculativeDecoder dec(target, *tcache, tslot, draft, dcache, dslot, opts, so, capacity, stream, r);
  while (dec.round()) {
  }
  stream.finish(r);
  r.decode_seconds = since(t1);
  const SpeculativeStats& st = dec.stats();
  r.spec_rounds = st.rounds;
  r.spec_drafted = st.drafted;
  r.spec_accepted = st.accepted;
  r.spec_rejected = st.rejected;
  if (stats) *stats = st;
  return r;
}

}  // namespace lowbit
