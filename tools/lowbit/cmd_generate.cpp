// lowbit generate MODEL --prompt TEXT: streams a continuation (or a chat reply with --chat) to stdout.
#include <cstdio>
#include <optional>

#include "commands.h"

namespace lowbit::cli {

namespace {
struct GenArgs {
  std::string model, prompt, device = "auto", draft;
  bool stats = true, ignore_eos = false;
  api::GenerateParams params;
};
}  // namespace

void register_generate(CLI::App& app, Common& common) {
  auto a = std::make_shared<GenArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, llama2.c .bin, or .lowbit")->required();
  sub->add_option("-p,--prompt", a->prompt, "Prompt text")->required();
  // The sampling options are checked by the library (api::validate), whose messages state the valid range.
  sub->add_option("-n,--max-tokens", a->params.max_tokens, "Maximum new tokens (default 128)");
  sub->add_option("--temperature", a->params.temperature, "Sampling temperature, >= 0 (0 = greedy, the default)");
  sub->add_option("--top-k", a->params.top_k, "Keep the k most likely tokens (0 = off)");
  sub->add_option("--top-p", a->params.top_p, "Nucleus sampling mass in (0, 1] (1 = off)");
  sub->add_option("--repetition-penalty", a->params.repetition_penalty, "HF-style penalty, > 0 (1 = off)");
  sub->add_option("--seed", a->params.seed, "RNG seed (integer >= 0)")->check(non_negative_integer());
  sub->add_flag("--chat", a->params.chat, "Wrap the prompt in the model's chat template");
  sub->add_option("--system", a->params.system, "System message for --chat");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at end-of-sequence tokens");
  sub->add_option("--stop", a->params.stop, "Stop where the text contains this string (repeatable; not printed)");
  sub->add_flag("!--no-stats", a->stats, "Do not print timing to stderr");
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->add_option("--bits", a->params.bits, "Any-precision models: the width to generate with (default: the widest)");
  sub->add_option("--draft-bits", a->params.draft_bits,
                  "Speculative decoding: draft at this width of the same any-precision model (below --bits), or the "
                  "--draft model's width");
  sub->add_option("--draft", a->draft, "Speculative decoding: a separate draft model with the same vocabulary");
  sub->add_option("--draft-k", a->params.draft_k, "Draft tokens per round, 1..8 (default 0: adaptive)");
  add_device_option(sub, a->device);
  sub->callback([a, sub, &common] {
    apply_threads(common);
    api::GenerateParams p = a->params;
    p.stop_at_eos = !a->ignore_eos;
    api::validate(p);   // before the model is read
    refuse_unless(sub, {"--system"}, p.chat, "needs --chat");
    refuse_unless(sub, {"--top-k", "--top-p", "--seed"}, p.temperature > 0,
                  "applies to sampling (--temperature > 0); --temperature 0, the default, decodes greedily");
    api::OpenOptions oo;
    oo.device = parse_device(a->device);
    oo.tokenizer_path = common.tokenizer;
    refuse_unless(sub, {"--draft-k"}, p.draft_bits > 0 || !a->draft.empty(), "needs --draft-bits or --draft");
    api::Model model = api::Model::open(a->model, oo);
    model.check_bits(p.bits);
    std::optional<api::Model> draft;
    if (!a->draft.empty()) {
      draft.emplace(api::Model::open(a->draft, oo));
      draft->check_bits(p.draft_bits);
      p.draft = &*draft;
    }
    if (!p.chat) std::fputs(a->prompt.c_str(), stdout);
    const api::GenerateResult r = model.generate(a->prompt, p, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    if (a->stats)
      std::fprintf(stderr, "[%s | %zu prompt tokens: %.1f tok/s | %zu new tokens: %.1f tok/s | stop: %s]\n",
                   model.device_name().c_str(), r.prompt_ids.size(), r.prefill_tokens_per_s(), r.new_ids.size(),
                   r.decode_tokens_per_s(), api::stop_reason_name(r.stop_reason));
    if (a->stats && r.target_forwards > 0)
      std::fprintf(stderr, "[speculative: %lld of %lld draft tokens kept (%.1f%%), %.2f tokens per target forward]\n",
                   static_cast<long long>(r.accepted_tokens), static_cast<long long>(r.drafted_tokens),
                   r.drafted_tokens > 0 ? 100.0 * r.accepted_tokens / r.drafted_tokens : 0.0,
                   static_cast<double>(r.new_ids.size()) / r.target_forwards);
  });
}

}  // namespace lowbit::cli
