// Continuous batching: many generations on one backend, advanced together. Each request takes a slot of one
// BatchCache (runtime/backend.h) when it starts and gives it back when it ends, so requests join and leave the
// running batch between decode steps. A round (step()) runs
//   1. prefill: up to prefill_chunk prompt tokens of the requests still reading their prompts, oldest first, in
//      chunks, so a long prompt never stalls the running streams for more than one chunk;
//   2. decode: one token for every request past its prompt (any-precision models: each request picks its width). On
//      the GPU, rows of different widths run in one forward that reads the widest width's bitplanes once and gives
//      each row its own prefix width (up to 8 rows: packed_matmul_mixed); elsewhere one forward per width present,
//      each reading its width's planes for its rows (Backend::batch_decode);
//   3. speculative generations (add's spec): one draft-and-verify round each.
// KV memory is paged (BatchCache): a sequence takes blocks as it grows. A prompt chunk runs only when its blocks are
// free with one block left over for each decoding sequence; when a decoding sequence needs a block and none is free,
// the newest sequence is preempted: its blocks are freed, and it later runs its prompt and tokens so far again (as
// a prompt, without picking a token) and decodes on from where it was, its output unchanged. Speculative
// generations reserve their whole context when their prompt starts and are never preempted.
// Tokens are picked on the host by each request's own Sampler (seeded as generate() seeds it) and taken through
// the same TokenStream as generate(), so a request ends, streams and stops exactly as it would alone.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/generate.h"
#include "runtime/speculative.h"

namespace lowbit {

struct BatchOptions {
  int max_seqs = 8;          // sequences in flight at most (the cache's slots)
  int capacity = 0;          // positions per sequence (prompt + completion); 0 = the model's context
  int prefill_chunk = 512;   // prompt tokens a round runs at most
  int kv_blocks = 0;         // KV blocks (kKvBlock positions each) shared by the sequences; 0 = every slot full
};

class BatchGenerator {
 public:
  BatchGenerator(Backend& backend, const BatchOptions& opts);
  ~BatchGenerator();
  BatchGenerator(const BatchGenerator&) = delete;
  BatchGenerator& operator=(const BatchGenerator&) = delete;

  int slots() const { return cache_->slots(); }
  int free_slots() const;
  int active() const { return static_cast<int>(seqs_.size()); }
  int capacity() const { return capacity_; }
  // Starts a generation in a free slot and returns its id (ids count up from 1). The prompt runs in later rounds.
  // Errors (lowbit::Error, nothing started): no free slot, an empty prompt, a token id outside the vocabulary, a
  // prompt that leaves no room in the slot, a width the model does not serve, bad sampling settings.
  // on_token (optional): called with each generated token as it is taken, and its log-probabilities when
  // opts.logprobs >= 0 (else null): streaming of log-probabilities, and benchmarks time tokens with it.
  using OnToken = std::function<void(int32_t id, const TokenLogprob* logprob)>;
  // spec (optional, draft_bits > 0): self-speculative decoding for this generation (runtime/speculative.h): it takes
  // two slots (the target's and the draft's) and, past its prompt, advances by a draft-and-verify round per step
  // instead of joining the batched decode; its context is the slot's less k_max + 1 positions. on_token is not called
  // for its tokens.
  uint64_t add(std::vector<int32_t> prompt_ids, const GenerateOptions& opts,
               std::function<void(const std::string&)> on_text = nullptr, OnToken on_token = nullptr,
               const SpeculativeOptions* spec = nullptr);

  struct Finished {
    uint64_t id;
    GenerateResult result;
  };
  // One round (see the top of the file). Returns the generations that ended in it (their slots are free again),
  // including those cancelled through GenerateOptions::cancel.
  std::vector<Finished> step();

  // Sequences that ran a decode step in the last round, and forwards that round took (one per width).
  int last_decode_rows() const { return last_rows_; }
  int last_decode_forwards() const { return last_forwards_; }
  double last_decode_seconds() const { return last_decode_s_; }   // wall time of the last round's decode step
  // KV positions filled (over every active sequence), and the pool's blocks in use and in all.
  int64_t kv_positions_used() const;
  int kv_blocks_used() const { return cache_->blocks_total() - cache_->blocks_free(); }
  int kv_blocks_total() const { return cache_->blocks_total(); }
  int64_t kv_positions_total() const { return static_cast<int64_t>(cache_->blocks_total()) * cache_->block_size(); }
  int64_t preemptions() const { return preemptions_; }   // sequences preempted for blocks so far

 private:
  struct Seq;
  // Picks the next token of s from logits [vocab], or takes `given` (>= 0: the step's argmax, for a plain greedy
  // sequence), on_text called; false when s has ended (s.r complete).
  bool pick(Seq& s, float* logits, int32_t given = -1);
  void finish(size_t index, std::vector<Finished>& out);
  // 1. of step(): prompt chunks (and preempted sequences' refills) within the chunk budget and the free blocks.
  void prefill_round();
  // Frees s's blocks; it runs its context again before decoding on.
  void preempt(Seq& s);
  // Reserves a block for every decoding sequence's next position, preempting the newest sequences while blocks lack;
  // returns the sequences that decode this round.
  std::vector<Seq*> reserve_decode_rows();
  // The log-probability of id and the `alternatives` most likely tokens, from raw_.
  TokenLogprob logprob_of(int32_t id, int alternatives);

  Backend& b_;
  int capacity_, chunk_, vocab_;
  std::unique_ptr<BatchCache> cache_;
  std::vector<std::unique_ptr<Seq>> seqs_;   // in arrival order
  std::vector<bool> slot_used_;
  std::vector<int32_t> stops_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_;               // a decode step's argmax tokens
  std::vector<float> raw_;                    // a row of logits before the sampler's penalties (log-probabilities)
  std::vector<std::pair<float, int32_t>> top_;
  uint64_t next_id_ = 1;
  int64_t preemptions_ = 0;
  int last_rows_ = 0, last_forwards_ = 0;
  double last_decode_s_ = 0;
};

}  // namespace lowbit
