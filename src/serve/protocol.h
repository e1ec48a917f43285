// The OpenAI wire format of `lowbit serve`: request bodies checked field by field into generation settings, and the
// JSON of responses, stream chunks and errors. Pure functions of their inputs (no model, no sockets), so the unit
// tests cover every refusal without a server.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/model.h"
#include "serve/scheduler.h"

namespace lowbit::serve {

enum class Endpoint { Completions, ChatCompletions };

// One name a client may put in "model": an any-precision file is served as one name per width plus the plain name.
struct ServedModel {
  std::string id;   // "stories260K@3bit", "stories260K"
  int bits = 0;     // GenerateParams::bits (0 = the widest / the only width)
};
// The plain name first (the widest width), then "<name>@<b>bit" for each width.
std::vector<ServedModel> served_models(const std::string& name, const std::vector<int>& widths);

struct CompletionRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;                    // as requested (echoed in responses)
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  std::string prompt;                   // completions: text prompt
  std::vector<int32_t> prompt_ids;      // completions: a prompt given as token ids
  bool prompt_is_ids = false;
  std::vector<api::ChatMessage> messages;   // chat
  api::GenerateParams params;
  bool max_tokens_given = false;        // chat: without it, generation runs to the end of the context
  bool draft_bits_given = false;        // lowbit's extension "draft_bits" (speculative decoding) was in the body
};

// Parses and checks a request body. On failure returns nullopt and fills *error (400 malformed JSON, 404 unknown
// model, 422 a field of the wrong type or out of range or not supported, naming the field).
std::optional<CompletionRequest> parse_request(Endpoint endpoint, const std::string& body,
                                               const std::vector<ServedModel>& models, ApiError* error);

// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);
// "stop" (EOS, end of turn, a stop string) or "length" (max_tokens, the context).
const char* finish_reason(api::StopReason r);

// The length of the longest prefix of s that does not end inside a UTF-8 character: byte-level vocabularies split
// characters across tokens, and a stream chunk must carry whole characters.
size_t utf8_complete_prefix(const std::string& s);
// JSON text of v; bytes that are not valid UTF-8 become U+FFFD instead of throwing.
std::string dump(const nlohmann::json& v);

struct ResponseIds {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};
ResponseIds make_ids(Endpoint endpoint, const std::string& model);
nlohmann::json usage_json(const api::GenerateResult& r);
// A choice's "logprobs": completions {tokens, token_logprobs, top_logprobs, text_offset} (offsets from text_offset),
// chat {content: [{token, logprob, bytes, top_logprobs}]}.
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<api::TokenLogprobs>& lps, size_t text_offset);
// The whole non-streaming response; logprobs: the request asked for them (r.logprobs rendered).
nlohmann::json completion_json(Endpoint endpoint, const ResponseIds& ids, const api::GenerateResult& r,
                               bool logprobs = false);
// A streaming chunk: text (may be empty), finish ("" while running), role_open: the chat stream's first chunk;
// logprobs (non-null when requested): the tokens this chunk reports, the first at text_offset of the completion.
nlohmann::json chunk_json(Endpoint endpoint, const ResponseIds& ids, const std::string& text, const char* finish,
                          bool role_open = false, const std::vector<api::TokenLogprobs>* logprobs = nullptr,
                          size_t text_offset = 0);
// The last chunk of a stream with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk_json(Endpoint endpoint, const ResponseIds& ids, const api::GenerateResult& r);

}  // namespace lowbit::serve
