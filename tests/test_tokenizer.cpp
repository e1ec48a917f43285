// Tokenizers against oracle ids from trusted implementations (tools/make_tokenizer_golden.py writes
// tests/fixtures/tokenizer/golden.json): Hugging Face for SmolLM2 and for the HF-written tokenizer.json fixtures,
// llama2.c run.c for stories260K's tok512.bin, sentencepiece for tiny_spm.model; Oniguruma's splits for the
// pre-tokenizers. Also: decode(encode(s)) == s, the tokenizer.json writer round trip, thread safety, and the error
// paths of every reader.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "io/gguf.h"
#include "test_util.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "core/knobs.h"

namespace lowbit {
namespace {

using json = nlohmann::json;
using test::fixture;
using test::read_file;
using test::shared_path;

const json& golden() {
  static const json g = json::parse(read_file(fixture("tokenizer/golden.json")));
  return g;
}

uint64_t fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t id : ids) {
    uint8_t b[4];
    std::memcpy(b, &id, 4);  // little-endian host (checked in io/gguf.cpp)
    for (uint8_t x : b) h = (h ^ x) * 0x100000001B3ull;
  }
  return h;
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<std::string> split_lines(const std::string& text) {  // Python's str.split("\n")
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.push_back(text.substr(start, nl - start));
  }
  out.push_back(text.substr(start));
  return out;
}

// The GPTQ perplexity text: lines (with their "\n") joined by "\n\n", whitespace-only lines emptied.
std::string gptq_text(const std::string& raw) {
  std::string out;
  size_t start = 0;
  bool first = true;
  while (start < raw.size()) {
    size_t nl = raw.find('\n', start);
    size_t end = nl == std::string::npos ? raw.size() : nl + 1;
    std::string line = raw.substr(start, end - start);
    if (line.find_first_not_of(" \t\n\r\f\v") == std::string::npos) line.clear();
    if (!first) out += "\n\n";
    out += line;
    first = false;
    start = end;
  }
  return out;
}

const std::string& wikitext() {
  static const std::string text = [] {
    std::string p = shared_path("data/wikitext-2-raw/wiki.test.raw");
    return p.empty() ? std::string() : read_file(p);
  }();
  return text;
}

// ---- the three tokenizers under test, each with the reason it is unavailable -----------------------------
struct Loaded {
  std::unique_ptr<Tokenizer> tok;
  std::string missing;  // why it could not be loaded (then the test skips)
};

Loaded load(const std::string& name) {
  Loaded l;
  if (name == "smollm2") {
    std::string p = test::smollm2_gguf();
    if (p.empty()) return {nullptr, "the SmolLM2 GGUF (~/.cache/lowbit/models, run scripts/setup.sh)"};
    l.tok = make_tokenizer(vocab_from_gguf(GgufFile::open(p)));
  } else if (name == "stories260k") {
    std::string p = shared_path("models/stories260K/tok512.bin");
    if (p.empty()) return {nullptr, "shared/models/stories260K/tok512.bin"};
    l.tok = make_tokenizer(read_llama2c_tokenizer(p, 512));
  } else if (name == "tiny_spm") {
    l.tok = make_tokenizer(read_sentencepiece_model(fixture("tokenizer/tiny_spm.model")));
  } else {  // tokenizer.json files written by Hugging Face
    const std::string dir = fixture("tokenizer/" + name);
    l.tok = make_tokenizer(read_tokenizer_json(dir + "/tokenizer.json", dir + "/tokenizer_config.json"));
  }
  return l;
}

const Tokenizer* cached(const std::string& name, std::string* missing) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load(name)).first;
  *missing = it->second.missing;
  return it->second.tok.get();
}

#define LOAD_OR_SKIP(var, name)                                   \
  std::string missing_##var;                                      \
  const Tokenizer* var = cached(name, &missing_##var);            \
  if (!var) GTEST_SKIP() << "missing " << missing_##var

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += static_cast<char>(c);
  }
  return out;
}

// Compares the tokenizer with the oracle on the tricky strings; returns the number of mismatches.
int check_cases(const Tokenizer& tok, const json& g, const std::string& label) {
  const bool parse_special = g["parse_special"].get<bool>();
  int bad = 0;
  for (const json& c : g["cases"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, /*add_bos=*/false, parse_special);
    if (got != want) {
      ++bad;
      ADD_FAILURE() << label << ": \"" << printable(text) << "\"\n  want " << json(want).dump() << "\n  got  "
                    << json(got).dump();
    }
  }
  return bad;
}

// Compares with the oracle on WikiText-2: the whole raw text, the GPTQ text, then line by line to name the first
// line that differs when the whole text does.
void check_wikitext(const Tokenizer& tok, const json& w, bool parse_special, const std::string& label) {
  const std::string& raw = wikitext();
  auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(raw, false, parse_special);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ %s ] WikiText-2 raw: %zu bytes -> %zu tokens in %.3f s (%.2f MB/s)\n", label.c_str(), raw.size(),
              ids.size(), sec, static_cast<double>(raw.size()) / sec / 1e6);
  const bool whole_ok = static_cast<int64_t>(ids.size()) == w["raw"]["count"].get<int64_t>() &&
                        hex64(fnv1a64(ids)) == w["raw"]["fnv1a64"].get<std::string>();
  EXPECT_TRUE(whole_ok) << label << ": whole WikiText-2 gives " << ids.size() << " tokens, oracle "
                        << w["raw"]["count"];

  const std::string gptq = gptq_text(raw);
  ASSERT_EQ(gptq.size(), w["gptq"]["bytes"].get<size_t>()) << "GPTQ text built differently from the script";
  const auto gids = tok.encode(gptq, false, parse_special);
  EXPECT_EQ(gids.size(), w["gptq"]["count"].get<size_t>()) << label << ": GPTQ-joined WikiText-2";
  EXPECT_EQ(hex64(fnv1a64(gids)), w["gptq"]["fnv1a64"].get<std::string>()) << label << ": GPTQ-joined WikiText-2";

  const auto lines = split_lines(raw);
  std::vector<std::string> want;
  std::istringstream ss(w["lines"].get<std::string>());
  for (std::string e; ss >> e;) want.push_back(e);
  ASSERT_EQ(lines.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto li = tok.encode(lines[i], false, parse_special);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%zu:%08llx", li.size(), static_cast<unsigned long long>(fnv1a64(li) & 0xFFFFFFFFu));
    if (want[i] != buf && bad++ < 3) {
      ADD_FAILURE() << label << ": WikiText-2 line " << i + 1 << " differs (oracle " << want[i] << ", got " << buf
                    << "): \"" << printable(lines[i].substr(0, 200)) << "\"";
    }
  }
  EXPECT_EQ(bad, 0) << label << ": lines that differ";
}

// Byte-level vocabularies may lack tokens for some bytes (SmolLM2 lacks 21); encode drops those, as HF does.
std::string without_untokenizable_bytes(const Tokenizer& tok, const std::string& s) {
  if (tok.kind() != TokenizerKind::ByteLevelBpe) return s;
  std::string out;
  for (char ch : s) {
    std::string mapped;
    tok::utf8_append(mapped, tok::byte_to_unicode(static_cast<uint8_t>(ch)));
    if (tok.piece_to_id(mapped) >= 0) out += ch;
  }
  return out;
}

class OracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OracleTest, TrickyStringsMatchOracle) {
  LOAD_OR_SKIP(tok, GetParam());
  EXPECT_EQ(check_cases(*tok, golden()[GetParam()], GetParam()), 0);
}

TEST_P(OracleTest, WikiTextMatchesOracle) {
  LOAD_OR_SKIP(tok, GetParam());
  if (wikitext().empty()) GTEST_SKIP() << "missing shared/data/wikitext-2-raw/wiki.test.raw";
  const json& g = golden()[GetParam()];
  check_wikitext(*tok, g["wikitext"], g["parse_special"].get<bool>(), GetParam());
}

TEST_P(OracleTest, DecodeInvertsEncode) {
  LOAD_OR_SKIP(tok, GetParam());
  // HF's Metaspace gives " a" and "a" the same ids ("▁a"), and decodes them as "a" (tiny_spm_hf): the one loss.
  auto expected = [&](const std::string& text) {
    const std::string t = without_untokenizable_bytes(*tok, text);
    return tok->vocab().space_prefix_unless_space && !t.empty() && t[0] == ' ' ? t.substr(1) : t;
  };
  for (const json& c : golden()[GetParam()]["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->decode(tok->encode(text, false, false)), expected(text)) << printable(text);
    EXPECT_EQ(tok->decode(tok->encode(text, true, false)), expected(text)) << printable(text);  // BOS renders as ""
    // With parse_special the special-token strings come back only when rendered.
    EXPECT_EQ(tok->decode(tok->encode(text, false, true), /*render_special=*/true), expected(text)) << printable(text);
  }
  if (wikitext().empty()) GTEST_SKIP() << "missing shared/data/wikitext-2-raw/wiki.test.raw";
  EXPECT_TRUE(tok->decode(tok->encode(wikitext(), true, false)) == expected(wikitext())) << "WikiText-2 round trip";
}

// write_tokenizer_json, read back with read_tokenizer_json: same ids. With LOWBIT_TOKENIZER_JSON_OUT set, the files
// stay in $LOWBIT_TOKENIZER_JSON_OUT/<name> for `make_tokenizer_golden.py --check-written` (HF's view of them).
TEST_P(OracleTest, TokenizerJsonRoundTrip) {
  LOAD_OR_SKIP(tok, GetParam());
  std::string dir = test::temp_dir();
  if (knob_is_set(Knob::TokenizerJsonOut)) dir = knob_string(Knob::TokenizerJsonOut) + "/" + GetParam();
  write_tokenizer_json(tok->vocab(), dir);
  auto back = make_tokenizer(read_tokenizer_json(dir + "/tokenizer.json", dir + "/tokenizer_config.json"));
  EXPECT_EQ(back->kind(), tok->kind());
  EXPECT_EQ(back->vocab_size(), tok->vocab_size());
  EXPECT_EQ(back->bos_id(), tok->bos_id());
  EXPECT_EQ(back->eos_id(), tok->eos_id());
  EXPECT_EQ(back->add_bos_default(), tok->add_bos_default());
  EXPECT_EQ(back->vocab().chat_template, tok->vocab().chat_template);
  const json& g = golden()[GetParam()];
  EXPECT_EQ(check_cases(*back, g, GetParam() + " via tokenizer.json"), 0);
  if (wikitext().empty()) GTEST_SKIP() << "missing shared/data/wikitext-2-raw/wiki.test.raw";
  EXPECT_TRUE(back->encode(wikitext(), false, g["parse_special"]) == tok->encode(wikitext(), false, g["parse_special"]));
}

// Arbitrary bytes (invalid UTF-8 included) survive the round trip: byte-level BPE covers every byte, and
// sentencepiece vocabularies fall back to <0xXX> pieces.
TEST_P(OracleTest, RandomBytesRoundTrip) {
  LOAD_OR_SKIP(tok, GetParam());
  std::mt19937 rng(1234);
  for (int n = 0; n < 200; ++n) {
    std::string s = "x";  // not a leading space: see DecodeInvertsEncode for tiny_spm_hf
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      const uint32_t r = rng();
      // Mostly high bytes and ASCII punctuation/space; '\xE2' sometimes starts a real 3-byte character.
      s += static_cast<char>(r % 3 == 0 ? 0x20 + (r >> 8) % 64 : 0x80 + (r >> 8) % 128);
    }
    if (s.find("\xE2\x96\x81") != std::string::npos) continue;  // '▁' itself decodes as a space in spm vocabularies
    EXPECT_EQ(tok->decode(tok->encode(s, false, false)), without_untokenizable_bytes(*tok, s)) << n;
  }
}

// encode() is const and safe to call from several threads (the word cache is locked, scratch is per thread).
TEST_P(OracleTest, ConcurrentEncodeMatchesSerial) {
  LOAD_OR_SKIP(tok, GetParam());
  if (wikitext().empty()) GTEST_SKIP() << "missing shared/data/wikitext-2-raw/wiki.test.raw";
  const auto lines = split_lines(wikitext().substr(0, 200000));
  std::vector<std::vector<int32_t>> serial(lines.size()), parallel(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) serial[i] = tok->encode(lines[i], false, true);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < lines.size(); i += 4) parallel[i] = tok->encode(lines[i], false, true);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(serial == parallel);
}

// smollm2: GGUF vocab; stories260k: llama2.c tokenizer.bin; tiny_spm: sentencepiece model; tiny_bl_llama3,
// tiny_bl_qwen2, tiny_spm_hf: tokenizer.json as HF writes it (Llama-3 / Qwen2 splits, Metaspace form).
INSTANTIATE_TEST_SUITE_P(Tokenizers, OracleTest,
                         ::testing::Values("smollm2", "stories260k", "tiny_spm", "tiny_bl_llama3", "tiny_bl_qwen2",
                                           "tiny_spm_hf"));

TEST(TokenizerJson, ReadsWhatHuggingFaceWrites) {
  LOAD_OR_SKIP(bl, "tiny_bl_llama3");
  const VocabData& v = bl->vocab();
  EXPECT_EQ(v.kind, TokenizerKind::ByteLevelBpe);
  EXPECT_EQ(v.pre, "llama3");
  EXPECT_TRUE(v.ignore_merges);
  EXPECT_EQ(bl->piece(v.bos_id), "<|begin_of_text|>");
  EXPECT_EQ(bl->piece(v.eos_id), "<|eot_id|>");
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.chat_template.empty());
  const int32_t think = bl->piece_to_id("<think>");
  ASSERT_GE(think, 0);
  EXPECT_EQ(v.types[static_cast<size_t>(think)], TokenType::UserDefined);
  EXPECT_EQ(bl->encode("a<think>b", false, /*parse_special=*/false)[1], think);  // plain added tokens always match
  EXPECT_EQ(bl->encode("hi", true)[0], v.bos_id);

  LOAD_OR_SKIP(sp, "tiny_spm_hf");
  const VocabData& s = sp->vocab();
  EXPECT_EQ(s.kind, TokenizerKind::SentencePieceBpe);
  EXPECT_TRUE(s.add_space_prefix && s.space_prefix_first_only && s.space_prefix_unless_space);
  EXPECT_EQ(sp->piece(s.unk_id), "<unk>");
  EXPECT_EQ(s.types[static_cast<size_t>(s.unk_id)], TokenType::Unknown);
  EXPECT_EQ(s.types[static_cast<size_t>(sp->piece_to_id("<0x41>"))], TokenType::Byte);
}

// ---- pre-tokenizer matchers against Oniguruma's splits ----------------------------------------------------
TEST(PreTokenizer, SplitsMatchOniguruma) {
  for (const auto& [name, g] : golden()["pretokenize"].items()) {
    const tok::PreTokenizer pre = tok::pre_tokenizer_from_name(name);
    for (const json& c : g["cases"]) {
      const std::string text = c[0];
      std::vector<std::string_view> words;
      tok::pretokenize(text, pre, words);
      EXPECT_EQ(std::vector<std::string>(words.begin(), words.end()), c[1].get<std::vector<std::string>>())
          << name << ": \"" << printable(text) << "\"";
    }
    if (wikitext().empty()) continue;
    std::vector<std::string_view> words;
    tok::pretokenize(wikitext(), pre, words);
    std::vector<int32_t> lens;
    for (auto w : words) lens.push_back(static_cast<int32_t>(w.size()));
    EXPECT_EQ(lens.size(), g["wikitext_raw"]["count"].get<size_t>()) << name;
    EXPECT_EQ(hex64(fnv1a64(lens)), g["wikitext_raw"]["fnv1a64"].get<std::string>()) << name;
  }
}

TEST(PreTokenizer, UnknownNameIsRefused) {
  VocabData v;
  v.kind = TokenizerKind::ByteLevelBpe;
  v.tokens = {"a", "b"};
  v.pre = "falcon";
  try {
    make_tokenizer(v);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported pre-tokenizer \"falcon\""), std::string::npos) << e.what();
  }
}

// ---- behaviour beyond the oracle strings --------------------------------------------------------------------
TEST(SpmTokenizer, BosSpecialTokensAndDummyPrefix) {
  LOAD_OR_SKIP(tok, "stories260k");
  EXPECT_EQ(tok->piece(1), "<s>");
  EXPECT_EQ(tok->piece_to_id("\xE2\x96\x81t"), 259);  // llama2.c's ' t', spelled as sentencepiece does
  const auto plain = tok->encode("Hi", false, false);
  auto with_bos = tok->encode("Hi", true, false);
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(tok->decode(with_bos), "Hi");
  EXPECT_EQ(tok->decode({1, 2}, /*render_special=*/true), "<s></s>");
  EXPECT_EQ(tok->token_bytes(3 + 'A'), "A");  // byte-fallback piece <0x41>
  // With parse_special "<s>" is BOS and the text after it gets its own dummy prefix (llama.cpp, HF Llama).
  const auto ids = tok->encode("a<s>b", false, true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids, (std::vector<int32_t>{tok->encode("a", false, false)[0], 1, tok->encode("b", false, false)[0]}));
  EXPECT_EQ(tok->decode(ids, true), "a<s>b");
  EXPECT_TRUE(tok->encode("", true, true) == std::vector<int32_t>{1});
  EXPECT_THROW(tok->token_bytes(512), Error);
}

TEST(SpmTokenizer, UserDefinedTokensAreAlwaysMatched) {
  LOAD_OR_SKIP(tok, "tiny_spm");
  const int32_t id = tok->piece_to_id("<|im_start|>");
  ASSERT_GE(id, 0);
  for (bool parse_special : {false, true}) {
    const auto ids = tok->encode("hi<|im_start|>there", false, parse_special);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), id), 1);
  }
}

TEST(ByteLevelTokenizer, SpecialTokensOnlyWithParseSpecial) {
  LOAD_OR_SKIP(tok, "smollm2");
  EXPECT_EQ(tok->kind(), TokenizerKind::ByteLevelBpe);
  EXPECT_EQ(tok->vocab().pre, "smollm");
  const std::string text = "<|im_start|>user";
  const auto parsed = tok->encode(text, false, true);
  EXPECT_EQ(parsed[0], tok->piece_to_id("<|im_start|>"));
  const auto literal = tok->encode(text, false, false);
  EXPECT_GT(literal.size(), parsed.size());
  EXPECT_EQ(std::count(literal.begin(), literal.end(), parsed[0]), 0);
  EXPECT_EQ(tok->decode(literal), text);
  EXPECT_EQ(tok->decode(parsed), "user");  // control tokens are not rendered by default
  EXPECT_EQ(tok->decode(parsed, true), text);
  EXPECT_EQ(tok->token_bytes(tok->piece_to_id("\xC4\xA0the")), " the");  // 'Ġthe'
  EXPECT_FALSE(tok->vocab().chat_template.empty());
}

// transformers >= 4.47 saves the chat template as chat_template.jinja beside tokenizer_config.json.
TEST(TokenizerJson, ChatTemplateFromJinjaFile) {
  const std::string dir = test::temp_dir();
  std::filesystem::copy_file(fixture("tokenizer/tiny_bl_llama3/tokenizer.json"), dir + "/tokenizer.json");
  test::write_file(dir + "/tokenizer_config.json", R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})");
  test::write_file(dir + "/chat_template.jinja", "{{ messages }}");
  const VocabData v = read_tokenizer_json(dir + "/tokenizer.json", dir + "/tokenizer_config.json");
  EXPECT_EQ(v.chat_template, "{{ messages }}");
  EXPECT_TRUE(v.add_bos);  // from the TemplateProcessing post-processor, as the config does not say
}

// The GGUF "llama" (sentencepiece) vocabulary path: tiny_spm.model's pieces written as llama.cpp's keys must give
// sentencepiece's ids again.
TEST(GgufVocab, LlamaVocabularyMatchesSentencepiece) {
  const VocabData src = read_sentencepiece_model(fixture("tokenizer/tiny_spm.model"));
  auto value = [](GgufType t) {
    GgufValue v;
    v.type = t;
    return v;
  };
  std::map<std::string, GgufValue> kv;
  kv["tokenizer.ggml.model"] = value(GgufType::STRING);
  kv["tokenizer.ggml.model"].scalar = std::string("llama");
  GgufValue tokens = value(GgufType::ARRAY), scores = value(GgufType::ARRAY), types = value(GgufType::ARRAY);
  tokens.array_type = GgufType::STRING;
  tokens.strings = src.tokens;
  scores.array_type = GgufType::F32;
  scores.floats.assign(src.scores.begin(), src.scores.end());
  types.array_type = GgufType::I32;
  for (TokenType t : src.types) types.ints.push_back(static_cast<int64_t>(t));
  kv["tokenizer.ggml.tokens"] = tokens;
  kv["tokenizer.ggml.scores"] = scores;
  kv["tokenizer.ggml.token_type"] = types;
  const std::string p = test::temp_dir() + "/spm.gguf";
  write_gguf(p, kv, {});

  const VocabData v = vocab_from_gguf(GgufFile::open(p));  // ids and flags from llama.cpp's defaults
  EXPECT_EQ(v.kind, TokenizerKind::SentencePieceBpe);
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_EQ(v.unk_id, 0);
  EXPECT_TRUE(v.add_bos);
  EXPECT_TRUE(v.add_space_prefix);
  auto tok = make_tokenizer(v);
  EXPECT_EQ(check_cases(*tok, golden()["tiny_spm"], "tiny_spm via GGUF"), 0);
}

// ---- error paths ------------------------------------------------------------------------------------------
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, MissingFilesNameThePath) {
  const std::string p = test::temp_dir() + "/absent";
  expect_error([&] { read_llama2c_tokenizer(p + ".bin", 32); }, p + ".bin");
  expect_error([&] { read_sentencepiece_model(p + ".model"); }, p + ".model");
  expect_error([&] { read_tokenizer_json(p + ".json", ""); }, p + ".json");
}

TEST(TokenizerErrors, TruncatedLlama2cTokenizer) {
  std::string p = shared_path("models/stories260K/tok512.bin");
  if (p.empty()) GTEST_SKIP() << "missing shared/models/stories260K/tok512.bin";
  const std::string bytes = read_file(p);
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/cut.bin", bytes.substr(0, bytes.size() - 3));
  expect_error([&] { read_llama2c_tokenizer(dir + "/cut.bin", 512); }, "truncated at token 511");
  test::write_file(dir + "/tiny.bin", bytes.substr(0, 2));
  expect_error([&] { read_llama2c_tokenizer(dir + "/tiny.bin", 512); }, "too short");
  test::write_file(dir + "/neg.bin", std::string("\xff\xff\xff\xff", 4) + bytes.substr(4));
  expect_error([&] { read_llama2c_tokenizer(dir + "/neg.bin", 512); }, "invalid max token length");
}

TEST(TokenizerErrors, BadAndUnsupportedTokenizerJson) {
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/bad.json", "{\"model\": {\"type\": \"BPE\", ");
  expect_error([&] { read_tokenizer_json(dir + "/bad.json", ""); }, "invalid JSON");
  test::write_file(dir + "/wp.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  expect_error([&] { read_tokenizer_json(dir + "/wp.json", ""); }, "unsupported tokenizer.json: model type WordPiece");
  test::write_file(dir + "/bert.json", R"({"normalizer": null, "pre_tokenizer": {"type": "BertPreTokenizer"},
      "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { read_tokenizer_json(dir + "/bert.json", ""); }, "unsupported tokenizer.json: normalizer null");
  test::write_file(dir + "/nfc.json", R"({"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel",
      "add_prefix_space": false, "use_regex": true}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { read_tokenizer_json(dir + "/nfc.json", ""); }, "normalizer NFC");
  test::write_file(dir + "/types.json", R"({"normalizer": null, "pre_tokenizer": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 0}, "merges": [[1, 2]]}})");
  expect_error([&] { read_tokenizer_json(dir + "/types.json", ""); }, dir + "/types.json: malformed");
  test::write_file(dir + "/merge.json", R"({"normalizer": null, "pre_tokenizer": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})");
  expect_error([&] { make_tokenizer(read_tokenizer_json(dir + "/merge.json", "")); }, "not in the vocabulary");
}

TEST(TokenizerErrors, BadSentencepieceModels) {
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/garbage.model", "\xff\xff\xff");
  expect_error([&] { read_sentencepiece_model(dir + "/garbage.model"); }, dir + "/garbage.model: ");
  // ModelProto{pieces: [{piece: "a", score: 0, type: NORMAL}], trainer_spec: {model_type: UNIGRAM}}
  const std::string unigram("\x0a\x0a\x0a\x01" "a" "\x15\x00\x00\x00\x00\x18\x01" "\x12\x02\x18\x01", 16);
  test::write_file(dir + "/unigram.model", unigram);
  expect_error([&] { read_sentencepiece_model(dir + "/unigram.model"); }, "unsupported sentencepiece model type unigram");
}

TEST(TokenizerErrors, UnsupportedGgufTokenizer) {
  const std::string p = test::temp_dir() + "/bert.gguf";
  std::map<std::string, GgufValue> kv;
  GgufValue model;
  model.type = GgufType::STRING;
  model.scalar = std::string("bert");
  kv["tokenizer.ggml.model"] = model;
  write_gguf(p, kv, {});
  expect_error([&] { vocab_from_gguf(GgufFile::open(p)); }, p + ": unsupported tokenizer model \"bert\"");
}

}  // namespace
}  // namespace lowbit
