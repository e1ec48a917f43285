// Tokenizers. Three algorithms behind one interface:
//   - SentencePiece-style BPE with scores (llama2.c tokenizer.bin, GGUF "llama" vocab, SentencePiece tokenizer.model):
//     byte fallback <0xXX>, dummy-prefix space, '▁' for spaces, merge of the best-scoring adjacent pair.
//   - byte-level BPE with ranked merges (tokenizer.json "BPE" with ByteLevel pre-tokenizer, GGUF "gpt2" vocab):
//     regex pre-tokenizer split, bytes mapped to printable unicode, lowest-rank merge first.
// Both honour special/added tokens in the text (matched before the split) when parse_special is true.
// Construction goes through VocabData, so the file readers (GGUF, tokenizer.json, ...) only fill a struct.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lowbit {

enum class TokenizerKind { SentencePieceBpe, ByteLevelBpe };

// GGUF token types (tokenizer.ggml.token_type), also used for the other sources.
enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct VocabData {
  TokenizerKind kind = TokenizerKind::SentencePieceBpe;
  std::string pre;                     // byte-level pre-tokenizer name ("gpt2", "smollm", "llama3", "qwen2", ...)
  std::vector<std::string> tokens;     // id -> piece as stored (spm: with '▁'; byte-level: byte-to-unicode mapped)
  std::vector<float> scores;           // spm merge priorities (empty for byte-level)
  std::vector<TokenType> types;        // empty = all Normal
  std::vector<std::string> merges;     // byte-level: "a b" in rank order
  bool ignore_merges = false;          // byte-level: a word that is itself a token skips the merges (HF
                                       // "ignore_merges"; Llama-3 vocabularies set it)
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false;                // prepend BOS in encode(text, /*add_bos=*/default)
  bool add_space_prefix = true;        // spm: prepend a space (dummy prefix) before encoding
  // spm: where the dummy prefix goes. Default (sentencepiece, llama.cpp, HF Prepend normalizer): every text
  // fragment, i.e. the text start and the text after each control token. HF's Metaspace pre-tokenizer instead
  // never prefixes text that already starts with a space, and with prepend_scheme "first" only the text at
  // offset 0 of the input.
  bool space_prefix_first_only = false;
  bool space_prefix_unless_space = false;
  std::string chat_template;           // jinja source when the file carries one
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encode text to ids. add_bos prepends BOS (when the vocab has one); parse_special turns special-token
  // strings in the text (e.g. "<|im_start|>") into their ids instead of encoding their characters.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const = 0;
  // Bytes of one token as it appears in output text (byte fallback / byte-level mapping undone).
  // Control tokens (BOS/EOS/...) decode to "" unless render_special.
  virtual std::string token_bytes(int32_t id, bool render_special = false) const = 0;
  // decode(encode(s, ...)) == s. Drops the spm dummy-prefix space of the first token.
  virtual std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const = 0;

  virtual TokenizerKind kind() const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual const std::string& piece(int32_t id) const = 0;  // the stored piece (for inspect / convert)
  virtual int32_t piece_to_id(std::string_view piece) const = 0;  // -1 when absent
  virtual const VocabData& vocab() const = 0;               // the data it was built from (for convert)

  int32_t bos_id() const { return vocab().bos_id; }
  int32_t eos_id() const { return vocab().eos_id; }
  bool add_bos_default() const { return vocab().add_bos; }
};

std::unique_ptr<Tokenizer> make_tokenizer(VocabData vocab);

// Readers for standalone tokenizer files. Errors name the file and the problem.
// llama2.c tokenizer.bin / tok512.bin. The file has no token count: vocab_size comes from the model header
// (vocab_size <= 0 reads every token up to the end of the file).
VocabData read_llama2c_tokenizer(const std::string& path, int32_t vocab_size);
VocabData read_tokenizer_json(const std::string& tokenizer_json_path,
                              const std::string& tokenizer_config_json_path /* may be "" */);
VocabData read_sentencepiece_model(const std::string& tokenizer_model_path);     // tokenizer.model
// Writes tokenizer.json (+ tokenizer_config.json) that Hugging Face `tokenizers` loads with identical ids.
void write_tokenizer_json(const VocabData& vocab, const std::string& out_dir);

}  // namespace lowbit
