// `lowbit serve`: an OpenAI-compatible HTTP server over one loaded api::Model.
//
// Three layers, each in its own file: transport (server.cpp: cpp-httplib routes, authentication, SSE streaming,
// signals), protocol (protocol.cpp: request checks and response JSON) and the generation queue (scheduler.cpp: one
// worker that owns the model and its continuous batch). src/serve is a library of its own (lowbit_serve) so that the CLI links it and the
// unit tests call the protocol functions directly; the engine library (lowbit) stays free of HTTP.
#pragma once
#include <string>

#include "lowbit/model.h"

namespace lowbit::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;           // "" = no authentication
  std::string model_name;        // the name clients ask for; "" = the model file's stem
  int max_queue = 64;            // requests waiting for the worker; past it 503
  int ctx = 0;                   // tokens of prompt + completion per request (0 = the model's context)
  int max_batch = 8;             // requests generated together at most (continuous batching)
  double kv_cache_gb = 0;        // > 0: the KV cache's size; fewer requests run together when it holds fewer
  int prefill_chunk = 512;       // prompt tokens per round, so that running streams keep moving
  // Any-precision models: requests above this width that do not say "draft_bits" are drafted by it (0 = off).
  int draft_bits = 0;
  size_t max_body_bytes = 1 << 20;
  double drain_seconds = 30;     // SIGTERM / SIGINT: how long running and queued requests may take to finish
  double request_timeout_s = 600;   // a request still generating this long after it arrived ends (0 = no limit)
};

// Serves until SIGTERM or SIGINT, then stops accepting, lets requests finish (at most drain_seconds, then cancels
// them) and returns. Throws lowbit::Error when the address cannot be bound.
void run_server(api::Model& model, const ServerOptions& opts);

}  // namespace lowbit::serve
