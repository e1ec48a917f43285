#include "runtime/eval_text.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace lowbit {

namespace {

std::string strip(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(ws);
  return s.substr(a, b - a + 1);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TextMode parse_text_mode(const std::string& s) {
  if (s == "auto") return TextMode::Auto;
  if (s == "plain") return TextMode::Plain;
  if (s == "wikitext") return TextMode::WikiText;
  if (s == "jsonl") return TextMode::Jsonl;
  if (s == "docs") return TextMode::Documents;
  fail("unknown text mode '", s, "' (auto, plain, wikitext, jsonl, docs)");
}

std::string EvalText::describe() const {
  size_t chars = 0;
  for (const auto& d : docs) chars += d.size();
  std::ostringstream os;
  switch (mode) {
    case TextMode::WikiText: os << "wikitext rows joined with \"\\n\\n\""; break;
    case TextMode::Jsonl: os << documents << " jsonl documents joined with \"\\n\\n\""; break;
    case TextMode::Documents: os << docs.size() << " documents scored separately with BOS"; break;
    default: os << "plain text"; break;
  }
  os << ", " << chars << " bytes";
  return os.str();
}

EvalText load_eval_text(const std::string& path, TextMode mode, const std::string& jsonl_field,
                        const std::string& doc_separator) {
  std::error_code ec;
  LOWBIT_CHECK(std::filesystem::is_regular_file(path, ec), path, ": no such text file");
  std::ifstream f(path, std::ios::binary);
  LOWBIT_CHECK(f.good(), path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return split_eval_text(ss.str(), path, mode, jsonl_field, doc_separator);
}

EvalText split_eval_text(const std::string& raw, const std::string& path, TextMode mode,
                         const std::string& jsonl_field, const std::string& doc_separator) {
  if (mode == TextMode::Auto) {
    const std::string name = std::filesystem::path(path).filename().string();
    if (!doc_separator.empty()) mode = TextMode::Documents;
    else if (ends_with(name, ".jsonl")) mode = TextMode::Jsonl;
    else if (name.find("wiki") != std::string::npos && (ends_with(name, ".raw") || ends_with(name, ".tokens")))
      mode = TextMode::WikiText;
    else mode = TextMode::Plain;
  }
  EvalText out;
  out.mode = mode;
  switch (mode) {
    case TextMode::Plain:
      out.docs.push_back(raw);
      break;
    case TextMode::WikiText: {
      std::string joined;
      size_t start = 0;
      bool first = true;
      while (start < raw.size()) {
        size_t nl = raw.find('\n', start);
        const size_t end = nl == std::string::npos ? raw.size() : nl + 1;
        std::string row = raw.substr(start, end - start);
        if (strip(row).empty()) row.clear();
        if (!first) joined += "\n\n";
        joined += row;
        first = false;
        start = end;
      }
      out.docs.push_back(std::move(joined));
      break;
    }
    case TextMode::Jsonl: {
      std::string joined;
      std::istringstream lines(raw);
      std::string line;
      int lineno = 0;
      while (std::getline(lines, line)) {
        ++lineno;
        if (strip(line).empty()) continue;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const std::exception& e) {
          fail(path, ":", lineno, ": invalid JSON: ", e.what());
        }
        LOWBIT_CHECK(j.is_object() && j.contains(jsonl_field) && j[jsonl_field].is_string(), path, ":", lineno,
                     ": no string field '", jsonl_field, "'");
        if (!joined.empty()) joined += "\n\n";
        joined += j[jsonl_field].get<std::string>();
        ++out.documents;
      }
      out.docs.push_back(std::move(joined));
      break;
    }
    case TextMode::Documents: {
      LOWBIT_CHECK(!doc_separator.empty(), "--doc-separator is required for text mode 'docs'");
      size_t start = 0;
      while (start <= raw.size()) {
        size_t at = raw.find(doc_separator, start);
        const size_t end = at == std::string::npos ? raw.size() : at;
        std::string doc = strip(raw.substr(start, end - start));
        if (!doc.empty()) out.docs.push_back(std::move(doc));
        if (at == std::string::npos) break;
        start = at + doc_separator.size();
      }
      break;
    }
    case TextMode::Auto: break;
  }
  if (mode != TextMode::Jsonl) out.documents = static_cast<int>(out.docs.size());
  LOWBIT_CHECK(!out.docs.empty() && !out.docs[0].empty(), path.empty() ? "the text" : path, ": no text to evaluate");
  return out;
}

}  // namespace lowbit
