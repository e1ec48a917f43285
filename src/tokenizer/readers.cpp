// Readers for the binary tokenizer files: llama2.c tokenizer.bin and sentencepiece tokenizer.model.
// Both produce a SentencePiece-style vocabulary with '▁' for spaces, so one tokenizer serves both.
#include <cstring>

#include "core/error.h"
#include "core/mmap_file.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit {

// ---- llama2.c tokenizer.bin ----------------------------------------------------------------------------------
// Layout (little endian): int32 max_token_length, then per token: float32 score, int32 length, length bytes.
// llama2.c's exporter wrote sentencepiece pieces with '▁' turned into ' ' and BOS/EOS as "\n<s>\n" / "\n</s>\n";
// we undo both so the vocabulary reads like every other sentencepiece vocabulary (and a tokenizer.json written
// from it looks like a Llama one). llama2.c fixes UNK=0, BOS=1, EOS=2 and byte pieces <0x00>..<0xFF>.
VocabData read_llama2c_tokenizer(const std::string& path, int32_t vocab_size) {
  auto file = MappedFile::open(path);
  const uint8_t* d = file->data();
  const size_t size = file->size();
  auto read_i32 = [&](size_t off) {
    int32_t v;
    std::memcpy(&v, d + off, 4);
    return v;
  };
  LOWBIT_CHECK(size >= 4, path, ": too short for a llama2.c tokenizer (", size, " bytes)");
  const int32_t max_len = read_i32(0);
  LOWBIT_CHECK(max_len > 0 && max_len < (1 << 20), path, ": invalid max token length ", max_len,
               " (not a llama2.c tokenizer?)");

  VocabData v;
  v.kind = TokenizerKind::SentencePieceBpe;
  size_t off = 4;
  for (int32_t i = 0; vocab_size <= 0 ? off < size : i < vocab_size; ++i) {
    LOWBIT_CHECK(file->in_bounds(off, 8), path, ": truncated at token ", i, " of ", vocab_size);
    float score;
    std::memcpy(&score, d + off, 4);
    const int32_t len = read_i32(off + 4);
    off += 8;
    LOWBIT_CHECK(len >= 0 && len <= max_len, path, ": token ", i, " has length ", len, " (max ", max_len, ")");
    LOWBIT_CHECK(file->in_bounds(off, static_cast<uint64_t>(len)), path, ": truncated at token ", i, " of ",
                 vocab_size);
    std::string raw(reinterpret_cast<const char*>(d + off), static_cast<size_t>(len));
    off += static_cast<size_t>(len);

    std::string piece;
    TokenType type = TokenType::Normal;
    if (i == 0) {
      type = TokenType::Unknown;
      piece = raw;
    } else if (i == 1 || i == 2) {
      type = TokenType::Control;
      piece = i == 1 ? "<s>" : "</s>";
    } else if (tok::parse_byte_piece(raw) >= 0) {
      type = TokenType::Byte;
      piece = raw;
    } else {
      for (char ch : raw) {
        if (ch == ' ') piece += tok::kSpmSpace;
        else piece += ch;
      }
    }
    v.tokens.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(type);
  }
  LOWBIT_CHECK(v.tokens.size() > 2, path, ": only ", v.tokens.size(), " tokens");
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;  // llama2.c always starts a prompt with BOS
  v.add_space_prefix = true;
  return v;
}

// ---- sentencepiece tokenizer.model ------------------------------------------------------------------------------
// A serialized sentencepiece ModelProto (protobuf). We read only the fields that decide encoding:
//   ModelProto      1: repeated SentencePiece pieces, 2: TrainerSpec, 3: NormalizerSpec
//   SentencePiece   1: piece (string), 2: score (float), 3: type (enum, same numbers as TokenType)
//   TrainerSpec     3: model_type (1 unigram, 2 bpe, 3 word, 4 char), 24: treat_whitespace_as_suffix,
//                   40..43: unk/bos/eos/pad id
//   NormalizerSpec  1: name, 3: add_dummy_prefix, 4: remove_extra_whitespaces, 5: escape_whitespaces
namespace {

class ProtoReader {
 public:
  ProtoReader(const std::string& path, const uint8_t* p, size_t n) : path_(path), p_(p), end_(p + n) {}
  bool done() const { return p_ >= end_; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      LOWBIT_CHECK(p_ < end_, path_, ": truncated protobuf varint (not a sentencepiece model?)");
      const uint8_t b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (b < 0x80) return v;
    }
    fail(path_, ": invalid protobuf varint (not a sentencepiece model?)");
  }
  // Reads a field key; returns the field number and sets wire type.
  uint32_t key(uint32_t* wire) {
    uint64_t k = varint();
    *wire = static_cast<uint32_t>(k & 7);
    return static_cast<uint32_t>(k >> 3);
  }
  ProtoReader sub() {  // a length-delimited field as its own reader
    uint64_t len = varint();
    LOWBIT_CHECK(len <= static_cast<uint64_t>(end_ - p_), path_, ": protobuf field runs past the end of the file");
    ProtoReader r(path_, p_, static_cast<size_t>(len));
    p_ += len;
    return r;
  }
  std::string bytes() {
    ProtoReader r = sub();
    return std::string(reinterpret_cast<const char*>(r.p_), static_cast<size_t>(r.end_ - r.p_));
  }
  float fixed32_float() {
    LOWBIT_CHECK(end_ - p_ >= 4, path_, ": truncated protobuf float");
    float f;
    std::memcpy(&f, p_, 4);
    p_ += 4;
    return f;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1: advance(8); return;
      case 2: sub(); return;
      case 5: advance(4); return;
      default: fail(path_, ": unsupported protobuf wire type ", wire, " (not a sentencepiece model?)");
    }
  }

 private:
  void advance(size_t n) {
    LOWBIT_CHECK(static_cast<size_t>(end_ - p_) >= n, path_, ": truncated protobuf field");
    p_ += n;
  }
  const std::string& path_;
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace

VocabData read_sentencepiece_model(const std::string& path) {
  auto file = MappedFile::open(path);
  ProtoReader top(path, file->data(), file->size());
  VocabData v;
  v.kind = TokenizerKind::SentencePieceBpe;
  int64_t model_type = 1;  // protobuf defaults, used when the field is absent
  int64_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  bool whitespace_suffix = false;
  std::string normalizer = "";
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  auto as_i32 = [](uint64_t x) { return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(x))); };

  while (!top.done()) {
    uint32_t wire;
    const uint32_t field = top.key(&wire);
    if (field == 1 && wire == 2) {
      ProtoReader sp = top.sub();
      std::string piece;
      float score = 0.0f;
      int64_t type = 1;
      while (!sp.done()) {
        uint32_t w;
        const uint32_t f = sp.key(&w);
        if (f == 1 && w == 2) piece = sp.bytes();
        else if (f == 2 && w == 5) score = sp.fixed32_float();
        else if (f == 3 && w == 0) type = static_cast<int64_t>(sp.varint());
        else sp.skip(w);
      }
      LOWBIT_CHECK(type >= 1 && type <= 6, path, ": piece ", v.tokens.size(), " has invalid type ", type);
      v.tokens.push_back(std::move(piece));
      v.scores.push_back(score);
      v.types.push_back(static_cast<TokenType>(type));
    } else if (field == 2 && wire == 2) {
      ProtoReader ts = top.sub();
      while (!ts.done()) {
        uint32_t w;
        const uint32_t f = ts.key(&w);
        if (w != 0) {
          ts.skip(w);
          continue;
        }
        const uint64_t x = ts.varint();
        if (f == 3) model_type = static_cast<int64_t>(x);
        else if (f == 24) whitespace_suffix = x != 0;
        else if (f == 40) unk_id = as_i32(x);
        else if (f == 41) bos_id = as_i32(x);
        else if (f == 42) eos_id = as_i32(x);
        else if (f == 43) pad_id = as_i32(x);
      }
    } else if (field == 3 && wire == 2) {
      ProtoReader ns = top.sub();
      while (!ns.done()) {
        uint32_t w;
        const uint32_t f = ns.key(&w);
        if (f == 1 && w == 2) normalizer = ns.bytes();
        else if (f == 3 && w == 0) add_dummy_prefix = ns.varint() != 0;
        else if (f == 4 && w == 0) remove_extra_whitespaces = ns.varint() != 0;
        else if (f == 5 && w == 0) escape_whitespaces = ns.varint() != 0;
        else ns.skip(w);
      }
    } else {
      top.skip(wire);
    }
  }

  LOWBIT_CHECK(!v.tokens.empty(), path, ": no pieces (not a sentencepiece model?)");
  static const char* kModelTypes[] = {"?", "unigram", "bpe", "word", "char"};
  LOWBIT_CHECK(model_type == 2, path, ": unsupported sentencepiece model type ",
               model_type >= 1 && model_type <= 4 ? kModelTypes[model_type] : "?", " (only bpe)");
  // Other normalizers (nmt_nfkc, ...) rewrite the text through a compiled character map before encoding;
  // we do not implement that, so refuse rather than encode differently.
  LOWBIT_CHECK(normalizer.empty() || normalizer == "identity", path, ": unsupported sentencepiece normalizer \"",
               normalizer, "\" (only identity)");
  LOWBIT_CHECK(!remove_extra_whitespaces, path,
               ": unsupported sentencepiece option remove_extra_whitespaces=true (Llama-style models set false)");
  LOWBIT_CHECK(escape_whitespaces && !whitespace_suffix, path,
               ": unsupported sentencepiece whitespace handling (needs escape_whitespaces, no suffix '▁')");
  const auto n = static_cast<int64_t>(v.tokens.size());
  auto id_or_none = [&](int64_t id, const char* what) -> int32_t {
    LOWBIT_CHECK(id >= -1 && id < n, path, ": ", what, " id ", id, " outside the ", n, " pieces");
    return static_cast<int32_t>(id);
  };
  v.unk_id = id_or_none(unk_id, "unk");
  v.bos_id = id_or_none(bos_id, "bos");
  v.eos_id = id_or_none(eos_id, "eos");
  v.pad_id = id_or_none(pad_id, "pad");
  v.add_space_prefix = add_dummy_prefix;
  v.add_bos = v.bos_id >= 0;  // the Llama convention (and llama.cpp's default for sentencepiece vocabularies)
  return v;
}

}  // namespace lowbit
