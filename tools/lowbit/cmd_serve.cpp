// lowbit serve MODEL: an OpenAI-compatible HTTP server over the model (src/serve; docs/SERVE.md).
#include "commands.h"
#include "serve/server.h"

namespace lowbit::cli {

namespace {
struct ServeArgs {
  std::string model, device = "auto";
  serve::ServerOptions opts;
};
}  // namespace

void register_serve(CLI::App& app, Common& common) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API (docs/SERVE.md)");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, llama2.c .bin, or .lowbit")->required();
  sub->add_option("--host", a->opts.host, "Address to listen on (default 127.0.0.1: this machine only)");
  sub->add_option("--port", a->opts.port, "TCP port (default 8080)")->check(in_range(1, 65535));
  sub->add_option("--api-key", a->opts.api_key, "Require 'Authorization: Bearer KEY' on every endpoint but /health");
  sub->add_option("--model-name", a->opts.model_name, "Name clients ask for (default: the file name without extension)");
  sub->add_option("--max-queue", a->opts.max_queue, "Requests waiting for the model at most; past it 503 (default 64)")
      ->check(in_range(1, 4096));
  sub->add_option("--ctx", a->opts.ctx, "Tokens of prompt + completion per request (default: the model's context)")
      ->check(at_least(0, "0 = the model's context"));
  sub->add_option("--max-batch", a->opts.max_batch, "Requests generated together at most (default 8)")
      ->check(in_range(1, 1024));
  sub->add_option("--kv-cache-gb", a->opts.kv_cache_gb,
                  "Paged KV cache size in GB, shared by the running requests in blocks of 16 positions (default: the "
                  "GPU's free memory less a margin, at most --max-batch full contexts)")
      ->check(at_least(0, "0 = the device's free memory"));
  sub->add_option("--prefill-chunk", a->opts.prefill_chunk,
                  "Prompt tokens per scheduling round, so that running streams keep moving (default 512)")
      ->check(in_range(1, 1 << 20));
  sub->add_option("--draft-bits", a->opts.draft_bits,
                  "Any-precision models: draft requests above this width with it (speculative decoding; a request's "
                  "\"draft_bits\" overrides; default 0: off)")
      ->check(in_range(0, 8));
  sub->add_option("--request-timeout", a->opts.request_timeout_s,
                  "Seconds a request may run from its arrival; then it ends with what it has (finish_reason length; "
                  "default 600, 0 = no limit)")
      ->check(at_least(0, "0 = no limit"));
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  add_device_option(sub, a->device);
  sub->callback([a, &common] {
    if (a->opts.model_name.find('@') != std::string::npos)
      fail("--model-name ", a->opts.model_name, ": must not contain '@' (it separates the name from the width)");
    apply_threads(common);
    api::OpenOptions oo;
    oo.device = parse_device(a->device);
    oo.tokenizer_path = common.tokenizer;
    api::Model model = api::Model::open(a->model, oo);
    if (!model.has_tokenizer()) fail(a->model, ": the model carries no tokenizer; serving needs one");
    if (a->opts.draft_bits > 0) model.check_bits(a->opts.draft_bits);
    serve::run_server(model, a->opts);
  });
}

}  // namespace lowbit::cli
