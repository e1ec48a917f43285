// lowbit inspect MODEL: architecture, tokenizer, every tensor with dtype/shape/bytes, totals.
#include <cstdio>
#include <map>

#include "commands.h"
#include "formats/format_table.h"
#include "formats/anyprec/layout.h"
#include "io/lowbit_file.h"
#include "model/weight_set.h"

namespace lowbit::cli {

namespace {

// Any-precision files: what each served width reads, and one parent against separate per-width models (the
// paper's Table 1). A separately quantized b-bit model of this format stores exactly what the b-bit view reads.
// packed_params / packed_bits: the totals over every packed weight that the caller has already counted.
void print_anyprec_widths(const WeightSet& ws, double dense_bytes, int64_t packed_params, double packed_bits) {
  uint32_t common = ~0u;
  bool any = false;
  for (const auto& [name, w] : ws.packed)
    if (w.format == "anyprec") {
      common &= static_cast<uint32_t>(w.params.at("widths"));
      any = true;
    }
  if (!any) return;
  const int64_t weights = packed_params;
  const double stored = packed_bits / 8.0;
  std::printf("\nany-precision widths (one file serves them all; bytes read per forward at each width):\n");
  std::printf("  %5s %14s %16s %18s\n", "width", "bits/weight", "quantized MiB", "model MiB (+dense)");
  double separate = 0;
  for (int b = 0; b < 32; ++b) {
    if (((common >> b) & 1u) == 0) continue;
    double bytes = 0;
    for (const auto& [name, w] : ws.packed)
      bytes += w.format == "anyprec" ? static_cast<double>(anyprec_view_bits(w, b)) / 8.0
                                     : static_cast<double>(packed_stored_bits(w, ws.path + ": " + name)) / 8.0;
    separate += bytes + dense_bytes;
    std::printf("  %5d %14.4f %16.2f %18.2f\n", b, 8.0 * bytes / static_cast<double>(weights), bytes / 1048576.0,
                (bytes + dense_bytes) / 1048576.0);
  }
  std::printf("  one parent file: %.2f MiB; separate models, one per width: %.2f MiB (parent = %.1f%% of them)\n",
              (stored + dense_bytes) / 1048576.0, separate / 1048576.0, 100.0 * (stored + dense_bytes) / separate);
}

}  // namespace


void register_inspect(CLI::App& app, Common& common) {
  auto path = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("inspect", "Show a model's architecture, tensors, dtypes, parameters and bytes");
  sub->add_option("model", *path, "Model: HF directory, .gguf, or llama2.c .bin")->required();
  sub->add_flag("--summary", *quiet, "Only the summary, not every tensor");
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->callback([path, quiet, &common] {
    LoadOptions lo;
    lo.tokenizer_path = common.tokenizer;
    const WeightSet ws = read_weights(*path, lo);
    const ModelConfig& c = ws.config;
    std::printf("model: %s\nformat: %s\narchitecture: %s%s\n", ws.path.c_str(), model_format_name(ws.format),
                c.arch.c_str(), c.name.empty() ? "" : (" (" + c.name + ")").c_str());
    std::printf("dim %d, ffn %d, layers %d, heads %d, kv heads %d, head_dim %d, vocab %d, context %d\n", c.dim,
                c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.max_seq_len);
    std::printf("rope theta %g%s, rms eps %g, tied embeddings %s, qkv bias %s\n", c.rope_theta,
                c.rope_scaling == RopeScaling::Llama3 ? " (llama3 scaling)" : "", c.rms_eps,
                c.tie_embeddings ? "yes" : "no", c.qkv_bias ? "yes" : "no");
    if (ws.vocab) {
      std::printf("tokenizer: %s, %zu tokens, bos %d, eos %d%s\n",
                  ws.vocab->kind == TokenizerKind::ByteLevelBpe ? ("byte-level BPE (pre: " + ws.vocab->pre + ")").c_str()
                                                                : "SentencePiece BPE",
                  ws.vocab->tokens.size(), ws.vocab->bos_id, ws.vocab->eos_id,
                  ws.vocab->chat_template.empty() ? "" : ", chat template");
    } else {
      std::printf("tokenizer: none\n");
    }
    int64_t params = 0;
    uint64_t bytes = 0;
    std::map<std::string, std::pair<int64_t, uint64_t>> by_type;
    if (!*quiet) std::printf("\n%-48s %-6s %-16s %12s\n", "tensor", "dtype", "shape", "bytes");
    for (const auto& [name, t] : ws.tensors) {
      params += t.numel();
      bytes += t.nbytes;
      auto& bt = by_type[std::string(dtype_info(t.dtype).name)];
      bt.first += t.numel();
      bt.second += t.nbytes;
      if (!*quiet)
        std::printf("%-48s %-6s %-16s %12llu\n", name.c_str(), std::string(dtype_info(t.dtype).name).c_str(),
                    shape_str(t.shape).c_str(), static_cast<unsigned long long>(t.nbytes));
    }
    // Packed (quantized) weights of .lowbit files: format, parameters and every stored bit.
    int64_t packed_params = 0;
    double packed_bits = 0;
    if (!ws.packed.empty()) {
      std::printf("\nmethod: %s\n", lowbit_method_json(ws.path).c_str());
      if (!*quiet) std::printf("\n%-48s %-8s %-16s %10s  %s\n", "packed weight", "format", "shape", "bits/w", "params");
    }
    for (const auto& [name, w] : ws.packed) {
      int64_t n = 1;
      for (int64_t d : w.shape) n *= d;
      const double b = static_cast<double>(packed_stored_bits(w, ws.path + ": " + name));
      packed_params += n;
      packed_bits += b;
      if (*quiet) continue;
      std::string p;
      for (const auto& [k, v] : w.params) p += k + "=" + std::to_string(v) + " ";
      std::printf("%-48s %-8s %-16s %10.4f  %s\n", name.c_str(), w.format.c_str(), shape_str(w.shape).c_str(),
                  n ? b / static_cast<double>(n) : 0.0, p.c_str());
    }
    params += packed_params;
    const double total_bits = 8.0 * static_cast<double>(bytes) + packed_bits;
    std::printf("\n%zu tensors%s, %lld parameters (%.2f M), %.0f bytes (%.2f MiB), %.3f bits/weight\n",
                ws.tensors.size() + ws.packed.size(), ws.packed.empty() ? "" : (" (" + std::to_string(ws.packed.size()) + " packed)").c_str(),
                static_cast<long long>(params), params / 1e6, total_bits / 8.0, total_bits / 8.0 / 1048576.0,
                params ? total_bits / static_cast<double>(params) : 0.0);
    if (!ws.packed.empty())
      std::printf("  packed  %12lld params %12.0f bytes  %.4f bits/weight (every stored bit counted)\n",
                  static_cast<long long>(packed_params), packed_bits / 8.0, packed_bits / static_cast<double>(packed_params));
    for (const auto& [type, pb] : by_type)
      std::printf("  %-6s %12lld params %12llu bytes\n", type.c_str(), static_cast<long long>(pb.first),
                  static_cast<unsigned long long>(pb.second));
    print_anyprec_widths(ws, static_cast<double>(bytes), packed_params, packed_bits);
  });
}

}  // namespace lowbit::cli
