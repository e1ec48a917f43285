// `lowbit serve`: the request checks and response JSON directly (no sockets), then the real server on stories260K over
// loopback (a child `lowbit serve`, driven with cpp-httplib's client): models, greedy completions equal to `lowbit
// generate`, streaming, the API key, error statuses, metrics, and a clean exit on SIGTERM.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include <httplib.h>

#include "serve/protocol.h"
#include "test_util.h"

namespace lowbit {
namespace {

using serve::ApiError;
using serve::Endpoint;
using serve::parse_request;

const std::vector<serve::ServedModel> kModels = serve::served_models("m", {3, 4, 8});

// The request is refused with this status, and the message names this field.
void expect_refused(Endpoint ep, const std::string& body, int status, const std::string& field) {
  ApiError e;
  EXPECT_FALSE(parse_request(ep, body, kModels, &e).has_value()) << body;
  EXPECT_EQ(e.status, status) << body << " -> " << e.message;
  EXPECT_NE(e.message.find(field), std::string::npos) << body << " -> " << e.message;
  const auto j = nlohmann::json::parse(serve::error_body(e));
  EXPECT_TRUE(j["error"]["message"].is_string());
}

TEST(ServeProtocol, ModelNamesPerWidth) {
  ASSERT_EQ(kModels.size(), 4u);
  EXPECT_EQ(kModels[0].id, "m");
  EXPECT_EQ(kModels[0].bits, 0);
  EXPECT_EQ(kModels[1].id, "m@3bit");
  EXPECT_EQ(kModels[1].bits, 3);
  EXPECT_EQ(kModels[3].id, "m@8bit");
  EXPECT_EQ(serve::served_models("x", {}).size(), 1u);
}

TEST(ServeProtocol, AcceptsOpenAiRequests) {
  ApiError e;
  auto r = parse_request(Endpoint::Completions,
                         R"({"model":"m@4bit","prompt":"hi","max_tokens":5,"temperature":0,"stop":["a","b"],
                             "seed":3,"top_p":0.5,"top_k":-1,"stream":true,"stream_options":{"include_usage":true},
                             "frequency_penalty":0,"presence_penalty":0.0,"n":1,"logprobs":null,"user":"x"})",
                         kModels, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  EXPECT_EQ(r->params.bits, 4);
  EXPECT_EQ(r->params.max_tokens, 5);
  EXPECT_EQ(r->params.temperature, 0.0f);
  EXPECT_EQ(r->params.stop.size(), 2u);
  EXPECT_EQ(r->params.seed, 3u);
  EXPECT_EQ(r->params.top_k, 0);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  r = parse_request(Endpoint::Completions, R"({"model":"m","prompt":[1,2,3]})", kModels, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  EXPECT_TRUE(r->prompt_is_ids);
  EXPECT_EQ(r->params.max_tokens, 16);   // OpenAI's default for completions
  EXPECT_EQ(r->params.bits, 0);
  r = parse_request(Endpoint::ChatCompletions,
                    R"({"model":"m@8bit","messages":[{"role":"system","content":"be brief"},
                        {"role":"user","content":[{"type":"text","text":"hi"}]}],"stop":"x","logprobs":false})",
                    kModels, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[1].content, "hi");
  EXPECT_EQ(r->params.stop, std::vector<std::string>{"x"});
}

TEST(ServeProtocol, LogprobsAndPenalties) {
  ApiError e;
  auto r = parse_request(Endpoint::Completions,
                         R"({"model":"m","prompt":"hi","logprobs":3,"presence_penalty":0.5,"frequency_penalty":-1})",
                         kModels, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  EXPECT_EQ(r->params.logprobs, 3);
  EXPECT_EQ(r->params.presence_penalty, 0.5f);
  EXPECT_EQ(r->params.frequency_penalty, -1.0f);
  r = parse_request(Endpoint::ChatCompletions,
                    R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2})", kModels, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  EXPECT_EQ(r->params.logprobs, 2);
  r = parse_request(Endpoint::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})",
                    kModels, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  EXPECT_EQ(r->params.logprobs, 0);
  r = parse_request(Endpoint::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"x"}]})", kModels, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  EXPECT_EQ(r->params.logprobs, -1);

  // Rendering: two tokens, the second with a byte that is not UTF-8 on its own.
  std::vector<api::TokenLogprobs> lps(2);
  lps[0] = {5, "He", -0.25f, {{5, "He", -0.25f}, {9, "She", -1.5f}}};
  lps[1] = {7, "\xC3", -2.0f, {{7, "\xC3", -2.0f}}};
  const nlohmann::json c = logprobs_json(Endpoint::Completions, lps, 10);
  EXPECT_EQ(c["tokens"][0], "He");
  EXPECT_EQ(c["token_logprobs"][1], -2.0f);
  EXPECT_EQ(c["top_logprobs"][0]["She"], -1.5f);
  EXPECT_EQ(c["text_offset"], nlohmann::json::array({10, 12}));
  const nlohmann::json k = logprobs_json(Endpoint::ChatCompletions, lps, 0);
  EXPECT_EQ(k["content"][0]["token"], "He");
  EXPECT_EQ(k["content"][0]["top_logprobs"][1]["token"], "She");
  EXPECT_EQ(k["content"][1]["bytes"], nlohmann::json::array({0xC3}));
  EXPECT_NE(serve::dump(k).find("\"bytes\":[195]"), std::string::npos) << serve::dump(k);
  api::GenerateResult res;
  res.logprobs = lps;
  EXPECT_TRUE(completion_json(Endpoint::Completions, make_ids(Endpoint::Completions, "m"), res)["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(completion_json(Endpoint::Completions, make_ids(Endpoint::Completions, "m"), res, true)["choices"][0]["logprobs"]["tokens"].size(), 2u);
}

TEST(ServeProtocol, RefusesBadRequests) {
  const auto C = Endpoint::Completions, K = Endpoint::ChatCompletions;
  expect_refused(C, "{not json", 400, "JSON");
  expect_refused(C, "[1,2]", 400, "object");
  expect_refused(C, R"({"prompt":"hi"})", 422, "model");
  expect_refused(C, R"({"model":"nope","prompt":"hi"})", 404, "nope");
  expect_refused(C, R"({"model":"m@5bit","prompt":"hi"})", 404, "m@3bit");   // lists what is served
  expect_refused(C, R"({"model":"m"})", 422, "prompt");
  expect_refused(C, R"({"model":"m","prompt":5})", 422, "prompt");
  expect_refused(C, R"({"model":"m","prompt":["a","b"]})", 422, "prompt");
  expect_refused(C, R"({"model":"m","prompt":"hi","max_tokens":"5"})", 422, "max_tokens");
  expect_refused(C, R"({"model":"m","prompt":"hi","max_tokens":-1})", 422, "max_tokens");
  expect_refused(C, R"({"model":"m","prompt":"hi","max_tokens":1.5})", 422, "max_tokens");
  expect_refused(C, R"({"model":"m","prompt":"hi","temperature":-1})", 422, "temperature");
  expect_refused(C, R"({"model":"m","prompt":"hi","temperature":"hot"})", 422, "temperature");
  expect_refused(C, R"({"model":"m","prompt":"hi","top_p":0})", 422, "top_p");
  expect_refused(C, R"({"model":"m","prompt":"hi","top_k":-2})", 422, "top_k");
  expect_refused(C, R"({"model":"m","prompt":"hi","seed":-4})", 422, "seed");
  expect_refused(C, R"({"model":"m","prompt":"hi","n":2})", 422, "n");
  expect_refused(C, R"({"model":"m","prompt":"hi","stop":[1]})", 422, "stop");
  expect_refused(C, R"({"model":"m","prompt":"hi","stop":""})", 422, "stop");
  expect_refused(C, R"({"model":"m","prompt":"hi","stop":["a","b","c","d","e"]})", 422, "stop");
  expect_refused(C, R"({"model":"m","prompt":"hi","logprobs":6})", 422, "logprobs");
  expect_refused(C, R"({"model":"m","prompt":"hi","logprobs":true})", 422, "logprobs");
  expect_refused(C, R"({"model":"m","prompt":"hi","top_logprobs":2})", 422, "top_logprobs");
  expect_refused(C, R"({"model":"m","prompt":"hi","frequency_penalty":-2.5})", 422, "frequency_penalty");
  expect_refused(C, R"({"model":"m","prompt":"hi","presence_penalty":3})", 422, "presence_penalty");
  expect_refused(C, R"({"model":"m","prompt":"hi","repetition_penalty":0})", 422, "repetition_penalty");
  expect_refused(C, R"({"model":"m","prompt":"hi","stream":"yes"})", 422, "stream");
  expect_refused(C, R"({"model":"m","prompt":"hi","stream_options":{"include_usage":true}})", 422, "stream_options");
  expect_refused(C, R"({"model":"m","prompt":"hi","echo":true})", 422, "echo");
  expect_refused(K, R"({"model":"m","prompt":"hi"})", 422, "messages");
  expect_refused(K, R"({"model":"m","messages":[]})", 422, "messages");
  expect_refused(K, R"({"model":"m","messages":[{"role":"robot","content":"x"}]})", 422, "messages[0].role");
  expect_refused(K, R"({"model":"m","messages":[{"role":"user"}]})", 422, "messages[0].content");
  expect_refused(K, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":2})", 422, "logprobs");
  expect_refused(K, R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})", 422, "top_logprobs");
  expect_refused(K, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", 422,
                 "top_logprobs");
  expect_refused(K, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[]})", 422, "tools");
}

TEST(ServeProtocol, ResponsesAndUtf8) {
  api::GenerateResult r;
  r.prompt_ids = {1, 2, 3};
  r.new_ids = {4, 5};
  r.text = "ab";
  r.stop_reason = api::StopReason::Stop;
  const serve::ResponseIds ids = serve::make_ids(Endpoint::ChatCompletions, "m@3bit");
  EXPECT_EQ(ids.id.rfind("chatcmpl-", 0), 0u);
  const auto full = serve::completion_json(Endpoint::ChatCompletions, ids, r);
  EXPECT_EQ(full["choices"][0]["message"]["content"], "ab");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(full["usage"]["total_tokens"], 5);
  r.stop_reason = api::StopReason::Context;
  EXPECT_STREQ(serve::finish_reason(r.stop_reason), "length");
  // A stream chunk never ends inside a UTF-8 character; invalid bytes never make dump throw.
  const std::string euro = "\xE2\x82\xAC";   // U+20AC, three bytes
  EXPECT_EQ(serve::utf8_complete_prefix("a" + euro), 4u);
  EXPECT_EQ(serve::utf8_complete_prefix("a" + euro.substr(0, 2)), 1u);
  EXPECT_EQ(serve::utf8_complete_prefix("a" + euro.substr(0, 1)), 1u);
  EXPECT_EQ(serve::utf8_complete_prefix("abc"), 3u);
  EXPECT_NO_THROW(serve::dump(nlohmann::json{{"text", std::string("\xFF\xFE")}}));
}

// A loopback port nothing listens on (bound to port 0, then released).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

TEST(ServeHttp, AnswersOpenAiRequestsOnStories260K) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string port_s = std::to_string(port);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("OMP_NUM_THREADS", "1", 1);
    execl(LOWBIT_CLI_PATH, "lowbit", "serve", bin.c_str(), "--port", port_s.c_str(), "--api-key", "sk-test",
          "--model-name", "stories", "--device", "cpu", static_cast<char*>(nullptr));
    _exit(127);
  }
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {
    if (auto r = cli.Get("/health"); r && r->status == 200) up = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(up) << "lowbit serve did not answer /health within 30 s";
  const httplib::Headers auth = {{"Authorization", "Bearer sk-test"}};
  auto post = [&](const std::string& path, const std::string& body, const httplib::Headers& h) {
    return cli.Post(path, h, body, "application/json");
  };

  auto models = cli.Get("/v1/models", auth);
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(nlohmann::json::parse(models->body)["data"][0]["id"], "stories");

  // Greedy completion: the same text as `lowbit generate` prints, with usage and a finish reason.
  const std::string req = R"({"model":"stories","prompt":"Once upon a time","max_tokens":20,"temperature":0})";
  auto r = post("/v1/completions", req, auth);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto j = nlohmann::json::parse(r->body);
  const std::string text = j["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 20);
  const std::string finish = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "length" || finish == "stop") << finish;
  std::string cli_out;
  ASSERT_EQ(test::run_cli("generate " + bin + " --prompt 'Once upon a time' -n 20 --temperature 0 --device cpu", &cli_out), 0)
      << cli_out;
  EXPECT_NE(cli_out.find(text), std::string::npos) << "server: [" << text << "]\ngenerate:\n" << cli_out;

  // Streaming: server-sent events ending in [DONE], whose pieces join to the same text.
  auto st = post("/v1/completions", R"({"model":"stories","prompt":"Once upon a time","max_tokens":20,"temperature":0,"stream":true})", auth);
  ASSERT_TRUE(st);
  ASSERT_EQ(st->status, 200);
  EXPECT_NE(st->body.find("data: [DONE]"), std::string::npos);
  std::string joined;
  for (size_t at = st->body.find("data: "); at != std::string::npos; at = st->body.find("data: ", at + 6)) {
    const size_t end = st->body.find("\n", at);
    const std::string payload = st->body.substr(at + 6, end - at - 6);
    if (payload == "[DONE]") break;
    const auto c = nlohmann::json::parse(payload);
    if (!c["choices"].empty() && c["choices"][0]["text"].is_string()) joined += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(joined, text);

  // Errors, each an OpenAI-style JSON body.
  auto status = [&](const std::string& body, const httplib::Headers& h) {
    auto e = post("/v1/completions", body, h);
    if (!e) return -1;
    EXPECT_TRUE(nlohmann::json::parse(e->body, nullptr, false).contains("error")) << e->body;
    return e->status;
  };
  EXPECT_EQ(status(req, {}), 401);
  EXPECT_EQ(status(req, {{"Authorization", "Bearer wrong"}}), 401);
  EXPECT_EQ(status(R"({"model":"nope","prompt":"x"})", auth), 404);
  EXPECT_EQ(status(R"({"model":"stories","prompt":)", auth), 400);
  EXPECT_EQ(status(R"({"model":"stories","prompt":"x","n":2})", auth), 422);
  EXPECT_EQ(status(R"({"model":"stories","prompt":"x","max_tokens":"many"})", auth), 422);

  auto metrics = cli.Get("/metrics", auth);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("lowbit_generated_tokens_total"), std::string::npos);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int ws = 0;
  ASSERT_EQ(waitpid(pid, &ws, 0), pid);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << "exit status " << ws;
}

}  // namespace
}  // namespace lowbit
