// Reader for Hugging Face tokenizer.json (+ tokenizer_config.json). Two shapes are recognised, anything else is
// refused with "unsupported tokenizer.json: ..." so a model never runs with a tokenizer that encodes differently:
//   - byte-level BPE: model BPE, no normalizer, pre_tokenizer = ByteLevel(use_regex) | Sequence[Digits(individual),
//     ByteLevel(use_regex)] | Sequence[Split(<known regex>), ByteLevel(use_regex=false)];
//   - Llama-style sentencepiece BPE: model BPE (byte_fallback), normalizer Prepend('▁')+Replace(' ','▁') with no
//     pre_tokenizer, or Metaspace pre_tokenizer with no normalizer. tokenizer.json has no scores, so the merge
//     ranks become scores (score = -rank of the first merge that makes the piece): the highest-score pair is then
//     the lowest-rank merge, which is what HF's BPE applies.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer_internal.h"

namespace lowbit {

namespace {

using json = nlohmann::json;

json parse_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LOWBIT_CHECK(f.good(), path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

std::string type_of_node(const json& node) {
  if (node.is_null()) return "null";
  if (node.is_object() && node.contains("type") && node["type"].is_string()) return node["type"].get<std::string>();
  return node.dump();
}

bool bool_or(const json& node, const char* key, bool def) {
  return node.is_object() && node.contains(key) && node[key].is_boolean() ? node[key].get<bool>() : def;
}

// The canonical pre-tokenizer name for a byte-level pre_tokenizer node, or "" when it is not one we know.
std::string byte_level_pre_name(const json& pre) {
  auto is_byte_level = [](const json& n, bool use_regex) {
    return type_of_node(n) == "ByteLevel" && !bool_or(n, "add_prefix_space", false) &&
           bool_or(n, "use_regex", true) == use_regex;
  };
  if (is_byte_level(pre, true)) return "gpt2";
  if (type_of_node(pre) != "Sequence" || !pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) {
    return "";
  }
  const json& seq = pre["pretokenizers"];
  if (seq.size() != 2) return "";
  if (type_of_node(seq[0]) == "Digits" && bool_or(seq[0], "individual_digits", false) && is_byte_level(seq[1], true)) {
    return "smollm";
  }
  if (type_of_node(seq[0]) == "Split" && is_byte_level(seq[1], false)) {
    const json& s = seq[0];
    if (!s.contains("pattern") || !s["pattern"].is_object() || !s["pattern"].contains("Regex")) return "";
    if (s.value("behavior", "") != "Isolated" || bool_or(s, "invert", false)) return "";
    const std::string regex = s["pattern"]["Regex"].get<std::string>();
    for (auto p : {tok::PreTokenizer::Gpt2, tok::PreTokenizer::Llama3, tok::PreTokenizer::Qwen2}) {
      if (regex == tok::pre_tokenizer_regex(p)) return tok::pre_tokenizer_name(p);
    }
  }
  return "";
}

// Does the normalizer/pre_tokenizer pair implement sentencepiece's whitespace handling? Sets the space-prefix
// fields of v.
bool is_spm_whitespace(const json& normalizer, const json& pre, VocabData* v) {
  auto is_replace_space = [](const json& n) {
    return type_of_node(n) == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
           n["pattern"].value("String", "") == " " && n.value("content", "") == tok::kSpmSpace;
  };
  auto is_prepend = [](const json& n) { return type_of_node(n) == "Prepend" && n.value("prepend", "") == tok::kSpmSpace; };
  if (pre.is_null()) {
    if (is_replace_space(normalizer)) {
      v->add_space_prefix = false;
      return true;
    }
    if (type_of_node(normalizer) == "Sequence" && normalizer.contains("normalizers")) {
      const json& seq = normalizer["normalizers"];
      if (seq.size() == 2 && is_prepend(seq[0]) && is_replace_space(seq[1])) {
        v->add_space_prefix = true;  // Prepend: every fragment, always (the legacy Llama form)
        return true;
      }
    }
    return false;
  }
  if (normalizer.is_null() && type_of_node(pre) == "Metaspace" && pre.value("replacement", "") == tok::kSpmSpace &&
      !bool_or(pre, "split", true)) {
    const std::string scheme = pre.value("prepend_scheme", bool_or(pre, "add_prefix_space", true) ? "always" : "never");
    if (scheme != "always" && scheme != "first" && scheme != "never") return false;
    v->add_space_prefix = scheme != "never";
    v->space_prefix_first_only = scheme == "first";
    v->space_prefix_unless_space = true;  // Metaspace never adds a second '▁' to text that starts with one
    return true;
  }
  return false;
}

std::string token_content(const json& node) {  // "<s>" or {"content": "<s>", ...} in tokenizer_config.json
  if (node.is_string()) return node.get<std::string>();
  if (node.is_object() && node.contains("content") && node["content"].is_string()) return node["content"];
  return "";
}

VocabData read_tokenizer_json_unchecked(const std::string& path, const std::string& config_path) {
  const json j = parse_json_file(path);
  LOWBIT_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), path,
               ": unsupported tokenizer.json: no model object");
  const json& model = j["model"];
  LOWBIT_CHECK(type_of_node(model) == "BPE", path, ": unsupported tokenizer.json: model type ",
               type_of_node(model), " (only BPE)");
  LOWBIT_CHECK(model.contains("vocab") && model["vocab"].is_object(), path,
               ": unsupported tokenizer.json: BPE model without a vocab object");
  const json normalizer = j.value("normalizer", json());
  const json pre = j.value("pre_tokenizer", json());

  VocabData v;
  const std::string pre_name = byte_level_pre_name(pre);
  if (!pre_name.empty()) {
    LOWBIT_CHECK(normalizer.is_null(), path, ": unsupported tokenizer.json: normalizer ", type_of_node(normalizer),
                 " with a byte-level pre-tokenizer");
    v.kind = TokenizerKind::ByteLevelBpe;
    v.pre = pre_name;
    v.ignore_merges = bool_or(model, "ignore_merges", false);
  } else if (is_spm_whitespace(normalizer, pre, &v)) {
    v.kind = TokenizerKind::SentencePieceBpe;
    LOWBIT_CHECK(!bool_or(model, "ignore_merges", false), path,
                 ": unsupported tokenizer.json: ignore_merges with a sentencepiece-style BPE");
  } else {
    fail(path, ": unsupported tokenizer.json: normalizer ", type_of_node(normalizer), ", pre_tokenizer ",
         type_of_node(pre), " (supported: byte-level BPE with gpt2/smollm/llama3/qwen2 splits, Llama-style BPE)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    LOWBIT_CHECK(!model.contains(key) || model[key].is_null() || model[key] == "", path,
                 ": unsupported tokenizer.json: BPE ", key);
  }

  // Tokens: the model vocab plus added tokens (which may extend it). Ids must be dense.
  std::unordered_map<std::string, int32_t> ids;
  auto put = [&](const std::string& piece, int64_t id, TokenType type) {
    LOWBIT_CHECK(id >= 0 && id < (1 << 24), path, ": token \"", piece, "\" has invalid id ", id);
    if (static_cast<size_t>(id) >= v.tokens.size()) {
      v.tokens.resize(static_cast<size_t>(id) + 1);
      v.types.resize(static_cast<size_t>(id) + 1, TokenType::Unused);
    }
    std::string& slot = v.tokens[static_cast<size_t>(id)];
    LOWBIT_CHECK(slot.empty() || slot == piece, path, ": id ", id, " is both \"", slot, "\" and \"", piece, "\"");
    slot = piece;
    v.types[static_cast<size_t>(id)] = type;
    ids.emplace(piece, static_cast<int32_t>(id));
  };
  for (const auto& [piece, id] : model["vocab"].items()) {
    LOWBIT_CHECK(id.is_number_integer(), path, ": vocab entry \"", piece, "\" has a non-integer id");
    put(piece, id.get<int64_t>(), TokenType::Normal);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& t : j["added_tokens"]) {
      LOWBIT_CHECK(t.contains("id") && t.contains("content"), path, ": added token without id/content");
      put(t["content"].get<std::string>(), t["id"].get<int64_t>(),
          bool_or(t, "special", false) ? TokenType::Control : TokenType::UserDefined);
    }
  }
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.tokens[id].empty()) v.tokens[id] = "[PAD" + std::to_string(id) + "]";  // holes: never produced
  }
  const std::string unk = model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"] : "";
  if (!unk.empty()) {
    auto it = ids.find(unk);
    LOWBIT_CHECK(it != ids.end(), path, ": unk_token \"", unk, "\" is not in the vocabulary");
    v.unk_id = it->second;
    v.types[static_cast<size_t>(v.unk_id)] = TokenType::Unknown;
  }

  // Merges: ["a b", ...] (older files) or [["a", "b"], ...].
  std::vector<std::pair<std::string, std::string>> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    for (const json& m : model["merges"]) {
      if (m.is_array() && m.size() == 2) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else if (m.is_string()) {
        const std::string s = m.get<std::string>();
        size_t sp = s.find(' ', 1);
        LOWBIT_CHECK(sp != std::string::npos, path, ": merge \"", s, "\" is not two pieces");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        fail(path, ": merge ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
  }

  if (v.kind == TokenizerKind::ByteLevelBpe) {
    for (const auto& [a, b] : merges) v.merges.push_back(a + " " + b);
  } else {
    LOWBIT_CHECK(bool_or(model, "byte_fallback", false) || v.unk_id >= 0, path,
                 ": unsupported tokenizer.json: sentencepiece-style BPE without byte_fallback or unk_token");
    for (size_t id = 0; id < v.tokens.size(); ++id) {
      if (v.types[id] == TokenType::Normal && tok::parse_byte_piece(v.tokens[id]) >= 0) v.types[id] = TokenType::Byte;
    }
    // Score = -(rank of the first merge making the piece). A multi-character piece that no merge makes is
    // unreachable in HF; it must not become a merge target here either, so it is marked Unused.
    v.scores.assign(v.tokens.size(), 0.0f);
    std::vector<bool> made(v.tokens.size(), false);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      auto it = ids.find(merges[rank].first + merges[rank].second);
      LOWBIT_CHECK(it != ids.end(), path, ": merge \"", merges[rank].first, " ", merges[rank].second,
                   "\" makes a piece that is not in the vocabulary");
      const auto id = static_cast<size_t>(it->second);
      if (!made[id]) v.scores[id] = -static_cast<float>(rank);
      made[id] = true;
    }
    for (size_t id = 0; id < v.tokens.size(); ++id) {
      const std::string& p = v.tokens[id];
      if (v.types[id] == TokenType::Normal && !made[id] && tok::utf8_len(static_cast<uint8_t>(p[0])) < p.size()) {
        v.types[id] = TokenType::Unused;
      }
    }
    // float has 24 mantissa bits: ranks above 2^24 would tie. No real vocabulary comes close.
    LOWBIT_CHECK(merges.size() < (1u << 24), path, ": too many merges (", merges.size(), ")");
  }

  // Special tokens and flags: tokenizer_config.json first, then what tokenizer.json itself implies.
  auto id_of = [&](const std::string& piece, const char* what, const std::string& file) -> int32_t {
    if (piece.empty()) return -1;
    auto it = ids.find(piece);
    LOWBIT_CHECK(it != ids.end(), file, ": ", what, " \"", piece, "\" is not in the vocabulary");
    return it->second;
  };
  bool add_bos_known = false;
  if (!config_path.empty()) {
    const json c = parse_json_file(config_path);
    LOWBIT_CHECK(c.is_object(), config_path, ": expected a JSON object");
    if (c.contains("bos_token")) v.bos_id = id_of(token_content(c["bos_token"]), "bos_token", config_path);
    if (c.contains("eos_token")) v.eos_id = id_of(token_content(c["eos_token"]), "eos_token", config_path);
    if (c.contains("pad_token")) v.pad_id = id_of(token_content(c["pad_token"]), "pad_token", config_path);
    if (v.unk_id < 0 && c.contains("unk_token")) {  // transformers may leave the model's unk_token null
      v.unk_id = id_of(token_content(c["unk_token"]), "unk_token", config_path);
      // For sentencepiece vocabularies <unk> is its own token type (rendered as text); byte-level ones keep the
      // added-token type, which decides how the text is split.
      if (v.unk_id >= 0 && v.kind == TokenizerKind::SentencePieceBpe) {
        v.types[static_cast<size_t>(v.unk_id)] = TokenType::Unknown;
      }
    }
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) {
      v.add_bos = c["add_bos_token"].get<bool>();
      add_bos_known = true;
    }
    if (c.contains("chat_template")) {
      const json& t = c["chat_template"];
      if (t.is_string()) {
        v.chat_template = t.get<std::string>();
      } else if (t.is_array() && !t.empty()) {  // [{"name": "default", "template": "..."}, ...]
        v.chat_template = t[0].value("template", "");
        for (const json& e : t) {
          if (e.value("name", "") == "default") v.chat_template = e.value("template", "");
        }
      }
    }
  }
  // transformers >= 4.47 may save the template as chat_template.jinja next to the config instead.
  if (v.chat_template.empty()) {
    for (const std::string& file : {config_path, path}) {
      if (file.empty()) continue;
      const auto jinja = std::filesystem::path(file).parent_path() / "chat_template.jinja";
      std::ifstream f(jinja, std::ios::binary);
      if (!f) continue;
      std::stringstream ss;
      ss << f.rdbuf();
      v.chat_template = ss.str();
      break;
    }
  }
  // A TemplateProcessing post-processor whose single-sequence template starts with a special token is how
  // tokenizer.json itself says "add BOS".
  const json post = j.value("post_processor", json());
  if (type_of_node(post) == "TemplateProcessing" && post.contains("single") && post["single"].is_array() &&
      !post["single"].empty() && post["single"][0].contains("SpecialToken")) {
    const std::string first = post["single"][0]["SpecialToken"].value("id", "");
    if (v.bos_id < 0) v.bos_id = id_of(first, "post_processor special token", path);
    if (!add_bos_known) v.add_bos = first == v.tokens[static_cast<size_t>(v.bos_id)];
  }
  return v;
}

}  // namespace

VocabData read_tokenizer_json(const std::string& path, const std::string& config_path) {
  try {
    return read_tokenizer_json_unchecked(path, config_path);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type somewhere
    fail(path, ": malformed tokenizer.json / tokenizer_config.json: ", e.what());
  }
}

}  // namespace lowbit
