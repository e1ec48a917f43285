// Regex pre-tokenizers of byte-level BPE vocabularies, hand-written for the few patterns models use (no general
// regex engine: std::regex has no \p{L}, and each pattern is a short alternation that a direct matcher runs at
// memory speed). Character classes come from ICU so they follow the Unicode tables:
//   \p{L} = general categories Lu Ll Lt Lm Lo, \p{N} = Nd Nl No, \s = the White_Space property.
// Each matcher tries the alternatives in order at the current position and takes the first that matches, the way
// a backtracking engine (Oniguruma in Hugging Face `tokenizers`) does; the end of one match starts the next.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace lowbit::tok {

enum class PreTokenizer {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Gpt2,
  // HF Digits(individual_digits=true) first (every \p{N} character on its own), then Gpt2 on the stretches
  // between digits (SmolLM / StarCoder tokenizers).
  SmolLM,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Llama3,
  // As Llama3 with \p{N} instead of \p{N}{1,3}.
  Qwen2,
};

// Canonical names: "gpt2", "smollm", "llama3", "qwen2". Throws lowbit::Error for anything else.
PreTokenizer pre_tokenizer_from_name(const std::string& canonical_name);
const char* pre_tokenizer_name(PreTokenizer pre);
// The Hugging Face Split regex for the pattern part (Gpt2 for SmolLM, whose digit split is a separate step).
const char* pre_tokenizer_regex(PreTokenizer pre);

// Splits text into pre-tokens (views into text), appended to words in order; together they cover text exactly.
void pretokenize(std::string_view text, PreTokenizer pre, std::vector<std::string_view>& words);

}  // namespace lowbit::tok
