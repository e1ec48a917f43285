// Continuous batching (api::Batch over runtime/batch.h) on the CPU: generations that join and leave a running batch,
// with chunked prompts, slot reuse and per-request widths, give the tokens each one gives alone through
// Model::generate; cancellation frees its slot; bad requests are refused before anything starts.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>

#include "lowbit/error.h"
#include "lowbit/model.h"
#include "lowbit/quantize.h"
#include "lowbit/system.h"
#include "model/model.h"
#include "runtime/cpu_backend.h"
#include "api_test_util.h"
#include "test_util.h"

namespace lowbit {
namespace {

using test::expect_api_error;
using test::open_cpu;

std::string stories() { return test::shared_path("models/stories260K/stories260K.bin"); }

struct Request {
  std::string prompt;
  api::GenerateParams params;
};

// Runs the requests through one batch, adding each as soon as a slot is free (so later ones join a running batch and
// reuse the slots of ended ones). Returns results and streamed text by request index.
// preemptions (optional): how many generations the batch preempted for KV blocks.
std::map<size_t, std::pair<api::GenerateResult, std::string>> run_batched(api::Model& m, const std::vector<Request>& reqs,
                                                                          const api::BatchParams& bp,
                                                                          int64_t* preemptions = nullptr) {
  std::unique_ptr<api::Batch> batch = m.new_batch(bp);
  std::map<uint64_t, size_t> index;
  std::map<size_t, std::string> streamed;
  std::map<size_t, std::pair<api::GenerateResult, std::string>> out;
  size_t next = 0;
  int rounds = 0;
  while (out.size() < reqs.size()) {
    // A speculative request takes two slots (its target's and its draft's).
    while (next < reqs.size() && batch->free_slots() >= (reqs[next].params.draft_bits > 0 ? 2 : 1)) {
      const size_t i = next++;
      const uint64_t id = batch->add(m.prompt_ids(reqs[i].prompt, reqs[i].params), reqs[i].params,
                                     [&streamed, i](std::string_view piece) { streamed[i] += piece; });
      index[id] = i;
    }
    for (api::Batch::Finished& f : batch->step()) {
      const size_t i = index.at(f.id);
      out[i] = {std::move(f.result), streamed[i]};
    }
    EXPECT_LT(++rounds, 10000) << "the batch does not finish";
    if (rounds >= 10000) break;
  }
  EXPECT_EQ(batch->active(), 0);
  EXPECT_EQ(batch->free_slots(), batch->slots());
  EXPECT_EQ(batch->kv_positions_used(), 0);
  EXPECT_EQ(batch->kv_blocks_used(), 0) << "every generation's blocks are back in the pool";
  if (preemptions != nullptr) *preemptions = batch->preemptions();
  return out;
}

void expect_same_as_alone(api::Model& m, const std::vector<Request>& reqs, const api::BatchParams& bp,
                          int64_t* preemptions = nullptr) {
  const auto batched = run_batched(m, reqs, bp, preemptions);
  ASSERT_EQ(batched.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const api::GenerateResult alone = m.generate(reqs[i].prompt, reqs[i].params);
    const auto& [r, streamed] = batched.at(i);
    EXPECT_EQ(r.prompt_ids, alone.prompt_ids) << "request " << i;
    EXPECT_EQ(r.new_ids, alone.new_ids) << "request " << i << " (bits " << reqs[i].params.bits << ")";
    EXPECT_EQ(r.text, alone.text) << "request " << i;
    EXPECT_EQ(r.stop_reason, alone.stop_reason) << "request " << i;
    EXPECT_EQ(streamed, r.text) << "request " << i << ": the streamed pieces concatenate to the text";
  }
}

std::vector<Request> mixed_requests(const std::vector<int>& widths) {
  const std::vector<std::string> prompts = {"Once upon a time", "Lily and Tom went to the park", "The cat",
                                            "One day, a little girl named Sue found a big red ball in the garden. She",
                                            "Bob had a dog", "It was a sunny day"};
  std::vector<Request> reqs;
  for (size_t i = 0; i < 2 * prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i % prompts.size()];
    r.params.max_tokens = 12 + static_cast<int>(i % 5) * 9;   // different lengths: requests leave at different steps
    r.params.bits = widths.empty() ? 0 : widths[i % widths.size()];
    if (i % 3 == 1) {   // sampled, seeded: the same draws as alone
      r.params.temperature = 0.8f;
      r.params.top_k = 40;
      r.params.seed = 1000 + i;
    }
    if (i % 4 == 2) r.params.stop = {"ed", " the"};
    if (i % 5 == 3) r.params.repetition_penalty = 1.3f;
    if (i % 6 == 5) {
      r.params.presence_penalty = 0.8f;
      r.params.frequency_penalty = 0.5f;
    }
    reqs.push_back(r);
  }
  return reqs;
}

TEST(Batch, EveryRequestGeneratesWhatItGeneratesAlone) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  api::BatchParams bp;
  bp.max_seqs = 3;          // 12 requests: most wait for a slot and join a running batch
  bp.prefill_chunk = 7;     // prompts run in chunks between decode steps
  bp.ctx = 128;
  expect_same_as_alone(m, mixed_requests({}), bp);
}

// The paged cache's bookkeeping: blocks are taken as a slot grows and given back when it is cleared, a reservation
// the pool cannot meet takes nothing, and a forward past a slot's reserved positions is refused.
TEST(Batch, PagedCacheTakesAndReturnsBlocks) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const auto model = Model::load(stories());
  CpuBackend b(*model);
  std::unique_ptr<BatchCache> c = b.new_batch_cache(2, 40, 3);
  EXPECT_EQ(c->block_size(), kKvBlock);
  EXPECT_EQ(c->blocks_total(), 3);
  ASSERT_TRUE(c->reserve(0, 20));   // 2 blocks
  EXPECT_EQ(c->blocks_held(0), 2);
  EXPECT_EQ(c->blocks_free(), 1);
  EXPECT_FALSE(c->reserve(1, 20)) << "2 blocks wanted, 1 free";
  EXPECT_EQ(c->blocks_held(1), 0) << "a refused reservation takes nothing";
  ASSERT_TRUE(c->reserve(1, 16));
  EXPECT_EQ(c->blocks_free(), 0);
  EXPECT_NE(c->table(0)[0], c->table(1)[0]);
  std::vector<int32_t> toks(33, 5);
  expect_api_error([&] { b.batch_extend(*c, 0, toks, 0, nullptr); }, "reserve first");
  std::vector<float> logits(static_cast<size_t>(model->config().vocab_size));
  b.batch_extend(*c, 0, std::span<const int32_t>(toks).first(20), 0, logits.data());
  EXPECT_EQ(c->length(0), 20);
  c->truncate(0, 3);
  EXPECT_EQ(c->blocks_held(0), 2) << "truncate keeps the reservation";
  c->clear(0);
  EXPECT_EQ(c->length(0), 0);
  EXPECT_EQ(c->blocks_free(), 2);
  expect_api_error([&] { c->reserve(0, 41); }, "exceed");
}

// A pool too small for the running generations: prompts wait for blocks and the newest running generation is
// preempted, its context run again later; every request still gives exactly what it gives alone.
TEST(Batch, PreemptedGenerationsGiveWhatTheyGiveAlone) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  api::BatchParams bp;
  bp.max_seqs = 6;
  bp.prefill_chunk = 16;
  bp.ctx = 128;
  const uint64_t block_bytes = [&] {
    std::unique_ptr<api::Batch> probe = m.new_batch(bp);
    return probe->kv_bytes() / static_cast<uint64_t>(probe->kv_blocks_total());
  }();
  bp.kv_cache_bytes = 9 * block_bytes;   // 144 positions for 6 generations of up to ~80
  std::vector<Request> reqs = mixed_requests({});
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].params.max_tokens = 30 + static_cast<int>(i % 3) * 15;
  int64_t preemptions = 0;
  expect_same_as_alone(m, reqs, bp, &preemptions);
  EXPECT_GT(preemptions, 0) << "the pool was meant to run out";
  bp.kv_cache_bytes = 7 * block_bytes;   // less than one generation of ctx 128
  expect_api_error([&] { m.new_batch(bp); }, "holds no generation of 128 positions");
}

// A batch of one decode row runs Model::forward of one token: the same logits bit for bit.
TEST(Batch, OneRowForwardIsForwardBitForBit) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const auto model = Model::load(stories());
  const int V = model->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 270};
  KVCache a = model->new_cache(32), b = model->new_cache(32), c = model->new_cache(32);
  std::vector<float> la(static_cast<size_t>(V)), lb(la.size()), lc(2 * la.size()), lone(la.size());
  model->forward(prompt.data(), static_cast<int>(prompt.size()), a, la.data(), false);
  model->forward(prompt.data(), static_cast<int>(prompt.size()), b, lb.data(), false);
  model->forward(prompt.data(), 3, c, lc.data(), false);
  const int32_t t = 300;
  model->forward(&t, 1, a, la.data(), false);
  KVCache* one[] = {&b};
  model->forward_batch(&t, one, lone.data());
  EXPECT_EQ(la, lone);
  // Two sequences of different lengths in one step: each row as its own forward, up to the GEMM's rounding.
  const int32_t two_tokens[] = {t, 310};
  KVCache* two[] = {&a, &c};
  model->forward_batch(two_tokens, two, lc.data());
  EXPECT_EQ(a.len, static_cast<int>(prompt.size()) + 2);
  EXPECT_EQ(c.len, 4);
  KVCache a2 = model->new_cache(32), c2 = model->new_cache(32);
  std::vector<float> ref(static_cast<size_t>(V));
  std::vector<int32_t> pa = prompt;
  pa.push_back(t);
  pa.push_back(t);
  model->forward(pa.data(), static_cast<int>(pa.size()), a2, ref.data(), false);
  for (int i = 0; i < V; ++i) ASSERT_NEAR(lc[static_cast<size_t>(i)], ref[static_cast<size_t>(i)], 1e-4) << i;
  const int32_t pc[] = {prompt[0], prompt[1], prompt[2], 310};
  model->forward(pc, 4, c2, ref.data(), false);
  for (int i = 0; i < V; ++i) ASSERT_NEAR(lc[static_cast<size_t>(V + i)], ref[static_cast<size_t>(i)], 1e-4) << i;
}

// Requests at different widths of one any-precision file share the batch (one forward per width per step).
TEST(Batch, MixedWidthsFromOneCopyOfTheWeights) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  LOWBIT_REQUIRE_FILE(test::shared_path("data/c4"), "C4 calibration sample");
  const std::string out = test::temp_dir() + "/stories.anyprec.lowbit";
  api::set_cpu_threads(1);
  api::QuantizeOptions q;
  q.method = api::QuantMethod::AnyPrec;
  q.anyprec.widths = {3, 4, 8};
  q.calib.samples = 2;
  q.calib.seqlen = 64;
  api::quantize(stories(), out, q);
  api::Model m = open_cpu(out);
  ASSERT_EQ(m.widths(), (std::vector<int>{3, 4, 8}));
  api::BatchParams bp;
  bp.max_seqs = 4;
  bp.ctx = 128;
  std::vector<Request> reqs = mixed_requests({3, 8, 4, 0});
  for (size_t i = 0; i < reqs.size(); i += 3)   // some 8-bit requests drafted by the 3-bit view, in the batch
    if (reqs[i].params.bits == 8 || reqs[i].params.bits == 0) reqs[i].params.draft_bits = 3;
  expect_same_as_alone(m, reqs, bp);
  // A step with three widths present runs three forwards.
  std::unique_ptr<api::Batch> batch = m.new_batch(bp);
  for (int bits : {3, 4, 8}) {
    api::GenerateParams p;
    p.bits = bits;
    p.max_tokens = 8;
    batch->add(m.prompt_ids("Once", p), p);
  }
  batch->step();   // prompts, then the first decode step
  EXPECT_EQ(batch->last_decode_rows(), 3);
  EXPECT_EQ(batch->last_decode_forwards(), 3);
}

// Log-probabilities: the model's log-softmax at each generated position (checked against Model::forward of the prompt
// and the tokens before it), the chosen token's and the most likely alternatives', raw logits (before penalties).
TEST(Batch, LogprobsAreTheModelsLogSoftmax) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  const auto model = Model::load(stories());
  const int V = model->config().vocab_size;
  api::BatchParams bp;
  bp.ctx = 64;
  std::unique_ptr<api::Batch> batch = m.new_batch(bp);
  api::GenerateParams p;
  p.max_tokens = 6;
  p.logprobs = 3;
  p.temperature = 0.9f;
  p.seed = 5;
  p.frequency_penalty = 1.0f;   // changes what is sampled, not the reported log-probabilities
  std::vector<api::TokenLogprobs> streamed;
  const std::vector<int32_t> prompt = m.prompt_ids("Once upon a time", p);
  batch->add(prompt, p, nullptr, [&](const api::TokenLogprobs& lp) { streamed.push_back(lp); });
  std::vector<api::Batch::Finished> done;
  while (done.empty()) done = batch->step();
  const api::GenerateResult& r = done[0].result;
  ASSERT_EQ(r.logprobs.size(), r.new_ids.size());
  ASSERT_EQ(streamed.size(), r.new_ids.size());
  std::vector<int32_t> ctx = prompt;
  for (size_t i = 0; i < r.new_ids.size(); ++i) {
    KVCache kv = model->new_cache(64);
    std::vector<float> logits(static_cast<size_t>(V));
    model->forward(ctx.data(), static_cast<int>(ctx.size()), kv, logits.data(), false);
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float x : logits) sum += std::exp(static_cast<double>(x - mx));
    const double lse = mx + std::log(sum);
    const api::TokenLogprobs& lp = r.logprobs[i];
    EXPECT_EQ(lp.id, r.new_ids[i]);
    EXPECT_EQ(streamed[i].id, lp.id);
    EXPECT_NEAR(lp.logprob, logits[static_cast<size_t>(lp.id)] - lse, 1e-4) << "token " << i;
    ASSERT_EQ(lp.top.size(), 3u);
    std::vector<int> order(static_cast<size_t>(V));
    for (int t = 0; t < V; ++t) order[static_cast<size_t>(t)] = t;
    std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                      [&](int a, int b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(lp.top[j].id, order[j]) << "token " << i << " alternative " << j;
      EXPECT_NEAR(lp.top[j].logprob, logits[static_cast<size_t>(order[j])] - lse, 1e-4);
    }
    EXPECT_LE(lp.top[1].logprob, lp.top[0].logprob);
    ctx.push_back(r.new_ids[i]);
  }
  std::string joined;
  for (const api::TokenLogprobs& lp : r.logprobs) joined += lp.text;
  EXPECT_EQ(joined, r.text) << "the tokens' bytes make the text";
  api::GenerateParams g;
  g.logprobs = 2;
  expect_api_error([&] { m.generate("Once", g); }, "log-probabilities are computed by batch generation");
}

TEST(Batch, CancelEndsTheRequestAndFreesItsSlot) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  api::BatchParams bp;
  bp.max_seqs = 2;
  bp.ctx = 256;
  std::unique_ptr<api::Batch> batch = m.new_batch(bp);
  std::atomic<bool> cancel{false};
  api::GenerateParams p;
  p.max_tokens = 200;
  p.stop_at_eos = false;
  p.cancel = &cancel;
  const uint64_t id = batch->add(m.prompt_ids("Once upon a time", p), p);
  api::GenerateParams other = p;
  other.cancel = nullptr;
  other.max_tokens = 40;
  const uint64_t id2 = batch->add(m.prompt_ids("The cat", other), other);
  EXPECT_EQ(batch->free_slots(), 0);
  expect_api_error([&] { batch->add(m.prompt_ids("x", p), p); }, "every slot is in use");
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(batch->step().empty());
  EXPECT_GT(batch->kv_positions_used(), 0);
  const int blocks_both = batch->kv_blocks_used();
  cancel = true;
  const std::vector<api::Batch::Finished> done = batch->step();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, id);
  EXPECT_EQ(done[0].result.stop_reason, api::StopReason::Cancelled);
  EXPECT_EQ(done[0].result.new_ids.size(), 6u);   // the first round picks two: after the prompt and after its step
  EXPECT_EQ(batch->free_slots(), 1);
  EXPECT_LT(batch->kv_blocks_used(), blocks_both) << "the cancelled request's KV blocks are back in the pool";
  // The other request goes on undisturbed: its tokens are those it gives alone.
  std::vector<api::Batch::Finished> rest;
  while (rest.empty()) rest = batch->step();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].id, id2);
  EXPECT_EQ(rest[0].result.new_ids, m.generate("The cat", other).new_ids);
}

TEST(Batch, RefusesBadRequestsBeforeStarting) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  api::BatchParams bp;
  bp.max_seqs = 2;
  bp.ctx = 16;
  std::unique_ptr<api::Batch> batch = m.new_batch(bp);
  api::GenerateParams p;
  expect_api_error([&] { batch->add({}, p); }, "empty prompt");
  expect_api_error([&] { batch->add({1, 600}, p); }, "outside the vocabulary");
  expect_api_error([&] { batch->add(std::vector<int32_t>(16, 5), p); }, "fills the context");
  api::GenerateParams b = p;
  b.bits = 3;
  expect_api_error([&] { batch->add({1, 5}, b); }, "--bits 3");
  api::GenerateParams t = p;
  t.temperature = -1;
  expect_api_error([&] { batch->add({1, 5}, t); }, "temperature");
  EXPECT_EQ(batch->free_slots(), 2);
  bp.kv_cache_bytes = 1000;
  expect_api_error([&] { m.new_batch(bp); }, "holds no generation");
  bp.kv_cache_bytes = 0;
  bp.max_seqs = 0;
  expect_api_error([&] { m.new_batch(bp); }, "max sequences must be >= 1");
}

}  // namespace
}  // namespace lowbit
