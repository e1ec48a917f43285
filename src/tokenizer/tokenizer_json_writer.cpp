// write_tokenizer_json: a tokenizer.json + tokenizer_config.json that Hugging Face `tokenizers` / transformers
// load and encode like our tokenizer does.
//   - byte-level vocabularies: BPE(vocab, merges) with the pre-tokenizer chain HF uses for the same pattern
//     (ByteLevel(use_regex) for gpt2, Digits+ByteLevel for smollm, Split(regex)+ByteLevel for llama3/qwen2) and
//     the ByteLevel decoder.
//   - sentencepiece-score vocabularies: the Llama-style BPE with byte_fallback. HF's BPE needs ranked merges,
//     so every split (a, b) of a piece p into two pieces becomes a merge, ranked by p's score (best first).
//     Picking the lowest-rank adjacent pair then picks the pair whose merged piece scores best, as sentencepiece
//     does. (Only the tie-break between two different splits of one piece that are adjacent at the same time,
//     "ab|a|ba", can differ: we take the leftmost, HF the lower rank. Real text hardly ever shows it.)
//     User-defined tokens are written as added tokens matched on the raw text, which splits the text around
//     them like llama.cpp; sentencepiece keeps them inside its dummy-prefix text (see spm_bpe.cpp).
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/atomic_write.h"
#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit {

namespace {

using ojson = nlohmann::ordered_json;  // keeps the keys in the order HF writes them, for readable diffs

ojson byte_level_node(bool use_regex) {
  return ojson{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

ojson byte_level_pre_tokenizer(const std::string& canonical_pre) {
  const tok::PreTokenizer pre = tok::pre_tokenizer_from_name(canonical_pre);
  switch (pre) {
    case tok::PreTokenizer::Gpt2:
      return byte_level_node(true);  // ByteLevel's built-in regex is the GPT-2 pattern
    case tok::PreTokenizer::SmolLM:
      return ojson{{"type", "Sequence"},
                   {"pretokenizers", ojson::array({ojson{{"type", "Digits"}, {"individual_digits", true}},
                                                   byte_level_node(true)})}};
    case tok::PreTokenizer::Llama3:
    case tok::PreTokenizer::Qwen2:
      return ojson{{"type", "Sequence"},
                   {"pretokenizers",
                    ojson::array({ojson{{"type", "Split"},
                                        {"pattern", {{"Regex", tok::pre_tokenizer_regex(pre)}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                  byte_level_node(false)})}};
  }
  fail("tokenizer: unsupported pre-tokenizer ", canonical_pre);
}

// Merges for a sentencepiece-score vocabulary, best first (see the file comment).
std::vector<std::pair<std::string, std::string>> merges_from_scores(const VocabData& v) {
  std::unordered_map<std::string_view, int32_t> normal;  // pieces that take part in merges
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (tok::type_of(v, static_cast<int32_t>(id)) == TokenType::Normal) normal.emplace(v.tokens[id], id);
  }
  struct Merge {
    float score;
    int32_t piece_id;
    size_t left_len;
  };
  std::vector<Merge> found;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (tok::type_of(v, static_cast<int32_t>(id)) != TokenType::Normal) continue;
    const std::string& p = v.tokens[id];
    if (normal.at(p) != static_cast<int32_t>(id)) continue;  // a duplicate piece: the first id is the one used
    for (size_t cut = tok::utf8_len(static_cast<uint8_t>(p[0])); cut < p.size();
         cut += tok::utf8_len(static_cast<uint8_t>(p[cut]))) {
      if (normal.count(std::string_view(p).substr(0, cut)) && normal.count(std::string_view(p).substr(cut))) {
        found.push_back({v.scores[id], static_cast<int32_t>(id), cut});
      }
    }
  }
  std::stable_sort(found.begin(), found.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.piece_id != b.piece_id) return a.piece_id < b.piece_id;
    return a.left_len < b.left_len;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(found.size());
  for (const Merge& m : found) {
    const std::string& p = v.tokens[static_cast<size_t>(m.piece_id)];
    out.emplace_back(p.substr(0, m.left_len), p.substr(m.left_len));
  }
  return out;
}

ojson bos_template(const VocabData& v) {
  const std::string& bos = v.tokens[static_cast<size_t>(v.bos_id)];
  auto special = [&](int type_id) { return ojson{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}}; };
  auto seq = [](const char* id, int type_id) { return ojson{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  return ojson{{"type", "TemplateProcessing"},
               {"single", ojson::array({special(0), seq("A", 0)})},
               {"pair", ojson::array({special(0), seq("A", 0), special(1), seq("B", 1)})},
               {"special_tokens", {{bos, {{"id", bos}, {"ids", ojson::array({v.bos_id})}, {"tokens", {bos}}}}}}};
}

}  // namespace

void write_tokenizer_json(const VocabData& v, const std::string& out_dir) {
  tok::validate_vocab(v);
  const bool byte_level = v.kind == TokenizerKind::ByteLevelBpe;

  ojson added = ojson::array();
  ojson vocab = ojson::object();
  std::unordered_map<std::string_view, size_t> seen;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& p = v.tokens[id];
    auto [it, fresh] = seen.emplace(p, id);
    LOWBIT_CHECK(fresh, out_dir, ": cannot write tokenizer.json: piece \"", p, "\" has two ids (", it->second, " and ",
                 id, ")");
    vocab[p] = id;
    const TokenType t = tok::type_of(v, static_cast<int32_t>(id));
    const bool special = t == TokenType::Control || t == TokenType::Unknown;
    if (special || t == TokenType::UserDefined) {
      added.push_back({{"id", id}, {"content", p}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", special}});
    }
  }

  ojson model{{"type", "BPE"}, {"dropout", nullptr}};
  ojson j{{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  ojson merges = ojson::array();
  if (byte_level) {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = byte_level_pre_tokenizer(tok::canonical_pre_name(v.pre));
    for (const std::string& m : v.merges) {
      size_t sp = m.find(' ', 1);
      LOWBIT_CHECK(sp != std::string::npos, out_dir, ": cannot write tokenizer.json: merge \"", m,
                   "\" is not two pieces");
      merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
    }
    model["unk_token"] = nullptr;
    model["byte_fallback"] = false;
    model["ignore_merges"] = v.ignore_merges;
  } else {
    ojson replace{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", tok::kSpmSpace}};
    if (!v.add_space_prefix) {
      j["normalizer"] = replace;
      j["pre_tokenizer"] = nullptr;
    } else if (!v.space_prefix_first_only && !v.space_prefix_unless_space) {  // sentencepiece's rule
      j["normalizer"] = ojson{{"type", "Sequence"},
                              {"normalizers",
                               ojson::array({ojson{{"type", "Prepend"}, {"prepend", tok::kSpmSpace}}, replace})}};
      j["pre_tokenizer"] = nullptr;
    } else {  // HF Metaspace's rules (see VocabData)
      LOWBIT_CHECK(v.space_prefix_unless_space, out_dir,
                   ": cannot write tokenizer.json: space_prefix_first_only without space_prefix_unless_space");
      j["normalizer"] = nullptr;
      j["pre_tokenizer"] = ojson{{"type", "Metaspace"}, {"replacement", tok::kSpmSpace},
                                 {"prepend_scheme", v.space_prefix_first_only ? "first" : "always"}, {"split", false}};
    }
    for (auto& [a, b] : merges_from_scores(v)) merges.push_back({a, b});
    model["unk_token"] = v.unk_id >= 0 ? ojson(v.tokens[static_cast<size_t>(v.unk_id)]) : ojson(nullptr);
    model["byte_fallback"] = true;
    model["ignore_merges"] = false;
  }
  j["post_processor"] = v.add_bos && v.bos_id >= 0 ? bos_template(v) : ojson(nullptr);
  if (byte_level) {
    j["decoder"] = ojson{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    ojson steps = ojson::array({ojson{{"type", "Replace"}, {"pattern", {{"String", tok::kSpmSpace}}}, {"content", " "}},
                                ojson{{"type", "ByteFallback"}}, ojson{{"type", "Fuse"}}});
    if (v.add_space_prefix) steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = ojson{{"type", "Sequence"}, {"decoders", steps}};
  }
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = !byte_level;
  model["vocab"] = std::move(vocab);
  model["merges"] = std::move(merges);
  j["model"] = std::move(model);

  auto piece_or_null = [&](int32_t id) {
    return id >= 0 ? ojson(v.tokens[static_cast<size_t>(id)]) : ojson(nullptr);
  };
  ojson config{{"tokenizer_class", "PreTrainedTokenizerFast"},
               {"add_bos_token", v.add_bos},
               {"add_eos_token", false},
               {"bos_token", piece_or_null(v.bos_id)},
               {"eos_token", piece_or_null(v.eos_id)},
               {"unk_token", piece_or_null(v.unk_id)},
               {"pad_token", piece_or_null(v.pad_id)},
               {"clean_up_tokenization_spaces", false}};
  if (!v.chat_template.empty()) config["chat_template"] = v.chat_template;

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  LOWBIT_CHECK(!ec, out_dir, ": cannot create directory: ", ec.message());
  std::string tokenizer_text, config_text;
  try {
    tokenizer_text = j.dump(2) + "\n";
    config_text = config.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {  // a piece that is not valid UTF-8 cannot be a JSON string
    fail(out_dir, ": cannot write tokenizer.json: ", e.what());
  }
  write_atomically((std::filesystem::path(out_dir) / "tokenizer.json").string(), tokenizer_text);
  write_atomically((std::filesystem::path(out_dir) / "tokenizer_config.json").string(), config_text);
}

}  // namespace lowbit
