#include "tokenizer/pretokenize.h"

#include <unicode/uchar.h>

#include <array>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit::tok {

namespace {

// The three classes the patterns test; everything else is "other" ([^\s\p{L}\p{N}]).
enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

CharClass classify_slow(uint32_t cp) {
  if (u_isUWhiteSpace(static_cast<UChar32>(cp))) return kSpace;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER: case U_LOWERCASE_LETTER: case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER: case U_OTHER_LETTER:
      return kLetter;
    case U_DECIMAL_DIGIT_NUMBER: case U_LETTER_NUMBER: case U_OTHER_NUMBER:
      return kNumber;
    default:
      return kOther;
  }
}

// ASCII dominates real text; a table keeps the ICU call off the hot path.
const std::array<CharClass, 128>& ascii_classes() {
  static const std::array<CharClass, 128> table = [] {
    std::array<CharClass, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) t[c] = classify_slow(c);
    return t;
  }();
  return table;
}

inline CharClass classify(uint32_t cp) { return cp < 128 ? ascii_classes()[cp] : classify_slow(cp); }

// The text decoded once: code point, class and byte offset per character (off has one extra entry = size).
struct Chars {
  std::vector<uint32_t> cp;
  std::vector<CharClass> cls;
  std::vector<uint32_t> off;
  size_t n = 0;

  void decode(std::string_view s) {
    cp.clear(); cls.clear(); off.clear();
    size_t i = 0;
    while (i < s.size()) {
      size_t len;
      uint32_t c = utf8_decode(s, i, &len);
      cp.push_back(c);
      cls.push_back(classify(c));
      off.push_back(static_cast<uint32_t>(i));
      i += len;
    }
    off.push_back(static_cast<uint32_t>(s.size()));
    n = cp.size();
  }
  bool is_newline(size_t k) const { return cp[k] == '\r' || cp[k] == '\n'; }
  // End of the run of class c that starts at k (bounded by end).
  size_t run(size_t k, CharClass c, size_t end) const {
    while (k < end && cls[k] == c) ++k;
    return k;
  }
};

// 's|'t|'re|'ve|'m|'ll|'d at i (ASCII case folded when ignore_case); returns the end or 0.
size_t match_contraction(const Chars& c, size_t i, size_t end, bool ignore_case) {
  if (c.cp[i] != '\'' || i + 1 >= end) return 0;
  auto fold = [&](size_t k) {
    uint32_t x = c.cp[k];
    return (ignore_case && x >= 'A' && x <= 'Z') ? x + 32 : x;
  };
  uint32_t a = fold(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 < end) {
    uint32_t b = fold(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  return 0;
}

// \s+(?!\S)|\s+ at i, where c.cls[i] is kSpace. The lookahead makes a run followed by a non-space give back
// its last character, which then prefixes the next word (" world"); a run at the end of the text is kept whole.
size_t match_space_run(const Chars& c, size_t i, size_t end) {
  size_t k = c.run(i, kSpace, end);
  if (k == end) return k;
  return k - 1 > i ? k - 1 : k;
}

// One match of the GPT-2 pattern at i < end; returns the end of the match (> i).
size_t match_gpt2(const Chars& c, size_t i, size_t end) {
  if (size_t e = match_contraction(c, i, end, /*ignore_case=*/false)) return e;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional ASCII space, then a run of one class.
  size_t j = (c.cp[i] == ' ') ? i + 1 : i;
  if (j < end && c.cls[j] != kSpace) return c.run(j, c.cls[j], end);
  if (c.cls[i] == kSpace) return match_space_run(c, i, end);
  return i + 1;  // unreachable: every character has a class
}

// One match of the Llama-3 / Qwen2 pattern at i < end; max_digits is 3 (Llama-3) or 1 (Qwen2).
size_t match_llama3(const Chars& c, size_t i, size_t end, size_t max_digits) {
  if (size_t e = match_contraction(c, i, end, /*ignore_case=*/true)) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+ : letters, optionally led by one character that is no letter, digit or newline.
  if (c.cls[i] == kLetter) return c.run(i, kLetter, end);
  if (c.cls[i] != kNumber && !c.is_newline(i) && i + 1 < end && c.cls[i + 1] == kLetter) {
    return c.run(i + 1, kLetter, end);
  }
  // \p{N}{1,3}
  if (c.cls[i] == kNumber) {
    size_t k = i;
    while (k < end && k - i < max_digits && c.cls[k] == kNumber) ++k;
    return k;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t j = (c.cp[i] == ' ') ? i + 1 : i;
  if (j < end && c.cls[j] == kOther) {
    size_t k = c.run(j, kOther, end);
    while (k < end && c.is_newline(k)) ++k;
    return k;
  }
  if (c.cls[i] == kSpace) {
    // \s*[\r\n]+ : the greedy \s* backs off to the last CR/LF of the whitespace run, so the match ends just
    // after it ("  \n\n  x" -> "  \n\n" then "  x" by the rules below).
    size_t k = c.run(i, kSpace, end);
    for (size_t q = k; q > i; --q) {
      if (c.is_newline(q - 1)) return q;
    }
    return match_space_run(c, i, end);
  }
  return i + 1;
}

void emit(std::string_view text, const Chars& c, size_t a, size_t b, std::vector<std::string_view>& words) {
  words.push_back(text.substr(c.off[a], c.off[b] - c.off[a]));
}

}  // namespace

PreTokenizer pre_tokenizer_from_name(const std::string& name) {
  if (name == "gpt2") return PreTokenizer::Gpt2;
  if (name == "smollm") return PreTokenizer::SmolLM;
  if (name == "llama3") return PreTokenizer::Llama3;
  if (name == "qwen2") return PreTokenizer::Qwen2;
  fail("tokenizer: unsupported pre-tokenizer \"", name, "\" (supported: gpt2, smollm, llama3, qwen2)");
}

const char* pre_tokenizer_name(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::Gpt2: return "gpt2";
    case PreTokenizer::SmolLM: return "smollm";
    case PreTokenizer::Llama3: return "llama3";
    case PreTokenizer::Qwen2: return "qwen2";
  }
  return "?";
}

const char* pre_tokenizer_regex(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::Gpt2:
    case PreTokenizer::SmolLM:
      return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    case PreTokenizer::Llama3:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreTokenizer::Qwen2:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  }
  return "";
}

void pretokenize(std::string_view text, PreTokenizer pre, std::vector<std::string_view>& words) {
  thread_local Chars c;  // reused: encode() pre-tokenizes every text fragment
  c.decode(text);
  const size_t n = c.n;
  switch (pre) {
    case PreTokenizer::Gpt2:
      for (size_t i = 0; i < n;) {
        size_t e = match_gpt2(c, i, n);
        emit(text, c, i, e, words);
        i = e;
      }
      break;
    case PreTokenizer::SmolLM:
      // Digits(individual_digits) runs first, so the GPT-2 pattern sees each stretch between digits as a whole
      // string: its (?!\S) lookahead stops at the stretch end, and " 1" never forms (space and digit split).
      for (size_t s = 0; s < n;) {
        if (c.cls[s] == kNumber) {
          emit(text, c, s, s + 1, words);
          ++s;
          continue;
        }
        size_t stretch_end = s;
        while (stretch_end < n && c.cls[stretch_end] != kNumber) ++stretch_end;
        for (size_t i = s; i < stretch_end;) {
          size_t e = match_gpt2(c, i, stretch_end);
          emit(text, c, i, e, words);
          i = e;
        }
        s = stretch_end;
      }
      break;
    case PreTokenizer::Llama3:
    case PreTokenizer::Qwen2: {
      const size_t max_digits = pre == PreTokenizer::Llama3 ? 3 : 1;
      for (size_t i = 0; i < n;) {
        size_t e = match_llama3(c, i, n, max_digits);
        emit(text, c, i, e, words);
        i = e;
      }
      break;
    }
  }
}

}  // namespace lowbit::tok
