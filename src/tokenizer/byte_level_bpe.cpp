// Byte-level BPE with ranked merges (GPT-2 family: tokenizer.json BPE + ByteLevel, GGUF "gpt2" vocab).
//
// encode(text):
//   1. Added tokens are cut out of the raw text first: control tokens only with parse_special, user-defined
//      tokens always (Hugging Face matches both kinds of added token unless special splitting is asked for).
//   2. Each text fragment is split by the regex pre-tokenizer (pretokenize.h) into words.
//   3. A word's bytes start as one symbol each (the tokens of the GPT-2 byte-to-unicode characters); the
//      adjacent pair with the lowest merge rank is merged until no pair has a merge (ties: leftmost).
//      Llama-3 vocabularies skip the merges when the whole word is a token (HF "ignore_merges").
//   4. Words repeat a lot in text, so results are cached per word.
#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit::tok {

namespace {

constexpr size_t kMaxCachedWords = 1 << 17;    // ~10 MB of cache at worst; cleared wholesale when full
constexpr size_t kMaxCachedWordBytes = 256;    // longer words are rare and would bloat the cache

// Lets the word cache be probed with a string_view (no allocation per word on a hit).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class ByteLevelBpeTokenizer final : public VocabTokenizer {
 public:
  explicit ByteLevelBpeTokenizer(VocabData v);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_bytes(int32_t id, bool render_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool render_special) const override;

  TokenizerKind kind() const override { return TokenizerKind::ByteLevelBpe; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  PreTokenizer pre_;
  std::unordered_map<uint64_t, Merge> merges_;               // (left id, right id) -> rank and result
  std::array<int32_t, 256> byte_ids_{};                       // byte -> token of its mapped character
  std::vector<std::string> bytes_;                            // id -> output bytes (control tokens: "")
  SpecialTokenMatcher special_;
  mutable std::mutex cache_mu_;
  // raw word bytes -> ids
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(VocabData v)
    : VocabTokenizer(std::move(v)), pre_(pre_tokenizer_from_name(canonical_pre_name(v_.pre))) {
  const auto n = static_cast<int32_t>(v_.tokens.size());
  bytes_.resize(v_.tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = v_.tokens[static_cast<size_t>(id)];
    const TokenType t = type_of(v_, id);
    if (t == TokenType::Control) {
      special_.add(p, id, /*always=*/false);
      continue;
    }
    if (t == TokenType::UserDefined) {
      // Added tokens are stored as raw text, not in the byte alphabet.
      special_.add(p, id, /*always=*/true);
      bytes_[static_cast<size_t>(id)] = p;
      continue;
    }
    std::string& out = bytes_[static_cast<size_t>(id)];
    for (size_t i = 0; i < p.size();) {
      size_t len;
      uint32_t cp = utf8_decode(p, i, &len);
      int b = unicode_to_byte(cp);
      if (b >= 0) out += static_cast<char>(b);
      else out.append(p, i, len);  // not in the byte alphabet: keep the character as it is
      i += len;
    }
  }
  special_.finish();

  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append(ch, byte_to_unicode(static_cast<uint8_t>(b)));
    auto it = piece_ids_.find(ch);
    byte_ids_[static_cast<size_t>(b)] = it == piece_ids_.end() ? -1 : it->second;
  }

  merges_.reserve(v_.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < v_.merges.size(); ++rank) {
    const std::string& m = v_.merges[rank];
    // Byte-level pieces never hold a raw space (it maps to 'Ġ'), so the first space separates the pair.
    size_t sp = m.find(' ', 1);
    LOWBIT_CHECK(sp != std::string::npos && sp + 1 < m.size(), "tokenizer: merge ", rank, " \"", m,
                 "\" is not two pieces separated by a space");
    std::string_view a = std::string_view(m).substr(0, sp), b = std::string_view(m).substr(sp + 1);
    joined.assign(a);
    joined.append(b);
    auto ia = piece_ids_.find(a), ib = piece_ids_.find(b), ij = piece_ids_.find(joined);
    LOWBIT_CHECK(ia != piece_ids_.end() && ib != piece_ids_.end() && ij != piece_ids_.end(), "tokenizer: merge ",
                 rank, " \"", m, "\" uses or makes a piece that is not in the vocabulary");
    merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), ij->second});
  }
}

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && v_.bos_id >= 0) out.push_back(v_.bos_id);
  std::vector<Fragment> fragments;
  special_.split(text, parse_special, fragments);
  std::vector<std::string_view> words;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    words.clear();
    pretokenize(text.substr(f.begin, f.end - f.begin), pre_, words);
    for (std::string_view w : words) encode_word(w, out);
  }
  return out;
}

void ByteLevelBpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  if (v_.ignore_merges) {
    auto it = piece_ids_.find(bytes_to_unicode_string(word));
    if (it != piece_ids_.end() && type_of(v_, it->second) == TokenType::Normal) ids.push_back(it->second);
  }
  if (ids.empty()) merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCachedWords) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void ByteLevelBpeTokenizer::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  // Symbols never move, so a pair's left index orders pairs by position (the tie-break). Merged-away symbols
  // get id -1; a heap entry is stale once either of its symbols changed.
  struct Symbol {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, left, right, left_id, right_id, merged;
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.clear();
  heap.clear();
  for (char ch : word) {
    const auto k = static_cast<int32_t>(sym.size());
    const int32_t id = byte_ids_[static_cast<uint8_t>(ch)];
    // A byte the vocabulary has no token for is dropped, as HF's BPE does without an unk_token (SmolLM2 lacks
    // 21 bytes, e.g. 0x04 and 0xC0). Its GGUF names <|endoftext|> as "unknown", which must not appear mid-text.
    if (id < 0) continue;
    sym.push_back({id, k - 1, k + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  auto try_pair = [&](int32_t left, int32_t right) {
    const int32_t a = sym[static_cast<size_t>(left)].id, b = sym[static_cast<size_t>(right)].id;
    auto it = merges_.find(pair_key(a, b));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, right, a, b, it->second.id});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) try_pair(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& a = sym[static_cast<size_t>(c.left)];
    Symbol& b = sym[static_cast<size_t>(c.right)];
    if (a.id != c.left_id || b.id != c.right_id || a.next != c.right) continue;  // stale
    a.id = c.merged;
    b.id = -1;
    a.next = b.next;
    if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = c.left;
    if (a.prev >= 0) try_pair(a.prev, c.left);
    if (a.next >= 0) try_pair(c.left, a.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) ids.push_back(sym[static_cast<size_t>(i)].id);
}

std::string ByteLevelBpeTokenizer::token_bytes(int32_t id, bool render_special) const {
  LOWBIT_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " outside the vocabulary of ",
               vocab_size());
  if (render_special && type_of(v_, id) == TokenType::Control) return v_.tokens[static_cast<size_t>(id)];
  return bytes_[static_cast<size_t>(id)];
}

std::string ByteLevelBpeTokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id, render_special);
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_level_bpe(VocabData vocab) {
  return std::make_unique<ByteLevelBpeTokenizer>(std::move(vocab));
}

}  // namespace lowbit::tok
