// lowbit quantize MODEL --method rtn|gptq --bits B [--group G] ... -o OUT.lowbit
// lowbit quantize MODEL --method anyprec --seed-bits 3 --parent-bits 8 [--widths 3,4,6,8] ... -o OUT.lowbit
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/error.h"
#include "quantize/quantize_model.h"

namespace lowbit::cli {

namespace {
struct QuantArgs {
  std::string model, out, method = "gptq", dense = "f32", sensitivity = "fisher";
  QuantizeOptions opts;
  bool no_sequential = false;
  double outliers = -1;   // < 0: the method's default (anyprec 0, mixed24 0.002)
  std::string outliers_from = "2bit", layout = "auto", unit_order = "sensitivity";
  CLI::Option* samples = nullptr;
  CLI::Option* seqlen = nullptr;
};
}  // namespace

void register_quantize(CLI::App& app, Common& common) {
  auto a = std::make_shared<QuantArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "Quantize a model's linear layers and write a .lowbit file");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, or llama2.c .bin")->required();
  sub->add_option("-o,--output", a->out, "Output .lowbit file")->required();
  sub->add_option("--method", a->method, "rtn | gptq | anyprec | mixed24 | quik")
      ->check(CLI::IsMember({"rtn", "gptq", "anyprec", "mixed24", "quik"}));
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
  a->samples = sub->add_option("--calib-samples", a->opts.calib.samples,
                               "Calibration windows (default 128; anyprec 100)")->check(CLI::Range(1, 100000));
  a->seqlen = sub->add_option("--calib-seqlen", a->opts.calib.seqlen,
                              "Tokens per calibration window (default 2048; anyprec 512)")->check(CLI::Range(2, 1 << 20));
  sub->add_option("--seed-bits", a->opts.anyprec.seed_bits, "anyprec: bits of the k-means seed (2..8, default 3)")
      ->check(CLI::Range(2, 8));
  sub->add_option("--parent-bits", a->opts.anyprec.parent_bits, "anyprec: width upscaled to (seed..8, default 8)")
      ->check(CLI::Range(2, 8));
  sub->add_option("--widths", a->opts.anyprec.widths, "anyprec: served widths, e.g. 3,4,6,8 (default: all)")
      ->delimiter(',');
  sub->add_option("--sensitivity", a->sensitivity, "anyprec: fisher | hessian-diag (k-means weights)")
      ->check(CLI::IsMember({"fisher", "hessian-diag"}));
  sub->add_option("--outliers", a->outliers,
                  "anyprec (default 0) / mixed24 (default 0.002, at most 0.02): fraction of weights kept in fp16 (CSR); "
                  "quik: number of fp16 outlier input columns of a dim-wide input (default: --outlier-frac)")
      ->check(CLI::Range(0.0, 1e9));
  sub->add_option("--wbits", a->opts.quik.wbits, "quik: weight bits (4 or 8)")->check(CLI::IsMember({4, 8}));
  sub->add_option("--abits", a->opts.quik.abits, "quik: activation bits at run time (4, 8, or 16 = not quantized)")
      ->check(CLI::IsMember({4, 8, 16}));
  sub->add_flag("--act-fp8", a->opts.quik.act_fp8, "quik: FP8-E4M3 activations with a per-token scale (W4A8)");
  sub->add_option("--outlier-frac", a->opts.quik.outlier_frac,
                  "quik: outlier columns as a fraction of dim (default 0.0625 = the paper's 256 of 4096)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--outlier-threshold", a->opts.quik.outlier_threshold,
                  "quik: a linear whose calibration inputs never exceed this max |x| keeps no outliers (0 = off)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--int8-down-proj", a->opts.quik.int8_down_proj, "quik: down_proj at W8A8");
  sub->add_flag("--clip", a->opts.quik.clip, "quik: search each row's weight clipping on the squared error");
  sub->add_option("--ratio-4bit", a->opts.mixed24.ratio_4bit, "mixed24: fraction of input-channel groups at 4 bits")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--outliers-from", a->outliers_from, "mixed24: 2bit (the paper) | all (ablation)")
      ->check(CLI::IsMember({"2bit", "all"}));
  sub->add_option("--layout", a->layout,
                  "mixed24: auto (the aligned mixed24a wherever k % 64 = 0 and the ratio is 0.25) | aligned | generic")
      ->check(CLI::IsMember({"auto", "aligned", "generic"}));
  sub->add_option("--unit-order", a->unit_order,
                  "mixed24a: sensitivity (units and GPTQ's order by decreasing eq. 9 score) | column")
      ->check(CLI::IsMember({"sensitivity", "column"}));
  sub->add_option("--layers-4bit", a->opts.mixed24_layers_4bit,
                  "mixed24 ablation: these linears (q,k,v,o,gate,up,down) wholly 4-bit, the rest 2-bit")
      ->delimiter(',')
      ->check(CLI::IsMember({"q", "k", "v", "o", "gate", "up", "down"}));
  sub->add_option("--sensitivity-cache", a->opts.sensitivity_cache,
                  "anyprec: safetensors file of sensitivities, read if present (same model and calibration), else written");
  sub->add_option("--kmeans-iters", a->opts.anyprec.max_iter, "anyprec: Lloyd iteration cap (default 100)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", a->opts.calib.seed, "Seed for drawing the calibration windows");
  sub->add_flag("--no-sequential", a->no_sequential, "Calibrate every block on full-precision inputs");
  sub->add_option("--dense-dtype", a->dense, "Unquantized tensors: f32 or f16")->check(CLI::IsMember({"f32", "f16"}));
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->callback([a, &common] {
    apply_threads(common);
    QuantizeOptions o = a->opts;
    o.method = a->method == "rtn"       ? QuantMethod::Rtn
               : a->method == "gptq"    ? QuantMethod::Gptq
               : a->method == "anyprec" ? QuantMethod::AnyPrec
               : a->method == "quik"    ? QuantMethod::Quik
                                        : QuantMethod::Mixed24;
    if (o.method == QuantMethod::Quik) {
      LOWBIT_CHECK(a->outliers < 0 || a->outliers == std::floor(a->outliers), "quik: --outliers is a column count, got ",
                   a->outliers);
      o.quik.outliers = a->outliers < 0 ? -1 : static_cast<int64_t>(a->outliers);
      o.quik.percdamp = o.gptq.percdamp;
      validate_quik_options(o.quik);   // before loading the model
    } else {
      LOWBIT_CHECK(a->outliers < 0.5, "--outliers is a fraction of the weights below 0.5 for ", a->method, ", got ",
                   a->outliers);
    }
    o.anyprec.outlier_fraction = a->outliers < 0 ? 0.0 : a->outliers;
    o.mixed24.outlier_fraction = a->outliers < 0 ? 0.002 : a->outliers;
    o.mixed24.outliers_from_all_groups = a->outliers_from == "all";
    o.mixed24.percdamp = o.gptq.percdamp;
    o.mixed24.layout = a->layout == "aligned"   ? Mixed24Options::Layout::Aligned
                       : a->layout == "generic" ? Mixed24Options::Layout::Generic
                                                : Mixed24Options::Layout::Auto;
    o.mixed24.unit_order_by_sensitivity = a->unit_order == "sensitivity";
    LOWBIT_CHECK(o.mixed24.layout != Mixed24Options::Layout::Aligned ||
                     (o.mixed24_layers_4bit.empty() && o.mixed24.ratio_4bit == 0.25),
                 "--layout aligned needs --ratio-4bit 0.25 and no --layers-4bit (other allocations use --layout generic)");
    if (o.method == QuantMethod::Mixed24) validate_mixed24_options(o.mixed24);   // before loading the model
    o.sensitivity = a->sensitivity == "fisher" ? Sensitivity::Fisher : Sensitivity::HessianDiag;
    if (o.method == QuantMethod::AnyPrec) {   // the any-precision paper's calibration: 100 x 512 from C4
      if (a->samples->count() == 0) o.calib.samples = 100;
      if (a->seqlen->count() == 0) o.calib.seqlen = 512;
      anyprec_width_mask(o.anyprec);   // refuse bad widths before loading anything
    }
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
    if (o.method == QuantMethod::AnyPrec)
      std::printf("quantize %s: anyprec, seed %d bits upscaled to %d, %s sensitivity, calibration %d x %d%s\n",
                  a->model.c_str(), o.anyprec.seed_bits, o.anyprec.parent_bits, a->sensitivity.c_str(),
                  o.calib.samples, o.calib.seqlen,
                  o.anyprec.outlier_fraction > 0 ? (", outliers " + std::to_string(o.anyprec.outlier_fraction)).c_str() : "");
    else if (o.method == QuantMethod::Quik)
      std::printf("quantize %s: quik W%dA%d%s, outlier columns %s%s%s, calibration %d x %d\n", a->model.c_str(),
                  o.quik.wbits, o.quik.abits, o.quik.act_fp8 ? " (fp8 activations)" : "",
                  o.quik.outliers >= 0 ? std::to_string(o.quik.outliers).c_str()
                                       : ("fraction " + std::to_string(o.quik.outlier_frac) + " of dim").c_str(),
                  o.quik.int8_down_proj ? ", down_proj W8A8" : "", o.quik.clip ? ", clipping" : "",
                  o.calib.samples, o.calib.seqlen);
    else if (o.method == QuantMethod::Mixed24)
      std::printf("quantize %s: mixed24, %.0f%% of 16-column groups at 4 bits, %.2f%% outliers from %s groups, "
                  "calibration %d x %d\n", a->model.c_str(), 100 * o.mixed24.ratio_4bit, 100 * o.mixed24.outlier_fraction,
                  o.mixed24.outliers_from_all_groups ? "all" : "2-bit", o.calib.samples, o.calib.seqlen);
    else std::printf("quantize %s: %s, %d bits, %s%s\n", a->model.c_str(), a->method.c_str(), o.gptq.spec.bits,
                o.gptq.spec.group_size > 0 ? ("group " + std::to_string(o.gptq.spec.group_size)).c_str() : "per channel",
                o.method == QuantMethod::Gptq
                    ? (", calibration " + std::to_string(o.calib.samples) + " x " + std::to_string(o.calib.seqlen)).c_str()
                    : "");
    std::fflush(stdout);
    const QuantizeReport r = quantize_to_file(*model, o, a->out, [&](int done, int total, const std::string& what) {
      if (what == "fisher") progress_line("fisher", done, total, "calibration windows (forward + backward)");
      else progress_line("quantize", done, total, "blocks of " + std::to_string(c.n_layers));
    });
    std::printf("wrote %s\n  quantized weights: %lld in %d blocks\n  average bits per quantized weight: %.4f "
                "(everything stored counted: codes or planes, scales, zeros, LUTs, indices, outliers)\n  file size: %.2f MiB\n  time: %.1f s\n",
                a->out.c_str(), static_cast<long long>(r.quantized_weights), c.n_layers, r.avg_bits,
                r.file_bytes / 1048576.0, r.seconds);
    if (o.method == QuantMethod::AnyPrec) {
      std::printf("  sensitivity (%s) time: %.1f s%s\n", a->sensitivity.c_str(), r.sensitivity_seconds,
                  r.sensitivity_from_cache ? (" (read from " + o.sensitivity_cache + ")").c_str()
                  : o.sensitivity == Sensitivity::Fisher
                      ? (" (mean calibration loss " + std::to_string(r.mean_calib_loss) + ")").c_str() : "");
      std::printf("  k-means seed + upscaling + packing time: %.1f s\n", r.seconds - r.sensitivity_seconds);
      for (const auto& [b, bits] : r.width_avg_bits)
        std::printf("  width %d: %.4f bits per weight read (planes 0..%d, LUT, outliers); weighted error %.6g\n", b,
                    bits, b - 1, r.width_weighted_error.at(b));
    }
    if (o.method == QuantMethod::Mixed24)
      std::printf("  outliers kept: %lld; layer objective sum_l tr(dW H dWT): %.6g\n"
                  "  layouts: %d linears mixed24a (aligned), %d mixed24 (generic)\n"
                  "  paper-style average bits (eq. 10: codes, first-order scales and zeros, outlier values only): %.4f\n",
                  static_cast<long long>(r.outliers), r.hessian_error_sum, r.mixed24_aligned_linears,
                  r.mixed24_generic_linears, r.paper_avg_bits);
    if (o.method == QuantMethod::Quik)
      std::printf("  fp16 outlier columns: %lld over all linears (%d linears below the threshold kept none); "
                  "layer objective sum_l tr(dW H dWT): %.6g\n",
                  static_cast<long long>(r.quik_outlier_columns), r.quik_linears_without_outliers, r.hessian_error_sum);
    if (o.method == QuantMethod::Gptq)
      std::printf("  layer objective sum_l tr(dW H dWT): GPTQ %.6g vs RTN %.6g on the same Hessians (%.1f%% lower)\n",
                  r.hessian_error_sum, r.rtn_hessian_error_sum,
                  100.0 * (1.0 - r.hessian_error_sum / std::max(r.rtn_hessian_error_sum, 1e-300)));
  });
}

}  // namespace lowbit::cli
