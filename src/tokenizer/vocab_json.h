// VocabData <-> JSON, so a tokenizer travels inside another JSON document (the "tokenizer" object of a .lowbit
// file's metadata, docs/formats/lowbit-container.md). The round trip is exact: every field of VocabData, every
// byte of every piece, every score bit.
//
//   {"kind": "sentencepiece_bpe" | "byte_level_bpe", "pre": str,
//    "tokens": [piece, ...], "scores": [float, ...] (empty or one per token), "types": [int, ...] (empty or one
//    per token, TokenType values 1..6), "merges": ["a b", ...],
//    "ids": {"bos": int, "eos": int, "unk": int, "pad": int} (-1 = none),
//    "flags": {"add_bos", "add_space_prefix", "space_prefix_first_only", "space_prefix_unless_space",
//              "ignore_merges": bool},
//    "chat_template": str}
// A string that is not valid UTF-8 (llama2.c and some SentencePiece vocabularies hold raw byte pieces) cannot be
// a JSON string; it is written as {"hex": "<two lowercase hex digits per byte>"} instead. A score that is not
// finite is written as the string "inf", "-inf" or "nan".
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/tokenizer.h"

namespace lowbit {

nlohmann::ordered_json vocab_to_json(const VocabData& vocab);
// Validates everything (exact key set, types, sizes, ids in range) and throws lowbit::Error("<where>: tokenizer:
// <problem>").
VocabData vocab_from_json(const nlohmann::ordered_json& j, const std::string& where);

}  // namespace lowbit
