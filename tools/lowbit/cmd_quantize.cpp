// lowbit quantize MODEL --method rtn|gptq --bits B [--group G] ... -o OUT.lowbit
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/error.h"
#include "quantize/quantize_model.h"

namespace lowbit::cli {

namespace {
struct QuantArgs {
  std::string model, out, method = "gptq", dense = "f32";
  QuantizeOptions opts;
  bool no_sequential = false;
};
}  // namespace

void register_quantize(CLI::App& app, Common& common) {
  auto a = std::make_shared<QuantArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "Quantize a model's linear layers and write a .lowbit file");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, or llama2.c .bin")->required();
  sub->add_option("-o,--output", a->out, "Output .lowbit file")->required();
  sub->add_option("--method", a->method, "rtn | gptq")->check(CLI::IsMember({"rtn", "gptq"}));
  sub->add_option("--bits", a->opts.gptq.spec.bits, "Weight bits (2..8)")->check(CLI::Range(2, 8));
  sub->add_option("--group", a->opts.gptq.spec.group_size, "Group size along the input (0 = per channel)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--sym", a->opts.gptq.spec.symmetric, "Symmetric quantization (default asymmetric)");
  sub->add_flag("--mse-clip", a->opts.gptq.spec.mse_clip, "Search a clipping range minimising |err|^2.4");
  sub->add_flag("--act-order", a->opts.gptq.act_order, "GPTQ: quantize columns by decreasing Hessian diagonal");
  sub->add_flag("--static-groups", a->opts.gptq.static_groups, "GPTQ: group parameters from the original order");
  sub->add_option("--percdamp", a->opts.gptq.percdamp, "GPTQ: damping as a fraction of mean(diag H)")
      ->check(CLI::Range(1e-6, 10.0));
  sub->add_option("--calib", a->opts.calib.file, "Calibration text or .jsonl (default: the shared C4 sample)");
  sub->add_option("--calib-samples", a->opts.calib.samples, "Calibration windows")->check(CLI::Range(1, 100000));
  sub->add_option("--calib-seqlen", a->opts.calib.seqlen, "Tokens per calibration window")->check(CLI::Range(2, 1 << 20));
  sub->add_option("--seed", a->opts.calib.seed, "Seed for drawing the calibration windows");
  sub->add_flag("--no-sequential", a->no_sequential, "Calibrate every block on full-precision inputs");
  sub->add_option("--dense-dtype", a->dense, "Unquantized tensors: f32 or f16")->check(CLI::IsMember({"f32", "f16"}));
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->callback([a, &common] {
    apply_threads(common);
    QuantizeOptions o = a->opts;
    o.method = a->method == "rtn" ? QuantMethod::Rtn : QuantMethod::Gptq;
    o.sequential = !a->no_sequential;
    o.dense_dtype = a->dense == "f16" ? DType::F16 : DType::F32;
    const std::filesystem::path out(a->out);
    std::error_code ec;
    LOWBIT_CHECK(!out.has_parent_path() || std::filesystem::is_directory(out.parent_path(), ec), a->out,
                 ": the directory does not exist");
    LOWBIT_CHECK(!std::filesystem::is_directory(out, ec), a->out, ": is a directory");
    LoadOptions lo;
    lo.tokenizer_path = common.tokenizer;
    auto model = Model::load(a->model, lo);
    validate_uniform_spec(o.gptq.spec, model->config().dim);
    const ModelConfig& c = model->config();
    std::printf("quantize %s: %s, %d bits, %s%s\n", a->model.c_str(), a->method.c_str(), o.gptq.spec.bits,
                o.gptq.spec.group_size > 0 ? ("group " + std::to_string(o.gptq.spec.group_size)).c_str() : "per channel",
                o.method == QuantMethod::Gptq
                    ? (", calibration " + std::to_string(o.calib.samples) + " x " + std::to_string(o.calib.seqlen)).c_str()
                    : "");
    std::fflush(stdout);
    const QuantizeReport r = quantize_to_file(*model, o, a->out, [&](int done, int total, const std::string&) {
      progress_line("quantize", done, total, "blocks of " + std::to_string(c.n_layers));
    });
    std::printf("wrote %s\n  quantized weights: %lld in %d blocks\n  average bits per quantized weight: %.4f "
                "(codes, scales, zeros, group indices counted)\n  file size: %.2f MiB\n  time: %.1f s\n",
                a->out.c_str(), static_cast<long long>(r.quantized_weights), c.n_layers, r.avg_bits,
                r.file_bytes / 1048576.0, r.seconds);
    if (o.method == QuantMethod::Gptq)
      std::printf("  layer objective sum_l tr(dW H dWT): GPTQ %.6g vs RTN %.6g on the same Hessians (%.1f%% lower)\n",
                  r.hessian_error_sum, r.rtn_hessian_error_sum,
                  100.0 * (1.0 - r.hessian_error_sum / std::max(r.rtn_hessian_error_sum, 1e-300)));
  });
}

}  // namespace lowbit::cli
