// lowbit inspect MODEL: architecture, tokenizer, every tensor with dtype/shape/bytes, totals; for .lowbit files the
// packed weights and what each any-precision width reads.
#include <cstdio>

#include "commands.h"

namespace lowbit::cli {

namespace {

// Any-precision files: what each served width reads, and one parent against separate per-width models (the
// paper's Table 1).
void print_widths(const api::FileInfo& f) {
  if (f.widths.empty()) return;
  std::printf("\nany-precision widths (one file serves them all; bytes read per forward at each width):\n");
  std::printf("  %5s %14s %16s %18s\n", "width", "bits/weight", "quantized MiB", "model MiB (+dense)");
  for (const api::WidthRead& w : f.widths)
    std::printf("  %5d %14.4f %16.2f %18.2f\n", w.bits, w.bits_per_weight, w.quantized_bytes / 1048576.0,
                w.model_bytes / 1048576.0);
  std::printf("  one parent file: %.2f MiB; separate models, one per width: %.2f MiB (parent = %.1f%% of them)\n",
              f.parent_bytes / 1048576.0, f.separate_models_bytes / 1048576.0,
              100.0 * f.parent_bytes / f.separate_models_bytes);
}

}  // namespace

void register_inspect(CLI::App& app, Common& common) {
  auto path = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("inspect", "Show a model's architecture, tensors, dtypes, parameters and bytes");
  sub->add_option("model", *path, "Model: HF directory, .gguf, llama2.c .bin, or .lowbit")->required();
  sub->add_flag("--summary", *quiet, "Only the summary, not every tensor");
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->callback([path, quiet, &common] {
    api::InspectOptions io;
    io.tokenizer_path = common.tokenizer;
    const api::FileInfo f = api::inspect(*path, io);
    const api::ModelInfo& c = f.model;
    std::printf("model: %s\nformat: %s\narchitecture: %s%s\n", c.path.c_str(), api::format_name(c.format),
                c.arch.c_str(), c.name.empty() ? "" : (" (" + c.name + ")").c_str());
    std::printf("dim %d, ffn %d, layers %d, heads %d, kv heads %d, head_dim %d, vocab %d, context %d\n", c.dim,
                c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.max_seq_len);
    std::printf("rope theta %g%s, rms eps %g, tied embeddings %s, qkv bias %s\n", c.rope_theta,
                c.llama3_rope_scaling ? " (llama3 scaling)" : "", c.rms_eps, c.tie_embeddings ? "yes" : "no",
                c.qkv_bias ? "yes" : "no");
    const api::TokenizerInfo& t = f.tokenizer;
    if (t.present)
      std::printf("tokenizer: %s, %d tokens, bos %d, eos %d%s\n",
                  (t.pretokenizer.empty() ? t.kind : t.kind + " (pre: " + t.pretokenizer + ")").c_str(), t.tokens,
                  t.bos_id, t.eos_id, t.chat_template ? ", chat template" : "");
    else
      std::printf("tokenizer: none\n");
    if (!*quiet) {
      std::printf("\n%-48s %-6s %-16s %12s\n", "tensor", "dtype", "shape", "bytes");
      for (const api::TensorInfo& ti : f.tensors)
        std::printf("%-48s %-6s %-16s %12llu\n", ti.name.c_str(), ti.dtype.c_str(), api::shape_string(ti.shape).c_str(),
                    static_cast<unsigned long long>(ti.bytes));
    }
    if (!f.packed.empty()) {
      std::printf("\nmethod: %s\n", c.quantization.c_str());
      if (!*quiet) {
        std::printf("\n%-48s %-8s %-16s %10s  %s\n", "packed weight", "format", "shape", "bits/w", "params");
        for (const api::PackedTensorInfo& pi : f.packed) {
          int64_t n = 1;
          for (int64_t d : pi.shape) n *= d;
          std::string params;
          for (const auto& [k, v] : pi.params) params += k + "=" + std::to_string(v) + " ";
          std::printf("%-48s %-8s %-16s %10.4f  %s\n", pi.name.c_str(), pi.format.c_str(),
                      api::shape_string(pi.shape).c_str(), n ? static_cast<double>(pi.stored_bits) / n : 0.0,
                      params.c_str());
        }
      }
    }
    const double total_bits = f.total_bits();
    const size_t count = f.tensors.size() + f.packed.size();
    std::printf("\n%zu tensors%s, %lld parameters (%.2f M), %.0f bytes (%.2f MiB), %.3f bits/weight\n", count,
                f.packed.empty() ? "" : (" (" + std::to_string(f.packed.size()) + " packed)").c_str(),
                static_cast<long long>(f.params), f.params / 1e6, total_bits / 8.0, total_bits / 8.0 / 1048576.0,
                f.params ? total_bits / static_cast<double>(f.params) : 0.0);
    if (!f.packed.empty())
      std::printf("  packed  %12lld params %12.0f bytes  %.4f bits/weight (every stored bit counted)\n",
                  static_cast<long long>(f.packed_params), f.packed_bits / 8.0,
                  f.packed_bits / static_cast<double>(f.packed_params));
    for (const api::DTypeTotal& d : f.dtype_totals)
      std::printf("  %-6s %12lld params %12llu bytes\n", d.dtype.c_str(), static_cast<long long>(d.params),
                  static_cast<unsigned long long>(d.bytes));
    print_widths(f);
  });
}

}  // namespace lowbit::cli
