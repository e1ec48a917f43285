#include "serve/protocol.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <random>

namespace lowbit::serve {

using nlohmann::json;

std::vector<ServedModel> served_models(const std::string& name, const std::vector<int>& widths) {
  std::vector<ServedModel> out{{name, 0}};
  for (int b : widths) out.push_back({name + "@" + std::to_string(b) + "bit", b});
  return out;
}

std::string dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  return dump(json{{"error", err}});
}

const char* finish_reason(api::StopReason r) {
  switch (r) {
    case api::StopReason::Length:
    case api::StopReason::Context: return "length";
    case api::StopReason::Eos:
    case api::StopReason::Stop:
    case api::StopReason::Cancelled: return "stop";
  }
  return "stop";
}

size_t utf8_complete_prefix(const std::string& s) {
  // Look back at most 3 bytes for the lead byte of the last character; if that character needs more bytes than
  // are there, cut before it. Anything else (ASCII, stray continuation bytes) passes through.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;   // continuation byte: keep looking for the lead
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

namespace {

// Field checks. Each returns false and fills *err naming the field.
struct Checker {
  const json& body;
  ApiError* err;

  bool fail(const std::string& field, const std::string& what, int status = 422) {
    *err = {status, "'" + field + "' " + what, "invalid_request_error", field};
    return false;
  }
  const json* get(const char* field) const {   // null / absent fields are "not given"
    auto it = body.find(field);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  }
  bool number(const char* field, double lo, double hi, bool lo_open, float* out) {
    const json* v = get(field);
    if (!v) return true;
    if (!v->is_number()) return fail(field, "must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
      char range[96];
      std::snprintf(range, sizeof range, "must be in %s%g, %g], got %g", lo_open ? "(" : "[", lo, hi, x);
      return fail(field, range);
    }
    *out = static_cast<float>(x);
    return true;
  }
  bool integer(const char* field, int64_t lo, int64_t hi, int64_t* out) {
    const json* v = get(field);
    if (!v) return true;
    if (!v->is_number_integer()) return fail(field, "must be an integer");
    const bool is_unsigned = v->is_number_unsigned();
    if (is_unsigned ? v->get<uint64_t>() > static_cast<uint64_t>(hi) : (v->get<int64_t>() < lo || v->get<int64_t>() > hi))
      return fail(field, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
    *out = is_unsigned ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
    return true;
  }
  bool boolean(const char* field, bool* out) {
    const json* v = get(field);
    if (!v) return true;
    if (!v->is_boolean()) return fail(field, "must be true or false");
    *out = v->get<bool>();
    return true;
  }
  bool unsupported(const char* field, const std::string& why) {
    return fail(field, "is not supported yet: " + why);
  }
};

// A message's content: a string, or OpenAI's list of parts of which only {"type": "text"} ones are taken.
bool message_content(const json& c, const std::string& field, Checker& ck, std::string* out) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) return ck.fail(field, "must be a string or a list of text parts");
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
      return ck.fail(field, "parts must be {\"type\": \"text\", \"text\": \"...\"} (images and audio are not supported)");
    *out += part["text"].get<std::string>();
  }
  return true;
}

}  // namespace

std::optional<CompletionRequest> parse_request(Endpoint endpoint, const std::string& body,
                                               const std::vector<ServedModel>& models, ApiError* error) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = {400, "the request body is not valid JSON", "invalid_request_error", ""};
    return std::nullopt;
  }
  if (!j.is_object()) {
    *error = {400, "the request body must be a JSON object", "invalid_request_error", ""};
    return std::nullopt;
  }
  Checker ck{j, error};
  CompletionRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::ChatCompletions;

  // model: required, one of the served names.
  const json* model = ck.get("model");
  if (!model) return ck.fail("model", "is required"), std::nullopt;
  if (!model->is_string()) return ck.fail("model", "must be a string"), std::nullopt;
  r.model = model->get<std::string>();
  const ServedModel* served = nullptr;
  for (const ServedModel& m : models)
    if (m.id == r.model) served = &m;
  if (!served) {
    std::string names;
    for (const ServedModel& m : models) names += (names.empty() ? "" : ", ") + m.id;
    *error = {404, "the model '" + r.model + "' does not exist; this server serves: " + names, "invalid_request_error",
              "model"};
    return std::nullopt;
  }
  r.params.bits = served->bits;

  // The prompt.
  if (chat) {
    const json* msgs = ck.get("messages");
    if (!msgs) return ck.fail("messages", "is required"), std::nullopt;
    if (!msgs->is_array() || msgs->empty()) return ck.fail("messages", "must be a non-empty list"), std::nullopt;
    for (size_t i = 0; i < msgs->size(); ++i) {
      const json& m = (*msgs)[i];
      const std::string field = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return ck.fail(field, "must be an object"), std::nullopt;
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) return ck.fail(field + ".role", "must be a string"), std::nullopt;
      api::ChatMessage cm;
      cm.role = role->get<std::string>();
      if (cm.role == "developer") cm.role = "system";   // OpenAI's newer name for the system role
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
        return ck.fail(field + ".role", "must be system, user or assistant, got '" + cm.role + "'"), std::nullopt;
      auto content = m.find("content");
      if (content == m.end() || content->is_null()) return ck.fail(field + ".content", "is required"), std::nullopt;
      if (!message_content(*content, field + ".content", ck, &cm.content)) return std::nullopt;
      r.messages.push_back(std::move(cm));
    }
  } else {
    const json* p = ck.get("prompt");
    if (!p) return ck.fail("prompt", "is required"), std::nullopt;
    const json* one = p;
    if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
      if (p->size() != 1) return ck.unsupported("prompt", "one prompt per request (a list of prompts)"), std::nullopt;
      one = &(*p)[0];
    }
    if (one->is_string()) {
      r.prompt = one->get<std::string>();
    } else if (one->is_array()) {
      if (one->empty()) return ck.fail("prompt", "must not be an empty list of tokens"), std::nullopt;
      for (const json& t : *one) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
          return ck.fail("prompt", "must be a string or a list of token ids (integers >= 0)"), std::nullopt;
        r.prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      r.prompt_is_ids = true;
    } else {
      return ck.fail("prompt", "must be a string or a list of token ids"), std::nullopt;
    }
    for (const char* f : {"echo"}) {
      bool echo = false;
      if (!ck.boolean(f, &echo)) return std::nullopt;
      if (echo) return ck.unsupported(f, "the response holds the completion only"), std::nullopt;
    }
    if (const json* s = ck.get("suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
      return ck.unsupported("suffix", "insertion needs a fill-in-the-middle model"), std::nullopt;
    int64_t best_of = 1;
    if (!ck.integer("best_of", 1, 1 << 20, &best_of)) return std::nullopt;
    if (best_of != 1) return ck.unsupported("best_of", "only 1"), std::nullopt;
  }

  // Lengths and sampling.
  int64_t max_tokens = chat ? -1 : 16;   // OpenAI's defaults: 16 for completions, the rest of the context for chat
  const char* max_field = chat && ck.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (!ck.integer(max_field, 0, std::numeric_limits<int32_t>::max(), &max_tokens)) return std::nullopt;
  r.max_tokens_given = ck.get(max_field) != nullptr;
  r.params.max_tokens = max_tokens < 0 ? std::numeric_limits<int32_t>::max() : static_cast<int>(max_tokens);

  r.params.temperature = 1.0f;   // OpenAI's default
  if (!ck.number("temperature", 0, 2, false, &r.params.temperature)) return std::nullopt;
  if (!ck.number("top_p", 0, 1, true, &r.params.top_p)) return std::nullopt;
  int64_t top_k = 0;
  if (!ck.integer("top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) return std::nullopt;
  r.params.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);   // -1: off, as vLLM spells it
  if (!ck.number("repetition_penalty", 0, 100, true, &r.params.repetition_penalty)) return std::nullopt;
  int64_t seed = -1;
  if (!ck.integer("seed", 0, std::numeric_limits<int64_t>::max(), &seed)) return std::nullopt;
  r.params.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  if (!ck.number("frequency_penalty", -2, 2, false, &r.params.frequency_penalty)) return std::nullopt;
  if (!ck.number("presence_penalty", -2, 2, false, &r.params.presence_penalty)) return std::nullopt;
  int64_t n = 1;
  if (!ck.integer("n", 1, 128, &n)) return std::nullopt;
  if (n != 1) return ck.unsupported("n", "only n = 1 (one choice per request)"), std::nullopt;

  // Log probabilities. Completions: logprobs = the number of alternatives (0..5, OpenAI's limit); chat: logprobs
  // true, with top_logprobs alternatives (0..20).
  if (chat) {
    bool logprobs = false;
    if (!ck.boolean("logprobs", &logprobs)) return std::nullopt;
    int64_t top = 0;
    if (!ck.integer("top_logprobs", 0, 20, &top)) return std::nullopt;
    if (ck.get("top_logprobs") && !logprobs) return ck.fail("top_logprobs", "needs logprobs: true"), std::nullopt;
    r.params.logprobs = logprobs ? static_cast<int>(top) : -1;
  } else {
    int64_t lp = -1;
    if (!ck.integer("logprobs", 0, 5, &lp)) return std::nullopt;
    if (ck.get("top_logprobs")) return ck.fail("top_logprobs", "is a chat completions field; here logprobs is the count"), std::nullopt;
    r.params.logprobs = static_cast<int>(lp);
  }
  if (const json* lb = ck.get("logit_bias"); lb && !(lb->is_object() && lb->empty()))
    return ck.unsupported("logit_bias", "no logit biases"), std::nullopt;
  for (const char* f : {"tools", "functions", "tool_choice", "function_call"})
    if (ck.get(f)) return ck.unsupported(f, "no tool calls"), std::nullopt;
  if (const json* rf = ck.get("response_format");
      rf && !(rf->is_object() && rf->value("type", json()) == "text"))
    return ck.unsupported("response_format", "plain text only"), std::nullopt;

  // stop: a string or a list of up to 4 non-empty strings.
  if (const json* s = ck.get("stop")) {
    std::vector<std::string> stops;
    if (s->is_string()) {
      stops.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 4) return ck.fail("stop", "holds at most 4 strings"), std::nullopt;
      for (const json& x : *s) {
        if (!x.is_string()) return ck.fail("stop", "must be a string or a list of strings"), std::nullopt;
        stops.push_back(x.get<std::string>());
      }
    } else {
      return ck.fail("stop", "must be a string or a list of strings"), std::nullopt;
    }
    for (const std::string& x : stops)
      if (x.empty()) return ck.fail("stop", "strings must not be empty"), std::nullopt;
    r.params.stop = std::move(stops);
  }

  // lowbit's extension: self-speculative decoding, drafting with this width of the same any-precision model (0 = off).
  int64_t draft_bits = 0;
  if (!ck.integer("draft_bits", 0, 8, &draft_bits)) return std::nullopt;
  r.draft_bits_given = ck.get("draft_bits") != nullptr;
  r.params.draft_bits = static_cast<int>(draft_bits);
  if (r.params.draft_bits > 0 && r.params.logprobs >= 0)
    return ck.fail("draft_bits", "speculative decoding reports no log-probabilities (drop logprobs)"), std::nullopt;
  // vLLM's extension: keep generating past EOS (benchmarks and tests that need a fixed length).
  bool ignore_eos = false;
  if (!ck.boolean("ignore_eos", &ignore_eos)) return std::nullopt;
  r.params.stop_at_eos = !ignore_eos;

  if (!ck.boolean("stream", &r.stream)) return std::nullopt;
  if (const json* so = ck.get("stream_options")) {
    if (!so->is_object()) return ck.fail("stream_options", "must be an object"), std::nullopt;
    if (!r.stream) return ck.fail("stream_options", "applies only with stream: true"), std::nullopt;
    auto iu = so->find("include_usage");
    if (iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return ck.fail("stream_options.include_usage", "must be true or false"), std::nullopt;
      r.include_usage = iu->get<bool>();
    }
  }
  // The engine's own checks (the same ranges the CLI states), as a last guard.
  try {
    api::validate(r.params);
  } catch (const std::exception& e) {
    *error = {422, e.what(), "invalid_request_error", ""};
    return std::nullopt;
  }
  return r;
}

ResponseIds make_ids(Endpoint endpoint, const std::string& model) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(rng()));
  ResponseIds ids;
  ids.id = std::string(endpoint == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-") + hex;
  ids.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  ids.model = model;
  return ids;
}

json usage_json(const api::GenerateResult& r) {
  const auto p = static_cast<int64_t>(r.prompt_ids.size()), c = static_cast<int64_t>(r.new_ids.size());
  return {{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
}

namespace {
json envelope(Endpoint endpoint, const ResponseIds& ids, bool chunk) {
  const bool chat = endpoint == Endpoint::ChatCompletions;
  return {{"id", ids.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", ids.created},
          {"model", ids.model}};
}
}  // namespace

json logprobs_json(Endpoint endpoint, const std::vector<api::TokenLogprobs>& lps, size_t text_offset) {
  auto bytes = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(static_cast<int>(c));
    return b;
  };
  if (endpoint == Endpoint::ChatCompletions) {
    json content = json::array();
    for (const api::TokenLogprobs& lp : lps) {
      json top = json::array();
      for (const auto& a : lp.top) top.push_back({{"token", a.text}, {"logprob", a.logprob}, {"bytes", bytes(a.text)}});
      content.push_back({{"token", lp.text}, {"logprob", lp.logprob}, {"bytes", bytes(lp.text)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_lps = json::array(), top = json::array(), offsets = json::array();
  for (const api::TokenLogprobs& lp : lps) {
    tokens.push_back(lp.text);
    token_lps.push_back(lp.logprob);
    json alts = json::object();
    // Two alternatives may render as the same text (invalid UTF-8 pieces): the likelier one is kept, as the first.
    for (const auto& a : lp.top)
      if (!alts.contains(a.text)) alts[a.text] = a.logprob;
    top.push_back(alts);
    offsets.push_back(text_offset);
    text_offset += lp.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json completion_json(Endpoint endpoint, const ResponseIds& ids, const api::GenerateResult& r, bool logprobs) {
  json out = envelope(endpoint, ids, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(r.stop_reason)}};
  if (logprobs) choice["logprobs"] = logprobs_json(endpoint, r.logprobs, 0);
  if (endpoint == Endpoint::ChatCompletions)
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  else
    choice["text"] = r.text;
  out["choices"] = json::array({choice});
  out["usage"] = usage_json(r);
  return out;
}

json chunk_json(Endpoint endpoint, const ResponseIds& ids, const std::string& text, const char* finish, bool role_open,
                const std::vector<api::TokenLogprobs>* logprobs, size_t text_offset) {
  json out = envelope(endpoint, ids, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (logprobs != nullptr) choice["logprobs"] = logprobs_json(endpoint, *logprobs, text_offset);
  if (finish && *finish) choice["finish_reason"] = finish;
  if (endpoint == Endpoint::ChatCompletions) {
    json delta = json::object();
    if (role_open) delta["role"] = "assistant";
    if (role_open || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  return out;
}

json usage_chunk_json(Endpoint endpoint, const ResponseIds& ids, const api::GenerateResult& r) {
  json out = envelope(endpoint, ids, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(r);
  return out;
}

}  // namespace lowbit::serve
