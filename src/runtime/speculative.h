// Speculative decoding: a cheap draft proposes k tokens one at a time, the target checks all of them in one forward
// of k + 1 tokens, and the standard acceptance rule keeps the target's output exactly:
//   greedy   a draft token is kept while it is the target's argmax; the first miss is replaced by the target's
//            token, and when all k are kept the target's next token comes free: the text of the target alone;
//   sampling draft token d (drawn from the draft's distribution q) is kept with probability min(1, p(d) / q(d)); the
//            first rejected one is replaced by a draw from normalise(max(0, p - q)); all kept: a bonus draw from p.
//            The tokens follow the target's distribution p exactly (Leviathan et al. 2023, Chen et al. 2023).
// The draft is either the same any-precision model at a lower width (one copy of the weights: the draft reads the
// top planes of the target's parent codes) or a separate model with the same vocabulary. Each side keeps its own KV
// cache; rejected positions are dropped from both (BatchCache::truncate). k adapts to the acceptance: it grows by
// one after a round that kept every draft token and shrinks by one after a round that kept fewer than half.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace lowbit {

struct SpeculativeOptions {
  int draft_bits = 0;     // the draft's width (the same model: below the target's; a separate model: its width)
  int k = 0;              // draft tokens per round; 0 = adaptive, from 4, within [1, k_max]
  int k_max = 8;
};

struct SpeculativeStats {
  int64_t rounds = 0;             // target forwards after the prompt (one per round)
  int64_t drafted = 0, accepted = 0;   // draft tokens proposed / kept
  int64_t rejected = 0;                // rounds that ended on a rejected draft token
  // The per-position chance that the target keeps a draft token it checks (drafts after a rejection are not
  // checked): accepted / (accepted + rejected).
  double match_rate() const { return accepted + rejected > 0 ? static_cast<double>(accepted) / (accepted + rejected) : 0.0; }
  int64_t draft_forwards = 0;
  double draft_seconds = 0, verify_seconds = 0;
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0; }
  // Generated tokens per target forward (1 without speculation).
  double tokens_per_round(int64_t generated) const { return rounds > 0 ? static_cast<double>(generated) / rounds : 0.0; }
};

// Refuses (one-line lowbit::Error) what speculative decoding cannot run: different vocabularies, a draft width not
// served (on one model: not below the target's), logprobs, k out of range.
void check_speculative(Backend& target, Backend& draft, const GenerateOptions& opts, const SpeculativeOptions& so);

// One speculative generation, round by round: generate_speculative() and the batch generator (runtime/batch.h)
// each drive one. The caller owns the caches, the output (r, whose prompt_ids are the prompt) and the TokenStream,
// and has run prompt[0 .. P-1) into both slots (every committed token but the last is in both caches; the last runs
// first in each round). Each slot needs room for the context plus k_max + 1 positions, reserved (BatchCache::reserve).
class SpeculativeDecoder {
 public:
  SpeculativeDecoder(Backend& target, BatchCache& tcache, int tslot, Backend& draft, BatchCache& dcache, int dslot,
                     const GenerateOptions& opts, const SpeculativeOptions& so, int capacity, TokenStream& stream,
                     GenerateResult& r);
  // Drafts, verifies, takes the kept tokens (and the target's one) through the stream, drops the rest from both
  // caches. False once the generation has ended (r.stop_reason set).
  bool round();
  const SpeculativeStats& stats() const { return st_; }

 private:
  int32_t argmax_or_draw(Sampler& s, const float* logits, const std::vector<int32_t>& history, std::vector<double>& dist);
  bool commit(int32_t t);
  Backend &target_, &draft_;
  BatchCache &tcache_, &dcache_;
  int tslot_, dslot_;
  const GenerateOptions& opts_;
  SpeculativeOptions so_;
  int capacity_, cap_, V_, P_;
  TokenStream& stream_;
  GenerateResult& r_;
  std::vector<int32_t> history_;   // committed tokens
  Sampler tsampler_, dsampler_;
  std::vector<float> dl_, vl_;
  std::vector<std::vector<double>> q_;
  std::vector<double> p_, residual_;
  int k_, draft_len_;
  SpeculativeStats st_;
};

// Generates from target (at opts.bits) with draft (at so.draft_bits) proposing; draft may be the same backend.
// The tokens, text, stop reasons and streaming are those of generate() at the target's width (greedy: the same
// tokens up to the rounding of a (k + 1)-token forward against single-token steps; sampling: the same distribution,
// not the same draws). Errors: the vocabularies differ, the draft width is not served (or, on one model, not below
// the target's), logprobs requested.
GenerateResult generate_speculative(Backend& target, Backend& draft, const std::vector<int32_t>& prompt_ids,
                                    const GenerateOptions& opts, const SpeculativeOptions& so,
                                    const std::function<void(const std::string&)>& on_text = nullptr,
                                    SpeculativeStats* stats = nullptr);

}  // namespace lowbit
