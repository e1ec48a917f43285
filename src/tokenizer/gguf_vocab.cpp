#include "tokenizer/gguf_vocab.h"

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit {

VocabData vocab_from_gguf(const GgufFile& gguf) {
  const std::string& path = gguf.path();
  const std::string model = gguf.get_string("tokenizer.ggml.model");
  VocabData v;
  if (model == "llama") {
    v.kind = TokenizerKind::SentencePieceBpe;
  } else if (model == "gpt2") {
    v.kind = TokenizerKind::ByteLevelBpe;
  } else {
    fail(path, ": unsupported tokenizer model \"", model, "\" (supported: llama, gpt2)");
  }
  v.tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  const auto n = static_cast<int64_t>(v.tokens.size());
  LOWBIT_CHECK(n > 0, path, ": tokenizer.ggml.tokens is empty");

  if (gguf.has("tokenizer.ggml.scores")) {
    const auto& s = gguf.get_float_array("tokenizer.ggml.scores");
    LOWBIT_CHECK(static_cast<int64_t>(s.size()) == n, path, ": ", s.size(), " tokenizer scores for ", n, " tokens");
    v.scores.assign(s.begin(), s.end());
  } else {
    LOWBIT_CHECK(v.kind != TokenizerKind::SentencePieceBpe, path,
                 ": tokenizer.ggml.scores missing (a llama vocabulary needs them)");
  }
  if (gguf.has("tokenizer.ggml.token_type")) {
    const auto& t = gguf.get_int_array("tokenizer.ggml.token_type");
    LOWBIT_CHECK(static_cast<int64_t>(t.size()) == n, path, ": ", t.size(), " token types for ", n, " tokens");
    v.types.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      LOWBIT_CHECK(t[i] >= 1 && t[i] <= 6, path, ": token ", i, " has invalid type ", t[i]);
      v.types.push_back(static_cast<TokenType>(t[i]));
    }
  }
  if (v.kind == TokenizerKind::ByteLevelBpe) {
    v.merges = gguf.get_string_array("tokenizer.ggml.merges");
    // llama.cpp treats a missing pre as "default"; the GPT-2 pattern is what those vocabularies were made with.
    v.pre = tok::canonical_pre_name(gguf.get_string_or("tokenizer.ggml.pre", "gpt2"));
    v.ignore_merges = v.pre == "llama3";  // llama.cpp and HF's Llama-3 tokenizer.json both do this
  }

  // llama.cpp's defaults when a key is absent: sentencepiece vocabularies have <unk>=0, <s>=1, </s>=2 and add
  // BOS; byte-level ones name their special tokens explicitly.
  const bool spm = v.kind == TokenizerKind::SentencePieceBpe;
  auto id = [&](const char* key, int64_t def) -> int32_t {
    int64_t x = gguf.get_int_or(key, def);
    if (x >= n) x = -1;  // some converters write ids past the vocabulary for "none"; llama.cpp ignores them too
    LOWBIT_CHECK(x >= -1, path, ": ", key, " = ", x, " is not a token id");
    return static_cast<int32_t>(x);
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  v.eos_id = id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  v.unk_id = id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  v.pad_id = id("tokenizer.ggml.padding_token_id", -1);
  v.add_bos = gguf.get_bool_or("tokenizer.ggml.add_bos_token", spm);
  v.add_space_prefix = gguf.get_bool_or("tokenizer.ggml.add_space_prefix", true);
  v.chat_template = gguf.get_string_or("tokenizer.chat_template", "");
  return v;
}

}  // namespace lowbit
