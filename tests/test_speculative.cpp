// Self-speculative decoding (runtime/speculative.h) on the CPU: the low-bit view of an any-precision stories260K file
// drafts for its 8-bit view. Greedy output is the target's alone, token for token, at every draft width and k (KV
// caches stay consistent through many rejections); a separate draft model works the same way; sampled output follows
// the target's distribution (chi-square against the exact probabilities); bad settings are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "lowbit/error.h"
#include "lowbit/model.h"
#include "lowbit/quantize.h"
#include "lowbit/system.h"
#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/speculative.h"
#include "api_test_util.h"
#include "test_util.h"

namespace lowbit {
namespace {

using test::expect_api_error;
using test::open_cpu;

std::string stories() { return test::shared_path("models/stories260K/stories260K.bin"); }

// stories260K quantized once per test binary: widths 2, 3, 4, 8 of one parent.
const std::string& anyprec_file() {
  static const std::string path = [] {
    const std::string out = test::temp_dir() + "/stories.anyprec-2to8.lowbit";
    api::set_cpu_threads(1);
    api::QuantizeOptions q;
    q.method = api::QuantMethod::AnyPrec;
    q.anyprec.seed_bits = 2;
    q.anyprec.widths = {2, 3, 4, 8};
    q.calib.samples = 4;
    q.calib.seqlen = 128;
    api::quantize(stories(), out, q);
    return out;
  }();
  return path;
}

#define REQUIRE_INPUTS()                                                   \
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");                           \
  LOWBIT_REQUIRE_FILE(test::shared_path("data/c4"), "C4 calibration sample")

TEST(Speculative, GreedyOutputIsTheTargetsAtEveryDraftWidthAndK) {
  REQUIRE_INPUTS();
  api::Model m = open_cpu(anyprec_file());
  int64_t drafted = 0, kept = 0;
  for (const char* prompt : {"Once upon a time", "Lily and Tom went to the park", "The dog"}) {
    api::GenerateParams p;
    p.bits = 8;
    p.max_tokens = 150;
    const api::GenerateResult alone = m.generate(prompt, p);
    for (int draft : {2, 3, 4}) {
      for (int k : {0, 1, 3, 8}) {
        api::GenerateParams s = p;
        s.draft_bits = draft;
        s.draft_k = k;
        std::string streamed;
        const api::GenerateResult r = m.generate(prompt, s, [&](std::string_view piece) { streamed += piece; });
        EXPECT_EQ(r.new_ids, alone.new_ids) << prompt << ", draft " << draft << " bits, k " << k;
        EXPECT_EQ(r.stop_reason, alone.stop_reason);
        EXPECT_EQ(streamed, alone.text);
        EXPECT_GT(r.target_forwards, 0);
        EXPECT_LE(r.target_forwards, static_cast<int64_t>(r.new_ids.size()));
        EXPECT_LE(r.accepted_tokens, r.drafted_tokens);
        drafted += r.drafted_tokens;
        kept += r.accepted_tokens;
      }
    }
  }
  // Both paths ran many times: drafts kept (the bonus token) and drafts rejected (rollback of both caches).
  EXPECT_GT(kept, 100);
  EXPECT_GT(drafted - kept, 100);
}

// Stop strings, EOS and the context end a speculative generation where they end the target's.
TEST(Speculative, StopsWhereTheTargetStops) {
  REQUIRE_INPUTS();
  api::Model m = open_cpu(anyprec_file());
  api::GenerateParams p;
  p.bits = 8;
  p.max_tokens = 400;   // stories260K's context is 512: some prompts reach EOS, the others the context
  for (const char* prompt : {"Once upon a time", "One day"}) {
    for (std::vector<std::string> stop : {std::vector<std::string>{}, std::vector<std::string>{" the", "."}}) {
      api::GenerateParams a = p;
      a.stop = stop;
      api::GenerateParams s = a;
      s.draft_bits = 3;
      const api::GenerateResult alone = m.generate(prompt, a), spec = m.generate(prompt, s);
      EXPECT_EQ(spec.text, alone.text) << prompt;
      EXPECT_EQ(spec.stop_reason, alone.stop_reason) << prompt;
    }
    api::GenerateParams c = p;
    c.ctx = 40;
    api::GenerateParams cs = c;
    cs.draft_bits = 2;
    const api::GenerateResult alone = m.generate(prompt, c), spec = m.generate(prompt, cs);
    EXPECT_EQ(spec.new_ids, alone.new_ids);
    EXPECT_EQ(spec.stop_reason, api::StopReason::Context);
    EXPECT_EQ(alone.stop_reason, api::StopReason::Context);
  }
}

// A separate draft model: the fp32 stories260K drafts for... itself quantized; the 8-bit any-precision view drafts
// for the fp32 model. Output: the target's.
TEST(Speculative, SeparateDraftModel) {
  REQUIRE_INPUTS();
  api::Model target = open_cpu(stories());
  api::Model draft = open_cpu(anyprec_file());
  api::GenerateParams p;
  p.max_tokens = 120;
  const api::GenerateResult alone = target.generate("Once upon a time", p);
  api::GenerateParams s = p;
  s.draft = &draft;
  s.draft_bits = 3;
  const api::GenerateResult r = target.generate("Once upon a time", s);
  EXPECT_EQ(r.new_ids, alone.new_ids);
  EXPECT_GT(r.accepted_tokens, 0);
  s.draft_bits = 0;   // the draft's widest width
  EXPECT_EQ(target.generate("Once upon a time", s).new_ids, alone.new_ids);
}

// Sampling: the tokens follow the target's distribution. 3,000 seeded generations of 3 tokens with 2 drafts a round
// (the 2-bit draft is often rejected, so the residual and bonus draws are both exercised); the first token's
// frequencies and the second's given the most frequent first are tested against the exact top-8 softmax (temperature
// 1.5) of the target's 8-bit logits (chi-square, 7 degrees of freedom, p < 0.001 fails: 24.3).
TEST(Speculative, SampledTokensFollowTheTargetDistribution) {
  REQUIRE_INPUTS();
  api::Model m = open_cpu(anyprec_file());
  const auto model = Model::load(anyprec_file());
  const int V = model->config().vocab_size;
  api::GenerateParams p;
  p.bits = 8;
  p.max_tokens = 3;
  p.temperature = 1.5f;
  p.top_k = 8;
  p.draft_bits = 2;
  p.draft_k = 2;
  p.stop_at_eos = false;
  const std::vector<int32_t> prompt = m.prompt_ids("Once upon a time, there was a", p);
  const int N = 3000;
  std::map<int32_t, int> first;
  std::map<int32_t, std::map<int32_t, int>> second;
  int64_t drafted = 0, kept = 0;
  for (int s = 0; s < N; ++s) {
    p.seed = static_cast<uint64_t>(s);
    const api::GenerateResult r = m.generate(prompt, p);
    ASSERT_EQ(r.new_ids.size(), 3u);
    ++first[r.new_ids[0]];
    ++second[r.new_ids[0]][r.new_ids[1]];
    drafted += r.drafted_tokens;
    kept += r.accepted_tokens;
  }
  // The exact top-8 distribution after `ctx` at 8 bits.
  auto exact = [&](const std::vector<int32_t>& ctx) {
    KVCache kv = model->new_cache(64);
    std::vector<float> logits(static_cast<size_t>(V));
    model->forward(ctx.data(), static_cast<int>(ctx.size()), kv, logits.data(), false, 8);
    std::vector<int> idx(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) idx[static_cast<size_t>(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + 8, idx.end(), [&](int a, int b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
    const double top = logits[static_cast<size_t>(idx[0])];
    std::map<int32_t, double> pr;
    double sum = 0;
    for (int i = 0; i < 8; ++i) {
      const int t = idx[static_cast<size_t>(i)];
      sum += pr[t] = std::exp((logits[static_cast<size_t>(t)] - top) / static_cast<double>(p.temperature));
    }
    for (auto& [t, q] : pr) q /= sum;
    return pr;
  };
  auto chi2 = [](const std::map<int32_t, int>& seen, const std::map<int32_t, double>& pr, int n) {
    double x = 0;
    for (const auto& [t, q] : pr) {
      const auto it = seen.find(t);
      const double o = it == seen.end() ? 0 : it->second, e = q * n;
      x += (o - e) * (o - e) / e;
    }
    for (const auto& [t, o] : seen)
      if (!pr.count(t)) x += 1e9;   // a token outside the target's top 8: impossible under the target
    return x;
  };
  const double x1 = chi2(first, exact(prompt), N);
  int32_t mode = first.begin()->first;
  for (const auto& [t, c] : first)
    if (c > first[mode]) mode = t;
  std::vector<int32_t> ctx2 = prompt;
  ctx2.push_back(mode);
  const double x2 = chi2(second[mode], exact(ctx2), first[mode]);
  std::printf("[ speculative sampling ] chi-square %.1f (first token, %d samples), %.1f (second given the most frequent "
              "first, %d samples); 7 dof, 24.3 at p = 0.001; drafts kept %.1f%%\n",
              x1, N, x2, first[mode], 100.0 * kept / drafted);
  EXPECT_LT(x1, 24.3);
  EXPECT_LT(x2, 24.3);
  EXPECT_GT(drafted - kept, 300) << "rejections happened (the residual draw was exercised)";
}

// The tiny architecture fixtures (Llama 3, Qwen2, Mistral, Mistral with a sliding window; no tokenizer: ids only),
// each drafted by its own RTN 3-bit copy (a separate draft model): greedy output equals the fp32 model's own greedy
// loop through Model::forward, for fixed and adaptive k, through many rejections and cache rollbacks.
TEST(Speculative, TinyArchitecturesWithASeparateDraft) {
  for (const char* name : {"tiny_llama3", "tiny_qwen2", "tiny_mistral", "tiny_mistral_sw"}) {
    const std::string src = test::fixture(name), draft_file = test::temp_dir() + "/" + name + ".rtn3.lowbit";
    api::QuantizeOptions q;
    q.method = api::QuantMethod::Rtn;
    q.uniform.bits = 3;
    q.uniform.group_size = 32;
    api::quantize(src, draft_file, q);
    BackendOptions bo;
    bo.device = Device::Cpu;
    const std::unique_ptr<Backend> target = open_backend(src, bo), draft = open_backend(draft_file, bo);
    const auto model = Model::load(src);
    const int V = model->config().vocab_size, n = 48;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 7; ++i) prompt.push_back((i * 37 + 3) % V);
    // The target alone: prefill, then one token at a time.
    std::vector<int32_t> want;
    KVCache kv = model->new_cache(static_cast<int>(prompt.size()) + n);
    std::vector<float> logits(static_cast<size_t>(V));
    model->forward(prompt.data(), static_cast<int>(prompt.size()), kv, logits.data(), false);
    for (int i = 0; i < n; ++i) {
      const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      want.push_back(t);
      if (i + 1 < n) model->forward(&t, 1, kv, logits.data(), false);
    }
    GenerateOptions g;
    g.max_new_tokens = n;
    g.stop_at_eos = false;
    for (int k : {0, 1, 4}) {
      SpeculativeOptions so;
      so.k = k;
      SpeculativeStats st;
      const GenerateResult r = generate_speculative(*target, *draft, prompt, g, so, nullptr, &st);
      EXPECT_EQ(r.new_ids, want) << name << ", k " << k;
      EXPECT_GT(st.rounds, 0);
      EXPECT_LT(st.rounds, n) << name << ": some drafts were kept";
      EXPECT_GT(st.rejected, 0) << name << ": some were rejected (the caches rolled back)";
    }
  }
}

TEST(Speculative, RefusesBadSettings) {
  REQUIRE_INPUTS();
  api::Model m = open_cpu(anyprec_file());
  api::GenerateParams p;
  p.bits = 4;
  p.draft_bits = 4;
  expect_api_error([&] { m.generate("Once", p); }, "below the target's 4 bits");
  p.draft_bits = 5;
  expect_api_error([&] { m.generate("Once", p); }, "--draft-bits 5");
  p.draft_bits = 2;
  p.draft_k = 9;
  expect_api_error([&] { m.generate("Once", p); }, "--draft-k");
  api::Model plain = open_cpu(stories());
  api::GenerateParams q;
  q.draft_bits = 3;
  expect_api_error([&] { plain.generate("Once", q); }, "needs an any-precision model");
  q.draft = &plain;
  q.draft_bits = 0;
  expect_api_error([&] { plain.generate("Once", q); }, "must be another model");
  api::GenerateParams b;
  b.draft_bits = 2;
  api::BatchParams one;
  one.max_seqs = 1;
  auto batch = m.new_batch(one);
  expect_api_error([&] { batch->add({1, 5}, b); }, "two free slots");
  b.draft = &plain;
  expect_api_error([&] { batch->add({1, 5}, b); }, "generate() only");
}

}  // namespace
}  // namespace lowbit
