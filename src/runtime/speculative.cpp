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

GenerateResult generate_speculative(Backend& target, Backend& draft, const std::vector<int32_t>& prompt_ids,
                                    const GenerateOptions& opts, const SpeculativeOptions& so,
                                    const std::function<void(const std::string&)>& on_text, SpeculativeStats* stats) {
  const ModelConfig& c = target.config();
  const Tokenizer* tok = target.has_tokenizer() ? &target.tokenizer() : nullptr;   // none: ids only (benchmarks)
  const bool same = &target == &draft;
  LOWBIT_CHECK(!prompt_ids.empty(), "generate: empty prompt (no tokens)");
  LOWBIT_CHECK(opts.max_new_tokens >= 0, "--max-tokens must be >= 0");
  LOWBIT_CHECK(opts.logprobs < 0, "generate: token log-probabilities are computed by batch generation (lowbit serve)");
  LOWBIT_CHECK(so.k >= 0 && so.k_max >= 1 && so.k <= so.k_max, "--draft-k must be in [0, ", so.k_max, "] (0 = adaptive)");
  validate_sampling(opts.sampling);
  target.check_bits(opts.bits);
  LOWBIT_CHECK(draft.config().vocab_size == c.vocab_size, "--draft: the draft model's vocabulary (",
               draft.config().vocab_size, " tokens) differs from the target's (", c.vocab_size, ")");
  if (same) {
    const std::vector<int> w = target.widths();
    LOWBIT_CHECK(!w.empty(), "--draft-bits needs an any-precision model (this one has one precision); or give --draft MODEL");
    const int tbits = opts.bits > 0 ? opts.bits : w.back();
    LOWBIT_CHECK(so.draft_bits > 0 && so.draft_bits < tbits, "--draft-bits ", so.draft_bits,
                 " must be a served width below the target's ", tbits, " bits");
  }
  draft.check_bits(so.draft_bits);
  const int V = c.vocab_size;
  const int P = static_cast<int>(prompt_ids.size());
  const int want = P + opts.max_new_tokens;
  const int capacity = opts.ctx > 0 ? opts.ctx : std::min(c.max_seq_len, want);
  LOWBIT_CHECK(P < capacity || opts.max_new_tokens == 0, "the prompt has ", P, " tokens, which fills the context of ",
               capacity);
  // Room for a round's draft tokens past the logical context (they are dropped or the generation stops there).
  const int cap = std::min({c.max_seq_len, draft.config().max_seq_len, std::max(capacity, P) + so.k_max + 1});

  GenerateResult r;
  r.prompt_ids = prompt_ids;
  r.stop_reason = "length";
  SpeculativeStats st;
  if (opts.max_new_tokens == 0) {
    if (stats) *stats = st;
    return r;
  }
  std::unique_ptr<BatchCache> tcache = target.new_batch_cache(same ? 2 : 1, cap);
  std::unique_ptr<BatchCache> dcache_own = same ? nullptr : draft.new_batch_cache(1, cap);
  BatchCache& dcache = same ? *tcache : *dcache_own;
  const int tslot = 0, dslot = same ? 1 : 0;

  const auto t0 = std::chrono::steady_clock::now();
  // Both caches hold every committed token but the last; the last runs first in the next round (the target's verify
  // input, the draft's first step).
  if (P > 1) {
    const std::span<const int32_t> head(prompt_ids.data(), static_cast<size_t>(P - 1));
    target.batch_extend(*tcache, tslot, head, opts.bits, nullptr);
    draft.batch_extend(dcache, dslot, head, so.draft_bits, nullptr);
  }
  r.prefill_seconds = since(t0);
  const auto t1 = std::chrono::steady_clock::now();

  std::vector<int32_t> history = prompt_ids;   // committed tokens
  std::vector<int32_t> stops;
  if (tok != nullptr) stops = stop_tokens(c, *tok);
  else if (c.eos_id >= 0) stops.push_back(c.eos_id);
  TokenStream stream(opts, tok, std::move(stops), on_text);
  SamplingParams dparams = opts.sampling;
  dparams.seed = opts.sampling.seed ^ 0x9E3779B97F4A7C15ull;   // the draft's own draws
  Sampler tsampler(opts.sampling), dsampler(dparams);
  std::vector<float> dl(static_cast<size_t>(V)), vl;
  std::vector<std::vector<double>> q;
  std::vector<double> p, residual;
  std::vector<int32_t> drafts;
  int k = so.k > 0 ? so.k : std::min(4, so.k_max);
  int draft_len = std::max(P - 1, 0);   // committed tokens the draft cache holds
  bool done = false;
  // Takes token t into the output; false once the generation has ended (r.stop_reason set).
  auto commit = [&](int32_t t) {
    if (!stream.accept(t, r, history)) return false;
    if (static_cast<int>(history.size()) - 1 >= capacity) {   // generate()'s context stop
      r.stop_reason = "context";
      return false;
    }
    return true;
  };
  while (!done) {
    if (opts.cancel != nullptr && opts.cancel->load()) {
      r.stop_reason = "cancelled";
      break;
    }
    const int C = static_cast<int>(history.size());
    const int remaining = std::min(opts.max_new_tokens - static_cast<int>(r.new_ids.size()), capacity + 1 - C);
    const int kr = std::max(0, std::min({k, remaining - 1, cap - C}));
    // Draft kr tokens.
    drafts.clear();
    q.resize(static_cast<size_t>(kr));
    const auto td = std::chrono::steady_clock::now();
    if (kr > 0) {
      const std::span<const int32_t> pending(history.data() + draft_len, static_cast<size_t>(C - draft_len));
      if (pending.size() == 1) draft.batch_decode(dcache, std::span<const int>(&dslot, 1), pending, so.draft_bits, dl.data());
      else draft.batch_extend(dcache, dslot, pending, so.draft_bits, dl.data());
      ++st.draft_forwards;
      draft_len = C;
      std::vector<int32_t> dh = history;
      for (int i = 0; i < kr; ++i) {
        dsampler.distribution(dl.data(), V, dh, static_cast<size_t>(P), q[static_cast<size_t>(i)]);
        const int32_t d = dsampler.greedy()
                              ? static_cast<int32_t>(std::max_element(q[static_cast<size_t>(i)].begin(),
                                                                      q[static_cast<size_t>(i)].end()) - q[static_cast<size_t>(i)].begin())
                              : dsampler.draw(q[static_cast<size_t>(i)]);
        drafts.push_back(d);
        dh.push_back(d);
        if (i + 1 < kr) {
          draft.batch_decode(dcache, std::span<const int>(&dslot, 1), std::span<const int32_t>(&d, 1), so.draft_bits, dl.data());
          ++st.draft_forwards;
        }
      }
    }
    st.draft_seconds += since(td);
    // Verify: the last committed token and the drafts in one forward of the target.
    const auto tv = std::chrono::steady_clock::now();
    std::vector<int32_t> vin = {history.back()};
    vin.insert(vin.end(), drafts.begin(), drafts.end());
    vl.resize(vin.size() * static_cast<size_t>(V));
    target.batch_verify(*tcache, tslot, vin, opts.bits, vl.data());
    st.verify_seconds += since(tv);
    ++st.rounds;
    st.drafted += kr;
    int j = 0;
    bool replaced = false;
    for (; j < kr && !done; ++j) {
      tsampler.distribution(vl.data() + static_cast<size_t>(j) * V, V, history, static_cast<size_t>(P), p);
      const int32_t d = drafts[static_cast<size_t>(j)];
      const std::vector<double>& qj = q[static_cast<size_t>(j)];
      const bool keep = tsampler.greedy() ? p[static_cast<size_t>(d)] == 1.0
                                          : tsampler.uniform() * qj[static_cast<size_t>(d)] < p[static_cast<size_t>(d)];
      if (keep) {
        ++st.accepted;
        if (!commit(d)) done = true;
        continue;
      }
      // Rejected: the target's token instead (greedy: its argmax; sampling: from the residual max(0, p - q)).
      int32_t t;
      if (tsampler.greedy()) {
        t = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
      } else {
        residual.resize(p.size());
        double mass = 0;
        for (size_t i = 0; i < p.size(); ++i) mass += (residual[i] = std::max(0.0, p[i] - qj[i]));
        t = tsampler.draw(mass > 0 ? residual : p);
      }
      replaced = true;
      if (!commit(t)) done = true;
      break;
    }
    if (!done && !replaced) {   // every draft kept: the target's next token comes with the same forward
      tsampler.distribution(vl.data() + static_cast<size_t>(kr) * V, V, history, static_cast<size_t>(P), p);
      const int32_t t = tsampler.greedy() ? static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin())
                                          : tsampler.draw(p);
      if (!commit(t)) done = true;
    }
    // Drop what was not kept: the target holds every committed token but the last; the draft the committed prefix it
    // ran (the round's drafts it ran, d_0 .. d_{kr-2}, where they were kept).
    const int committed = static_cast<int>(history.size());
    tcache->truncate(tslot, std::min(committed - 1, tcache->length(tslot)));
    const int dvalid = std::min(draft_len + std::min(j, std::max(kr - 1, 0)), committed - 1);
    if (kr > 0) {
      dcache.truncate(dslot, std::min(dvalid, dcache.length(dslot)));
      draft_len = dcache.length(dslot);
    }
    if (so.k == 0) {
      if (kr == k && j == kr && k < so.k_max) ++k;
      else if (2 * j < kr && k > 1) --k;
    }
  }
  stream.finish(r);
  r.decode_seconds = since(t1);
  if (stats) *stats = st;
  return r;
}

}  // namespace lowbit
