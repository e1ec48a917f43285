// Evaluation text: how a file becomes the documents that perplexity is measured on.
//   Plain     — the file as is, one document.
//   WikiText  — GPTQ/SqueezeLLM/QUIK protocol for wiki.test.raw: each line (with its "\n") is a row, blank
//               lines become "", rows joined with "\n\n", one document (1,294,336 characters for WikiText-2 test).
//   Jsonl     — one document per JSON line, field --jsonl-field (C4-style); documents joined with "\n\n".
//   Documents — split on a separator line (e.g. "<|endoftext|>"), each stripped and scored on its own with BOS.
#pragma once
#include <string>
#include <vector>

namespace lowbit {

enum class TextMode { Auto, Plain, WikiText, Jsonl, Documents };

struct EvalText {
  TextMode mode = TextMode::Plain;   // resolved mode
  std::vector<std::string> docs;     // one entry unless mode == Documents
  // Documents the source held: the JSON lines of a Jsonl file (joined into docs[0]), docs.size() for Documents,
  // 1 otherwise.
  int documents = 0;
  std::string describe() const;      // e.g. "512 jsonl documents joined with \"\\n\\n\", 1048575 bytes"
};

TextMode parse_text_mode(const std::string& s);   // auto|plain|wikitext|jsonl|docs
// Auto picks WikiText for *.raw files whose name contains "wiki", Jsonl for *.jsonl, Documents when a
// separator is given, else Plain.
EvalText load_eval_text(const std::string& path, TextMode mode, const std::string& jsonl_field,
                        const std::string& doc_separator);
// The same for text already in memory; `path` names it in messages and in Auto's choice (a name ending in .jsonl
// picks Jsonl, ...; "" picks Plain, or Documents when a separator is given).
EvalText split_eval_text(const std::string& raw, const std::string& path, TextMode mode, const std::string& jsonl_field,
                         const std::string& doc_separator);

}  // namespace lowbit
