// Internals shared by the tokenizer implementations and the file readers/writers; not part of the public API.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lowbit::tok {

// ---- UTF-8 -------------------------------------------------------------------------------------------------
// Length of the UTF-8 sequence that starts with lead byte b (1..4). Continuation bytes and 0xF8..0xFF count as
// one-byte "characters" so malformed text still advances byte by byte (and then falls back to byte tokens).
inline size_t utf8_len(uint8_t b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}
// Decodes the character at s[i]; *len receives its byte length (clamped to the end of s, never 0).
// Malformed sequences decode to U+FFFD with *len = 1.
uint32_t utf8_decode(std::string_view s, size_t i, size_t* len);
void utf8_append(std::string& out, uint32_t cp);

// ---- GPT-2 byte <-> unicode mapping (byte-level BPE) -------------------------------------------------------
// Printable bytes map to themselves; the other 68 bytes map to U+0100.. in byte order, so every byte string
// becomes a printable string (space -> 'Ġ' U+0120, '\n' -> 'Ċ' U+010A).
uint32_t byte_to_unicode(uint8_t b);
int unicode_to_byte(uint32_t cp);  // -1 when cp is not in the image of byte_to_unicode
std::string bytes_to_unicode_string(std::string_view bytes);

// ---- spm helpers -------------------------------------------------------------------------------------------
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 '▁', sentencepiece's visible space
// "<0x41>" -> 0x41; -1 when the piece is not a byte-fallback piece.
int parse_byte_piece(std::string_view piece);
std::string byte_piece(uint8_t b);  // 0x41 -> "<0x41>"

// ---- special / added tokens in text ------------------------------------------------------------------------
// A piece of the input: either raw text [begin, end) or one special token.
struct Fragment {
  size_t begin = 0, end = 0;
  int32_t token = -1;  // >= 0: a matched special token
};

// Finds special-token strings in text, leftmost first and longest at a position (the Hugging Face
// added-vocabulary rule), so "<|im_start|>" wins over a shorter token that is its prefix.
class SpecialTokenMatcher {
 public:
  // always = matched even when parse_special is false (user-defined tokens are ordinary text to the model).
  void add(const std::string& text, int32_t id, bool always);
  void finish();  // call once after the last add(), before split()
  bool empty() const { return entries_.empty(); }
  // Appends fragments covering all of text, in order; text fragments are never empty.
  void split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  struct Entry {
    std::string text;
    int32_t id;
    bool always;
  };
  std::vector<Entry> entries_;                    // sorted by length, longest first
  std::array<std::vector<uint32_t>, 256> by_first_byte_{};  // indices into entries_, longest first
};

// ---- vocabulary checks ---------------------------------------------------------------------------------------
TokenType type_of(const VocabData& v, int32_t id);
// Validates sizes and ids once at construction; errors start with "tokenizer: ".
void validate_vocab(const VocabData& v);

// Pre-tokenizer names accepted for byte-level vocabularies mapped to the canonical ones
// ("gpt2", "smollm", "llama3", "qwen2"); fails with the list of supported names otherwise.
std::string canonical_pre_name(const std::string& name);

// The vocabulary side both algorithms share: the pieces and the piece -> id index (first id wins).
class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(VocabData v);
  int32_t vocab_size() const override { return static_cast<int32_t>(v_.tokens.size()); }
  const std::string& piece(int32_t id) const override;
  int32_t piece_to_id(std::string_view piece) const override;
  const VocabData& vocab() const override { return v_; }

 protected:
  VocabData v_;
  std::unordered_map<std::string_view, int32_t> piece_ids_;  // views into v_.tokens
};

std::unique_ptr<Tokenizer> make_spm_bpe(VocabData vocab);
std::unique_ptr<Tokenizer> make_byte_level_bpe(VocabData vocab);

}  // namespace lowbit::tok
