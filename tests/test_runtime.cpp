// Runtime pieces that need no model: evaluation text protocols, windows, sampler, chat templates.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "runtime/chat_template.h"
#include "runtime/eval_text.h"
#include "runtime/perplexity.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace lowbit {
namespace {

TEST(EvalText, WikiTextRowsJoinedAsGPTQ) {
  const std::string wiki = test::shared_path("data/wikitext-2-raw/wiki.test.raw");
  LOWBIT_REQUIRE_FILE(wiki, "WikiText-2 raw test");
  const EvalText t = load_eval_text(wiki, TextMode::Auto, "text", "");
  EXPECT_EQ(t.mode, TextMode::WikiText);
  ASSERT_EQ(t.docs.size(), 1u);
  // shared/data/SOURCES.md: "The result has 1,294,336 characters" (code points; 1,296,370 UTF-8 bytes)
  size_t code_points = 0;
  for (unsigned char ch : t.docs[0]) code_points += (ch & 0xC0) != 0x80;
  EXPECT_EQ(code_points, 1294336u);
  EXPECT_EQ(t.docs[0].size(), 1296370u);
  EXPECT_EQ(t.docs[0].substr(0, 34), "\n\n = Robert Boulter = \n\n\n\n\n Robert");
}

TEST(EvalText, ModesAndErrors) {
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/a.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"x\": 1}\n");
  EvalText j = load_eval_text(dir + "/a.jsonl", TextMode::Auto, "text", "");
  EXPECT_EQ(j.mode, TextMode::Jsonl);
  EXPECT_EQ(j.docs[0], "one\n\ntwo");
  EXPECT_THROW(load_eval_text(dir + "/a.jsonl", TextMode::Auto, "body", ""), Error);
  test::write_file(dir + "/bad.jsonl", "{\"text\": \"one\"}\n{oops\n");
  try {
    load_eval_text(dir + "/bad.jsonl", TextMode::Auto, "text", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: invalid JSON"), std::string::npos) << e.what();
  }
  test::write_file(dir + "/d.txt", "  first story \n<|endoftext|>\nsecond\n<|endoftext|>\n");
  EvalText d = load_eval_text(dir + "/d.txt", TextMode::Auto, "text", "<|endoftext|>");
  EXPECT_EQ(d.docs, (std::vector<std::string>{"first story", "second"}));
  test::write_file(dir + "/empty.txt", "");
  EXPECT_THROW(load_eval_text(dir + "/empty.txt", TextMode::Plain, "text", ""), Error);
  EXPECT_THROW(load_eval_text(dir + "/missing.txt", TextMode::Plain, "text", ""), Error);
  EXPECT_THROW(parse_text_mode("xml"), Error);
}

TEST(Windows, NonOverlappingTailDropped) {
  std::vector<int32_t> ids(10);
  for (int i = 0; i < 10; ++i) ids[static_cast<size_t>(i)] = i;
  auto w = make_windows_contiguous(ids, 4);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1], (std::vector<int32_t>{4, 5, 6, 7}));
  int64_t dropped = -1;
  auto d = make_windows_documents({{1, 2, 3, 4, 5}, {1}, {1, 9}}, 2, &dropped);
  // doc 0 -> [1,2] (3 tokens past ctx dropped), doc 1 predicts nothing, doc 2 -> [1,9]
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(d[1], (std::vector<int32_t>{1, 9}));
  EXPECT_EQ(dropped, 3);
  EXPECT_THROW(make_windows_contiguous(ids, 1), Error);
}

TEST(Sampler, GreedyAndFilters) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  Sampler greedy(SamplingParams{});
  auto l = logits;
  EXPECT_EQ(greedy.sample(l.data(), 4, {}), 1);
  // top-k 1 at any temperature is greedy
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  Sampler s1(p);
  for (int i = 0; i < 50; ++i) {
    l = logits;
    EXPECT_EQ(s1.sample(l.data(), 4, {}), 1);
  }
  // top-p keeps the smallest prefix reaching the mass: tokens 1 and 2 only
  p.top_k = 0;
  p.temperature = 1.0f;
  p.top_p = 0.6f;
  p.seed = 3;
  Sampler s2(p);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) {
    l = logits;
    ++seen[s2.sample(l.data(), 4, {})];
  }
  EXPECT_EQ(seen.count(0) + seen.count(3), 0u);
  EXPECT_GT(seen[1], seen[2]);
  // frequencies follow the softmax: p(1)/p(2) = e^0.1 renormalised
  const double expect1 = std::exp(2.0) / (std::exp(2.0) + std::exp(1.9));
  EXPECT_NEAR(seen[1] / 2000.0, expect1, 0.04);
}

TEST(Sampler, RepetitionPenaltyAndValidation) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {1.0f, 1.5f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {1}), 0);   // 1.5 / 2 = 0.75 < 1.0
  EXPECT_FLOAT_EQ(l[1], 0.75f);
  std::vector<float> l2 = {-0.5f, -1.0f, -2.0f};
  s.sample(l2.data(), 3, {0});
  EXPECT_FLOAT_EQ(l2[0], -1.0f);              // negative logits are multiplied
  SamplingParams bad;
  bad.top_p = 0.0f;
  EXPECT_THROW(Sampler{bad}, Error);
  bad = {};
  bad.temperature = -1;
  EXPECT_THROW(Sampler{bad}, Error);
}

TEST(Sampler, SeedReproducible) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> base(100);
  for (int i = 0; i < 100; ++i) base[static_cast<size_t>(i)] = std::sin(static_cast<float>(i));
  Sampler a(p), b(p);
  for (int i = 0; i < 20; ++i) {
    auto x = base, y = base;
    EXPECT_EQ(a.sample(x.data(), 100, {}), b.sample(y.data(), 100, {}));
  }
}

TEST(ChatTemplate, Families) {
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
  EXPECT_EQ(apply_chat_template(smol, {{"user", "Hi"}}, ""),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(smol, {{"system", "S"}, {"user", "Hi"}}, ""),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template("<|start_header_id|>", {{"user", "Hi"}}, "<|begin_of_text|>"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(apply_chat_template("[INST]", {{"system", "S"}, {"user", "Hi"}}, "<s>"),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]");
  EXPECT_THROW(apply_chat_template("", {{"user", "Hi"}}, ""), Error);
  EXPECT_THROW(apply_chat_template("{{ unknown }}", {{"user", "Hi"}}, ""), Error);
}

}  // namespace
}  // namespace lowbit
