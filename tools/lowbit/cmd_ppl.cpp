// lowbit ppl MODEL --text FILE: perplexity (the protocol: include/lowbit/model.h, PplParams).
#include <cstdio>

#include "commands.h"

namespace lowbit::cli {

namespace {
struct PplArgs {
  std::string model, text, mode = "auto", abits, device = "auto";
  bool reference = false;
  std::vector<int> bits;
  api::PplParams params;
};

api::TextMode parse_text_mode(const std::string& s) {
  if (s == "plain") return api::TextMode::Plain;
  if (s == "wikitext") return api::TextMode::WikiText;
  if (s == "jsonl") return api::TextMode::Jsonl;
  if (s == "docs") return api::TextMode::Documents;
  return api::TextMode::Auto;
}
}  // namespace

void register_ppl(CLI::App& app, Common& common) {
  auto a = std::make_shared<PplArgs>();
  CLI::App* sub = app.add_subcommand("ppl", "Perplexity of a model on a text (GPTQ/SqueezeLLM/QUIK protocol)");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, llama2.c .bin, or .lowbit")->required();
  sub->add_option("--text", a->text, "Evaluation text (e.g. ../shared/data/wikitext-2-raw/wiki.test.raw)")->required();
  sub->add_option("--ctx", a->params.ctx, "Window length in tokens (default 2048, capped by the model)")
      ->check(at_least(2));
  sub->add_option("--max-windows", a->params.max_windows, "Score only the first N windows (quick runs; 0 = all)")
      ->check(at_least(0, "0 = all"));
  sub->add_option("--text-mode", a->mode, "auto|plain|wikitext|jsonl|docs")
      ->check(CLI::IsMember({"auto", "plain", "wikitext", "jsonl", "docs"}));
  sub->add_option("--jsonl-field", a->params.jsonl_field, "Field holding the text in a .jsonl file (default text)");
  sub->add_option("--doc-separator", a->params.doc_separator,
                  "Score documents separately, split on this string, each with BOS");
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->add_flag("--reference", a->reference, "Use the scalar reference forward (slow; for checking; CPU only)");
  sub->add_option("--bits", a->bits, "Any-precision models: width(s) to evaluate, e.g. 3 or 3,4,8 (one load)")
      ->delimiter(',')
      ->check(at_least(0, "0 = the widest"));
  sub->add_option("--abits", a->abits, "QUIK models: run every quik linear's activations at 4, 8, 16 (unquantized) "
                  "or fp8 instead of the stored width");
  add_device_option(sub, a->device);
  sub->callback([a, sub, &common] {
    apply_threads(common);
    api::PplParams p = a->params;
    p.mode = parse_text_mode(a->mode);
    refuse_unless(sub, {"--doc-separator"}, p.mode == api::TextMode::Auto || p.mode == api::TextMode::Documents,
                  "applies to --text-mode docs only");
    api::validate(p);
    api::OpenOptions oo;
    oo.device = parse_device(a->device);
    oo.tokenizer_path = common.tokenizer;
    oo.quik_abits = a->abits;
    oo.reference = a->reference;
    api::Model model = api::Model::open(a->model, oo);
    for (int b : a->bits) model.check_bits(b);   // refuse a width the model lacks before any work
    const api::EvalWindows w = model.eval_windows_from_file(a->text, p);
    refuse_unless(sub, {"--jsonl-field"}, w.mode == api::TextMode::Jsonl, "applies to .jsonl text only");
    if (w.ctx < p.ctx)
      std::fprintf(stderr, "note: --ctx %d capped to the model's %d positions\n", p.ctx, w.ctx);
    if (w.truncated_tokens > 0)
      std::printf("note: documents longer than --ctx %d are truncated: %lld tokens not scored\n", w.ctx,
                  static_cast<long long>(w.truncated_tokens));
    std::printf("model: %s (%s)\ntext: %s — %s, %lld tokens, %zu windows of <= %d\n", a->model.c_str(),
                api::format_name(model.info().format), a->text.c_str(), w.description.c_str(),
                static_cast<long long>(w.text_tokens), w.windows.size(), w.ctx);
    std::printf("device: %s\n", model.device_name().c_str());
    std::fflush(stdout);
    const auto progress = [](int done, int total, int64_t predicted, double secs) {
      char extra[96];
      std::snprintf(extra, sizeof(extra), "%.0f tok/s", secs > 0 ? static_cast<double>(predicted + done) / secs : 0.0);
      progress_line("ppl", done, total, extra);
    };
    const std::vector<int> widths = a->bits.empty() ? std::vector<int>{0} : a->bits;
    for (int b : widths) {
      p.bits = b;
      const api::PplResult r = model.perplexity(w, p, progress);
      if (b != 0) std::printf("bits: %d\n", b);
      std::printf("windows: %d of %d%s\n", r.windows, r.windows_total,
                  r.windows < r.windows_total ? " (SUBSET: --max-windows)" : "");
      std::printf("predicted tokens: %lld\nmean NLL: %.6f\ntop-1 accuracy: %.4f\nperplexity: %.4f\n",
                  static_cast<long long>(r.predicted_tokens), r.mean_nll, r.top1, r.perplexity);
      std::printf("speed: %.1f tokens/s (%lld tokens in %.2f s)\n", r.tokens_per_s(),
                  static_cast<long long>(r.evaluated_tokens), r.seconds);
      std::fflush(stdout);
    }
  });
}

}  // namespace lowbit::cli
