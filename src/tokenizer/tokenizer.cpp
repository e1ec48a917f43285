// make_tokenizer() and the helpers both tokenizer kinds share: UTF-8, the GPT-2 byte mapping, byte pieces,
// special-token matching and vocabulary validation.
#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit {

std::unique_ptr<Tokenizer> make_tokenizer(VocabData vocab) {
  tok::validate_vocab(vocab);
  switch (vocab.kind) {
    case TokenizerKind::SentencePieceBpe: return tok::make_spm_bpe(std::move(vocab));
    case TokenizerKind::ByteLevelBpe: return tok::make_byte_level_bpe(std::move(vocab));
  }
  fail("tokenizer: unknown tokenizer kind ", static_cast<int>(vocab.kind));
}

namespace tok {

VocabTokenizer::VocabTokenizer(VocabData v) : v_(std::move(v)) {
  const auto n = static_cast<int32_t>(v_.tokens.size());
  for (int32_t id = 0; id < n; ++id) piece_ids_.emplace(v_.tokens[static_cast<size_t>(id)], id);
}

const std::string& VocabTokenizer::piece(int32_t id) const {
  LOWBIT_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " outside the vocabulary of ", vocab_size());
  return v_.tokens[static_cast<size_t>(id)];
}

int32_t VocabTokenizer::piece_to_id(std::string_view piece) const {
  auto it = piece_ids_.find(piece);
  return it == piece_ids_.end() ? -1 : it->second;
}

uint32_t utf8_decode(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  size_t n = utf8_len(b0);
  if (n == 1) {
    *len = 1;
    return b0 < 0x80 ? b0 : 0xFFFD;
  }
  if (i + n > s.size()) {
    *len = 1;
    return 0xFFFD;
  }
  uint32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *len = n;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {
struct ByteMap {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 324> from_unicode{};  // the image is 0x21..0x143
};
const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.from_unicode.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      m.to_unicode[b] = printable(b) ? static_cast<uint32_t>(b) : next++;
      m.from_unicode[m.to_unicode[b]] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return map;
}
}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 324 ? byte_map().from_unicode[cp] : -1; }

std::string bytes_to_unicode_string(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char ch : bytes) utf8_append(out, byte_to_unicode(static_cast<uint8_t>(ch)));
  return out;
}

int parse_byte_piece(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  auto hex = [](char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
  };
  int hi = hex(p[3]), lo = hex(p[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

std::string byte_piece(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

void SpecialTokenMatcher::add(const std::string& text, int32_t id, bool always) {
  if (text.empty()) return;  // an empty string would match everywhere
  entries_.push_back({text, id, always});
}

void SpecialTokenMatcher::finish() {
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.text.size() > b.text.size(); });
  for (auto& bucket : by_first_byte_) bucket.clear();
  for (uint32_t k = 0; k < entries_.size(); ++k) {
    by_first_byte_[static_cast<uint8_t>(entries_[k].text[0])].push_back(k);
  }
}

void SpecialTokenMatcher::split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
  size_t text_start = 0;
  for (size_t i = 0; i < text.size();) {
    const Entry* hit = nullptr;
    for (uint32_t k : by_first_byte_[static_cast<uint8_t>(text[i])]) {
      const Entry& e = entries_[k];
      if ((parse_special || e.always) && text.compare(i, e.text.size(), e.text) == 0) {
        hit = &e;  // buckets are longest first, so the first hit is the longest
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > text_start) out.push_back({text_start, i, -1});
    out.push_back({i, i + hit->text.size(), hit->id});
    i += hit->text.size();
    text_start = i;
  }
  if (text.size() > text_start) out.push_back({text_start, text.size(), -1});
}

TokenType type_of(const VocabData& v, int32_t id) {
  return v.types.empty() ? TokenType::Normal : v.types[static_cast<size_t>(id)];
}

void validate_vocab(const VocabData& v) {
  const auto n = static_cast<int64_t>(v.tokens.size());
  LOWBIT_CHECK(n > 0, "tokenizer: empty vocabulary");
  LOWBIT_CHECK(n < INT32_MAX, "tokenizer: vocabulary of ", n, " tokens is too large");
  LOWBIT_CHECK(v.types.empty() || static_cast<int64_t>(v.types.size()) == n, "tokenizer: ", v.types.size(),
               " token types for ", n, " tokens");
  for (TokenType t : v.types) {
    const auto raw = static_cast<int32_t>(t);
    LOWBIT_CHECK(raw >= 1 && raw <= 6, "tokenizer: invalid token type ", raw);
  }
  auto check_id = [&](int32_t id, const char* what) {
    LOWBIT_CHECK(id >= -1 && id < n, "tokenizer: ", what, " id ", id, " outside the vocabulary of ", n);
  };
  check_id(v.bos_id, "BOS");
  check_id(v.eos_id, "EOS");
  check_id(v.unk_id, "UNK");
  check_id(v.pad_id, "PAD");
  if (v.kind == TokenizerKind::SentencePieceBpe) {
    LOWBIT_CHECK(static_cast<int64_t>(v.scores.size()) == n, "tokenizer: ", v.scores.size(), " scores for ", n,
                 " tokens (a sentencepiece BPE vocabulary needs one score per token)");
  } else {
    canonical_pre_name(v.pre);  // throws on an unknown pre-tokenizer
  }
}

std::string canonical_pre_name(const std::string& name) {
  // Aliases are the names llama.cpp writes to tokenizer.ggml.pre for the same patterns.
  if (name == "gpt2" || name == "gpt-2") return "gpt2";
  if (name == "smollm") return "smollm";
  if (name == "llama3" || name == "llama-bpe" || name == "llama-v3") return "llama3";
  if (name == "qwen2" || name == "deepseek-r1-qwen") return "qwen2";
  fail("tokenizer: unsupported pre-tokenizer \"", name,
       "\" (supported: gpt2, gpt-2, smollm, llama3, llama-bpe, llama-v3, qwen2, deepseek-r1-qwen)");
}

}  // namespace tok
}  // namespace lowbit
