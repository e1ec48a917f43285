// VocabData <-> JSON (schema in vocab_json.h).
#include "tokenizer/vocab_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lowbit {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr char kSpmKind[] = "sentencepiece_bpe";
constexpr char kByteLevelKind[] = "byte_level_bpe";
constexpr char kHexKey[] = "hex";

// Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF) — what a JSON dump accepts.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    size_t len;
    uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 < 0x80) { ++i; continue; }
    if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) { len = 3; if (b0 == 0xE0) lo = 0xA0; if (b0 == 0xED) hi = 0x9F; }
    else if (b0 >= 0xF0 && b0 <= 0xF4) { len = 4; if (b0 == 0xF0) lo = 0x90; if (b0 == 0xF4) hi = 0x8F; }
    else return false;
    if (i + len > s.size()) return false;
    for (size_t j = 1; j < len; ++j) {
      const auto b = static_cast<uint8_t>(s[i + j]);
      if (j == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    }
    i += len;
  }
  return true;
}

ordered_json string_to_json(const std::string& s) {
  if (valid_utf8(s)) return s;
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (char ch : s) {
    hex += kDigits[static_cast<uint8_t>(ch) >> 4];
    hex += kDigits[static_cast<uint8_t>(ch) & 15];
  }
  return ordered_json{{kHexKey, hex}};
}

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

std::string string_from_json(const ordered_json& j, const std::string& where, const std::string& what) {
  if (j.is_string()) return j.get<std::string>();
  LOWBIT_CHECK(j.is_object() && j.size() == 1 && j.contains(kHexKey) && j[kHexKey].is_string(), where,
               ": tokenizer: ", what, " must be a string or {\"hex\": \"...\"}");
  const std::string& hex = j[kHexKey].get_ref<const std::string&>();
  LOWBIT_CHECK(hex.size() % 2 == 0, where, ": tokenizer: ", what, " has an odd number of hex digits");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
    LOWBIT_CHECK(hi >= 0 && lo >= 0, where, ": tokenizer: ", what, " has a character that is not a lowercase hex digit");
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

ordered_json score_to_json(float s) {
  if (std::isfinite(s)) return s;
  return std::isnan(s) ? "nan" : s > 0 ? "inf" : "-inf";
}

float score_from_json(const ordered_json& j, const std::string& where, size_t i) {
  if (j.is_number()) {
    const double d = j.get<double>();
    LOWBIT_CHECK(std::abs(d) <= std::numeric_limits<float>::max(), where, ": tokenizer: score ", i, " (", d,
                 ") does not fit a float");
    return static_cast<float>(d);
  }
  if (j == "inf") return std::numeric_limits<float>::infinity();
  if (j == "-inf") return -std::numeric_limits<float>::infinity();
  if (j == "nan") return std::numeric_limits<float>::quiet_NaN();
  fail(where, ": tokenizer: score ", i, " must be a number, \"inf\", \"-inf\" or \"nan\"");
}

// Fails unless `j` is an object with exactly `keys`.
void expect_keys(const ordered_json& j, std::initializer_list<const char*> keys, const std::string& where,
                 const std::string& what) {
  LOWBIT_CHECK(j.is_object(), where, ": tokenizer: ", what, " must be an object");
  std::set<std::string> want(keys.begin(), keys.end());
  for (const auto& [key, value] : j.items())
    LOWBIT_CHECK(want.count(key), where, ": tokenizer: unknown key '", key, "' in ", what);
  for (const std::string& key : want) LOWBIT_CHECK(j.contains(key), where, ": tokenizer: ", what, " has no '", key, "'");
}

const ordered_json& array_at(const ordered_json& j, const char* key, const std::string& where) {
  LOWBIT_CHECK(j[key].is_array(), where, ": tokenizer: '", key, "' must be an array");
  return j[key];
}

}  // namespace

ordered_json vocab_to_json(const VocabData& v) {
  ordered_json j;
  j["kind"] = v.kind == TokenizerKind::ByteLevelBpe ? kByteLevelKind : kSpmKind;
  j["pre"] = string_to_json(v.pre);
  ordered_json& tokens = j["tokens"] = ordered_json::array();
  for (const std::string& t : v.tokens) tokens.push_back(string_to_json(t));
  ordered_json& scores = j["scores"] = ordered_json::array();
  for (float s : v.scores) scores.push_back(score_to_json(s));
  ordered_json& types = j["types"] = ordered_json::array();
  for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  ordered_json& merges = j["merges"] = ordered_json::array();
  for (const std::string& m : v.merges) merges.push_back(string_to_json(m));
  j["ids"] = {{"bos", v.bos_id}, {"eos", v.eos_id}, {"unk", v.unk_id}, {"pad", v.pad_id}};
  j["flags"] = {{"add_bos", v.add_bos},
                {"add_space_prefix", v.add_space_prefix},
                {"space_prefix_first_only", v.space_prefix_first_only},
                {"space_prefix_unless_space", v.space_prefix_unless_space},
                {"ignore_merges", v.ignore_merges}};
  j["chat_template"] = string_to_json(v.chat_template);
  return j;
}

VocabData vocab_from_json(const ordered_json& j, const std::string& where) {
  expect_keys(j, {"kind", "pre", "tokens", "scores", "types", "merges", "ids", "flags", "chat_template"}, where,
              "the tokenizer object");
  VocabData v;
  LOWBIT_CHECK(j["kind"] == kSpmKind || j["kind"] == kByteLevelKind, where, ": tokenizer: kind must be \"",
               kSpmKind, "\" or \"", kByteLevelKind, "\", got ", j["kind"].dump());
  v.kind = j["kind"] == kByteLevelKind ? TokenizerKind::ByteLevelBpe : TokenizerKind::SentencePieceBpe;
  v.pre = string_from_json(j["pre"], where, "pre");

  const ordered_json& tokens = array_at(j, "tokens", where);
  LOWBIT_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), where,
               ": tokenizer: too many tokens");
  v.tokens.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) v.tokens.push_back(string_from_json(tokens[i], where, "token " + std::to_string(i)));
  const size_t n = v.tokens.size();

  const ordered_json& scores = array_at(j, "scores", where);
  LOWBIT_CHECK(scores.empty() || scores.size() == n, where, ": tokenizer: ", scores.size(), " scores for ", n,
               " tokens (need 0 or one per token)");
  for (size_t i = 0; i < scores.size(); ++i) v.scores.push_back(score_from_json(scores[i], where, i));

  const ordered_json& types = array_at(j, "types", where);
  LOWBIT_CHECK(types.empty() || types.size() == n, where, ": tokenizer: ", types.size(), " types for ", n,
               " tokens (need 0 or one per token)");
  for (size_t i = 0; i < types.size(); ++i) {
    const ordered_json& t = types[i];
    LOWBIT_CHECK(t.is_number_integer() && t.get<int64_t>() >= static_cast<int64_t>(TokenType::Normal) &&
                     t.get<int64_t>() <= static_cast<int64_t>(TokenType::Byte),
                 where, ": tokenizer: type of token ", i, " must be an integer in [1, 6], got ", t.dump());
    v.types.push_back(static_cast<TokenType>(t.get<int32_t>()));
  }

  const ordered_json& merges = array_at(j, "merges", where);
  for (size_t i = 0; i < merges.size(); ++i) v.merges.push_back(string_from_json(merges[i], where, "merge " + std::to_string(i)));

  const ordered_json& ids = j["ids"];
  expect_keys(ids, {"bos", "eos", "unk", "pad"}, where, "ids");
  auto id = [&](const char* key) -> int32_t {
    const ordered_json& x = ids[key];
    LOWBIT_CHECK(x.is_number_integer() && x.get<int64_t>() >= -1 && x.get<int64_t>() < static_cast<int64_t>(n),
                 where, ": tokenizer: ids.", key, " must be -1 or a token id below ", n, ", got ", x.dump());
    return x.get<int32_t>();
  };
  v.bos_id = id("bos");
  v.eos_id = id("eos");
  v.unk_id = id("unk");
  v.pad_id = id("pad");

  const ordered_json& flags = j["flags"];
  expect_keys(flags, {"add_bos", "add_space_prefix", "space_prefix_first_only", "space_prefix_unless_space",
                      "ignore_merges"}, where, "flags");
  auto flag = [&](const char* key) {
    LOWBIT_CHECK(flags[key].is_boolean(), where, ": tokenizer: flags.", key, " must be true or false");
    return flags[key].get<bool>();
  };
  v.add_bos = flag("add_bos");
  v.add_space_prefix = flag("add_space_prefix");
  v.space_prefix_first_only = flag("space_prefix_first_only");
  v.space_prefix_unless_space = flag("space_prefix_unless_space");
  v.ignore_merges = flag("ignore_merges");
  v.chat_template = string_from_json(j["chat_template"], where, "chat_template");
  return v;
}

}  // namespace lowbit
