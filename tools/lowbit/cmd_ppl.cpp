// lowbit ppl MODEL --text FILE: perplexity (see src/runtime/perplexity.h for the protocol).
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "runtime/eval_text.h"
#include "runtime/perplexity.h"
#ifdef LOWBIT_WITH_CUDA
#include "cuda/gpu_runtime.h"
#endif

namespace lowbit::cli {

namespace {
struct PplArgs {
  std::string model, text, mode = "auto", jsonl_field = "text", doc_separator;
  int ctx = 2048, max_windows = 0;
  bool reference = false;
  std::vector<int> bits;
  std::string abits;
  std::string device = "auto";
};
}  // namespace

void register_ppl(CLI::App& app, Common& common) {
  auto args = std::make_shared<PplArgs>();
  CLI::App* sub = app.add_subcommand("ppl", "Perplexity of a model on a text (GPTQ/SqueezeLLM/QUIK protocol)");
  sub->add_option("model", args->model, "Model: HF directory, .gguf, or llama2.c .bin")->required();
  sub->add_option("--text", args->text, "Evaluation text (e.g. ../shared/data/wikitext-2-raw/wiki.test.raw)")->required();
  sub->add_option("--ctx", args->ctx, "Window length in tokens (default 2048, capped by the model)")->check(CLI::Range(2, 1 << 20));
  sub->add_option("--max-windows", args->max_windows, "Score only the first N windows (quick runs; 0 = all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--text-mode", args->mode, "auto|plain|wikitext|jsonl|docs");
  sub->add_option("--jsonl-field", args->jsonl_field, "Field holding the text in a .jsonl file");
  sub->add_option("--doc-separator", args->doc_separator, "Score documents separately, split on this string, each with BOS");
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->add_flag("--reference", args->reference, "Use the scalar reference forward (slow; for checking)");
  sub->add_option("--bits", args->bits, "Any-precision models: width(s) to evaluate, e.g. 3 or 3,4,8 (one load)")
      ->delimiter(',');
  sub->add_option("--abits", args->abits, "QUIK models: run every quik linear's activations at 4, 8, 16 (unquantized) "
                  "or fp8 instead of the stored width");
  add_device_option(sub, args->device);
  sub->callback([args, &common] {
    apply_threads(common);
    LoadOptions lo;
    lo.tokenizer_path = common.tokenizer;
    lo.quik_abits = args->abits;
    auto model = Model::load(args->model, lo);
    for (int b : args->bits) model->check_bits(b);   // refuse a width the model lacks before any work
    const bool gpu = use_cuda(args->device, *model, args->reference);
#ifdef LOWBIT_WITH_CUDA
    std::unique_ptr<cuda::GpuModel> gmodel;
    if (gpu) gmodel = std::make_unique<cuda::GpuModel>(*model);
#endif
    const Tokenizer& tok = model->tokenizer();
    const EvalText text = load_eval_text(args->text, parse_text_mode(args->mode), args->jsonl_field, args->doc_separator);
    int ctx = args->ctx;
    if (ctx > model->config().max_seq_len) {
      std::fprintf(stderr, "note: --ctx %d capped to the model's %d positions\n", ctx, model->config().max_seq_len);
      ctx = model->config().max_seq_len;
    }
    std::vector<std::vector<int32_t>> windows;
    int64_t text_tokens = 0;
    if (text.mode == TextMode::Documents) {
      LOWBIT_CHECK(tok.bos_id() >= 0, args->model, ": documents mode needs a BOS token, the tokenizer has none");
      std::vector<std::vector<int32_t>> docs;
      for (const auto& d : text.docs) {
        docs.push_back(tok.encode(d, /*add_bos=*/true, /*parse_special=*/false));
        text_tokens += static_cast<int64_t>(docs.back().size());
      }
      int64_t dropped = 0;
      windows = make_windows_documents(docs, ctx, &dropped);
      if (dropped > 0)
        std::printf("note: documents longer than --ctx %d are truncated: %lld tokens not scored\n", ctx,
                    static_cast<long long>(dropped));
    } else {
      // parse_special=false: evaluation text is data, never control tokens.
      const std::vector<int32_t> ids = tok.encode(text.docs[0], tok.add_bos_default(), /*parse_special=*/false);
      text_tokens = static_cast<int64_t>(ids.size());
      windows = make_windows_contiguous(ids, ctx);
    }
    std::printf("model: %s (%s)\ntext: %s — %s, %lld tokens, %zu windows of <= %d\n", args->model.c_str(),
                model_format_name(model->weights().format), args->text.c_str(), text.describe().c_str(),
                static_cast<long long>(text_tokens), windows.size(), ctx);
    std::printf("device: %s\n", gpu ? device_description().c_str() : "cpu");
    std::fflush(stdout);
    PplOptions po;
    po.ctx = ctx;
    po.max_windows = args->max_windows;
    po.reference_path = args->reference;
    po.progress = [](int done, int total, int64_t predicted, double secs) {
      char extra[96];
      std::snprintf(extra, sizeof(extra), "%.0f tok/s", secs > 0 ? static_cast<double>(predicted + done) / secs : 0.0);
      progress_line("ppl", done, total, extra);
    };
    const std::vector<int> widths = args->bits.empty() ? std::vector<int>{0} : args->bits;
    for (int b : widths) {
      po.bits = b;
#ifdef LOWBIT_WITH_CUDA
      const PplResult r = gpu ? cuda::perplexity_gpu(*gmodel, windows, po) : perplexity(*model, windows, po);
#else
      const PplResult r = perplexity(*model, windows, po);
#endif
      if (b != 0) std::printf("bits: %d\n", b);
      std::printf("windows: %d of %d%s\n", r.windows, r.windows_total,
                  r.windows < r.windows_total ? " (SUBSET: --max-windows)" : "");
      std::printf("predicted tokens: %lld\nmean NLL: %.6f\ntop-1 accuracy: %.4f\nperplexity: %.4f\n",
                  static_cast<long long>(r.predicted), r.mean_nll, r.top1, r.ppl);
      std::printf("speed: %.1f tokens/s (%lld tokens in %.2f s)\n", r.tokens_per_s(),
                  static_cast<long long>(r.evaluated), r.seconds);
      std::fflush(stdout);
    }
  });
}

}  // namespace lowbit::cli
