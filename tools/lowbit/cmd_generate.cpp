// lowbit generate MODEL --prompt TEXT: streams a continuation (or a chat reply with --chat) to stdout.
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "runtime/chat_template.h"
#include "runtime/generate.h"
#ifdef LOWBIT_WITH_CUDA
#include "cuda/gpu_runtime.h"
#endif

namespace lowbit::cli {

namespace {
struct GenArgs {
  std::string model, prompt, system;
  bool chat = false, stats = true, ignore_eos = false;
  std::string device = "auto";
  GenerateOptions opts;
};
}  // namespace

void register_generate(CLI::App& app, Common& common) {
  auto a = std::make_shared<GenArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, or llama2.c .bin")->required();
  sub->add_option("-p,--prompt", a->prompt, "Prompt text")->required();
  sub->add_option("-n,--max-tokens", a->opts.max_new_tokens, "Maximum new tokens")->check(CLI::NonNegativeNumber);
  sub->add_option("--temperature", a->opts.sampling.temperature, "0 = greedy (default)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", a->opts.sampling.top_k, "Keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", a->opts.sampling.top_p, "Nucleus sampling mass (1 = off)")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--repetition-penalty", a->opts.sampling.repetition_penalty, "HF-style penalty (1 = off)");
  sub->add_option("--seed", a->opts.sampling.seed, "RNG seed");
  sub->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  sub->add_option("--system", a->system, "System message for --chat");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at end-of-sequence tokens");
  sub->add_flag("!--no-stats", a->stats, "Do not print timing to stderr");
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->add_option("--bits", a->opts.bits, "Any-precision models: the width to generate with (default: the widest)");
  add_device_option(sub, a->device);
  sub->callback([a, &common] {
    apply_threads(common);
    validate_sampling(a->opts.sampling);
    LoadOptions lo;
    lo.tokenizer_path = common.tokenizer;
    auto model = Model::load(a->model, lo);
    model->check_bits(a->opts.bits);
    const bool gpu = use_cuda(a->device, *model);
#ifdef LOWBIT_WITH_CUDA
    std::unique_ptr<cuda::GpuModel> gmodel;
    if (gpu) gmodel = std::make_unique<cuda::GpuModel>(*model);
#endif
    const Tokenizer& tok = model->tokenizer();
    std::vector<int32_t> ids;
    if (a->chat) {
      std::vector<ChatMessage> msgs;
      if (!a->system.empty()) msgs.push_back({"system", a->system});
      msgs.push_back({"user", a->prompt});
      const std::string bos = tok.bos_id() >= 0 ? tok.token_bytes(tok.bos_id(), true) : "";
      const std::string text = apply_chat_template(tok.vocab().chat_template, msgs, bos);
      ids = tok.encode(text, /*add_bos=*/false, /*parse_special=*/true);
    } else {
      LOWBIT_CHECK(a->system.empty(), "--system needs --chat");
      ids = tok.encode(a->prompt, tok.add_bos_default() || tok.kind() == TokenizerKind::SentencePieceBpe,
                       /*parse_special=*/false);
      std::fputs(a->prompt.c_str(), stdout);
    }
    a->opts.stop_at_eos = !a->ignore_eos;
    const auto emit = [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
#ifdef LOWBIT_WITH_CUDA
    const GenerateResult r = gpu ? cuda::generate_gpu(*gmodel, tok, ids, a->opts, emit) : generate(*model, ids, a->opts, emit);
#else
    const GenerateResult r = generate(*model, ids, a->opts, emit);
#endif
    std::fputc('\n', stdout);
    if (a->stats) {
      std::fprintf(stderr, "[%s | %zu prompt tokens: %.1f tok/s | %zu new tokens: %.1f tok/s | stop: %s]\n",
                   gpu ? device_description().c_str() : "cpu",
                   r.prompt_ids.size(), r.prefill_seconds > 0 ? r.prompt_ids.size() / r.prefill_seconds : 0.0,
                   r.new_ids.size(), r.decode_seconds > 0 ? r.new_ids.size() / r.decode_seconds : 0.0,
                   r.stop_reason.c_str());
    }
  });
}

}  // namespace lowbit::cli
