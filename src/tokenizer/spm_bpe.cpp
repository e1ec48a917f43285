// SentencePiece-style BPE with scores (llama2.c tokenizer.bin, GGUF "llama" vocab, sentencepiece tokenizer.model).
//
// encode(text):
//   1. With parse_special, control tokens (<s>, </s>, <unk>, ...) are cut out of the raw text first.
//   2. Each remaining text fragment gets the dummy-prefix space (add_space_prefix) and spaces become '▁'. A
//      fragment after a control token gets its own prefix, as llama.cpp and the HF Llama normalizer do.
//   3. User-defined tokens are matched in the escaped text (always, as sentencepiece does: they are text).
//   4. The rest is split into UTF-8 characters, and the adjacent pair whose concatenation is a vocabulary piece
//      with the highest score is merged, again and again (ties: leftmost pair), with a heap of candidate pairs
//      so a 1 MB text costs O(n log n) rather than llama2.c's O(n^2) rescans. Same result: each step picks the
//      globally best pair, and stale heap entries are recognised and skipped.
//   5. A final symbol that is not a piece becomes its bytes as <0xXX> tokens (byte fallback), or <unk>.
#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit::tok {

namespace {

class SpmBpeTokenizer final : public VocabTokenizer {
 public:
  explicit SpmBpeTokenizer(VocabData v);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_bytes(int32_t id, bool render_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool render_special) const override;

  TokenizerKind kind() const override { return TokenizerKind::SentencePieceBpe; }

 private:
  void encode_escaped(std::string_view text, std::vector<int32_t>& out) const;
  void bpe(std::string_view text, std::vector<int32_t>& out) const;
  bool is_control(int32_t id) const {
    TokenType t = type_of(v_, id);
    return t == TokenType::Control || t == TokenType::Unknown;
  }

  std::unordered_map<std::string_view, int32_t> merge_ids_;  // Normal/UserDefined pieces: merge targets
  std::array<int32_t, 256> byte_ids_{};                       // byte -> <0xXX> token, -1 when absent
  bool has_byte_fallback_ = false;
  std::vector<std::string> bytes_;                            // id -> output bytes (control tokens: "")
  SpecialTokenMatcher control_;                               // control/unknown tokens, raw text
  SpecialTokenMatcher user_;                                  // user-defined tokens, escaped text
};

SpmBpeTokenizer::SpmBpeTokenizer(VocabData v) : VocabTokenizer(std::move(v)) {
  byte_ids_.fill(-1);
  const auto n = static_cast<int32_t>(v_.tokens.size());
  bytes_.resize(v_.tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = v_.tokens[static_cast<size_t>(id)];
    const TokenType t = type_of(v_, id);
    int byte = parse_byte_piece(p);
    // Vocabularies without types (none of ours today) still get byte fallback from the <0xXX> spelling.
    if (byte >= 0 && (t == TokenType::Byte || v_.types.empty())) {
      if (byte_ids_[static_cast<size_t>(byte)] < 0) byte_ids_[static_cast<size_t>(byte)] = id;
      has_byte_fallback_ = true;
      bytes_[static_cast<size_t>(id)] = std::string(1, static_cast<char>(byte));
      continue;
    }
    switch (t) {
      case TokenType::Control:
        control_.add(p, id, /*always=*/false);
        break;
      case TokenType::Unknown:
        control_.add(p, id, /*always=*/false);
        bytes_[static_cast<size_t>(id)] = p;  // visible, so lost text shows up in output
        break;
      case TokenType::UserDefined:
      case TokenType::Normal:
      case TokenType::Unused:
      case TokenType::Byte: {
        if (t == TokenType::UserDefined) user_.add(p, id, /*always=*/true);
        if (t == TokenType::UserDefined || t == TokenType::Normal) merge_ids_.emplace(p, id);
        std::string& out = bytes_[static_cast<size_t>(id)];
        for (size_t i = 0; i < p.size();) {
          if (p.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
            out += ' ';
            i += kSpmSpace.size();
          } else {
            out += p[i++];
          }
        }
        break;
      }
    }
  }
  control_.finish();
  user_.finish();
}

std::vector<int32_t> SpmBpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && v_.bos_id >= 0) out.push_back(v_.bos_id);
  std::vector<Fragment> fragments;
  control_.split(text, parse_special, fragments);
  std::string escaped;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    escaped.clear();
    bool prefix = v_.add_space_prefix;
    if (v_.space_prefix_first_only && f.begin != 0) prefix = false;
    if (v_.space_prefix_unless_space && text[f.begin] == ' ') prefix = false;
    if (prefix) escaped += kSpmSpace;
    for (size_t i = f.begin; i < f.end; ++i) {
      if (text[i] == ' ') escaped += kSpmSpace;
      else escaped += text[i];
    }
    encode_escaped(escaped, out);
  }
  return out;
}

void SpmBpeTokenizer::encode_escaped(std::string_view text, std::vector<int32_t>& out) const {
  if (user_.empty()) {
    bpe(text, out);
    return;
  }
  std::vector<Fragment> parts;
  user_.split(text, /*parse_special=*/true, parts);
  for (const Fragment& p : parts) {
    if (p.token >= 0) out.push_back(p.token);
    else bpe(text.substr(p.begin, p.end - p.begin), out);
  }
}

void SpmBpeTokenizer::bpe(std::string_view text, std::vector<int32_t>& out) const {
  // A symbol is a byte range of text; merged-away symbols have len 0. Symbols never move, so the index of a
  // pair's left symbol orders pairs by position (the tie-break).
  struct Symbol {
    uint32_t start, len;
    int32_t prev, next;
  };
  struct Candidate {
    float score;
    int32_t left, right;
    uint32_t len;  // left.len + right.len when pushed: a later change to either symbol makes this stale
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.clear();
  heap.clear();
  for (size_t i = 0; i < text.size();) {
    // Malformed UTF-8 makes one-byte symbols: a stray lead byte must not swallow the '▁' that follows it.
    size_t len;
    utf8_decode(text, i, &len);
    const auto k = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), k - 1, k + 1});
    i += len;
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  auto try_pair = [&](int32_t left, int32_t right) {
    const Symbol& a = sym[static_cast<size_t>(left)];
    const Symbol& b = sym[static_cast<size_t>(right)];
    auto it = merge_ids_.find(text.substr(a.start, a.len + b.len));
    if (it == merge_ids_.end()) return;
    heap.push_back({v_.scores[static_cast<size_t>(it->second)], left, right, a.len + b.len});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) try_pair(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& a = sym[static_cast<size_t>(c.left)];
    Symbol& b = sym[static_cast<size_t>(c.right)];
    if (a.len == 0 || b.len == 0 || a.next != c.right || a.len + b.len != c.len) continue;  // stale
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = c.left;
    if (a.prev >= 0) try_pair(a.prev, c.left);
    if (a.next >= 0) try_pair(c.left, a.next);
  }

  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    std::string_view piece = text.substr(s.start, s.len);
    auto it = merge_ids_.find(piece);
    if (it != merge_ids_.end()) {
      out.push_back(it->second);
    } else if (has_byte_fallback_) {
      for (char ch : piece) {
        int32_t id = byte_ids_[static_cast<uint8_t>(ch)];
        if (id >= 0) out.push_back(id);
        else if (v_.unk_id >= 0) out.push_back(v_.unk_id);
      }
    } else if (v_.unk_id >= 0) {
      out.push_back(v_.unk_id);  // sentencepiece without byte fallback: one <unk> per unknown symbol
    }
  }
}

std::string SpmBpeTokenizer::token_bytes(int32_t id, bool render_special) const {
  LOWBIT_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " outside the vocabulary of ",
               vocab_size());
  if (render_special && type_of(v_, id) == TokenType::Control) return v_.tokens[static_cast<size_t>(id)];
  return bytes_[static_cast<size_t>(id)];
}

std::string SpmBpeTokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  // The dummy prefix was added at the start of each text fragment (text start, or after a control token);
  // its space is dropped again there so decode(encode(s)) == s. With space_prefix_first_only only the first
  // output is stripped, as HF's Strip decoder does. (With space_prefix_unless_space, decode cannot tell " a" from
  // "a": both encode to "▁a". HF decodes that as "a", and so do we.)
  bool fragment_start = true;
  for (int32_t id : ids) {
    LOWBIT_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " outside the vocabulary of ",
                 vocab_size());
    if (is_control(id)) {
      std::string b = token_bytes(id, render_special);
      if (!v_.space_prefix_first_only) fragment_start = true;
      else if (!b.empty()) fragment_start = false;
      out += b;
      continue;
    }
    const std::string& b = bytes_[static_cast<size_t>(id)];
    if (fragment_start && v_.add_space_prefix && !b.empty() && b[0] == ' ') out.append(b, 1);
    else out += b;
    fragment_start = false;
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_spm_bpe(VocabData vocab) { return std::make_unique<SpmBpeTokenizer>(std::move(vocab)); }

}  // namespace lowbit::tok
