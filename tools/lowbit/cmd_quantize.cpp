// lowbit quantize MODEL --method rtn|gptq --bits B [--group G] ... -o OUT.lowbit
// lowbit quantize MODEL --method anyprec --seed-bits 3 --parent-bits 8 [--widths 3,4,8] ... -o OUT.lowbit
// An option that does not apply to the chosen method is refused, naming the method it belongs to.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "commands.h"

namespace lowbit::cli {

namespace {

struct QuantArgs {
  std::string model, out, method = "gptq", dense = "f32", sensitivity = "fisher";
  std::string outliers_from = "2bit", layout = "auto", unit_order = "sensitivity";
  std::vector<std::string> layers_4bit;
  std::string device = "auto";
  bool no_sequential = false;
  double outliers = -1;   // --outliers: anyprec / mixed24 fraction, quik column count; < 0: the method's default
  api::QuantizeOptions opts;
};

using M = api::QuantMethod;
// Which methods read each method-specific option. Options not listed (--output, --dense-dtype, --tokenizer) apply
// to every method.
struct Applies {
  const char* option;
  std::vector<M> methods;
};
const std::vector<Applies>& option_methods() {
  static const std::vector<Applies> table = {
      {"--bits", {M::Rtn, M::Gptq}},
      {"--group", {M::Rtn, M::Gptq}},
      {"--sym", {M::Rtn, M::Gptq}},
      {"--mse-clip", {M::Rtn, M::Gptq}},
      {"--act-order", {M::Gptq}},
      {"--static-groups", {M::Gptq}},
      {"--percdamp", {M::Gptq, M::Mixed24, M::Quik}},
      {"--no-sequential", {M::Gptq, M::Mixed24, M::Quik}},
      {"--calib", {M::Gptq, M::AnyPrec, M::Mixed24, M::Quik}},
      {"--calib-samples", {M::Gptq, M::AnyPrec, M::Mixed24, M::Quik}},
      {"--calib-seqlen", {M::Gptq, M::AnyPrec, M::Mixed24, M::Quik}},
      {"--seed", {M::Gptq, M::AnyPrec, M::Mixed24, M::Quik}},
      {"--outliers", {M::AnyPrec, M::Mixed24, M::Quik}},
      {"--seed-bits", {M::AnyPrec}},
      {"--parent-bits", {M::AnyPrec}},
      {"--widths", {M::AnyPrec}},
      {"--sensitivity", {M::AnyPrec}},
      {"--sensitivity-cache", {M::AnyPrec}},
      {"--kmeans-iters", {M::AnyPrec}},
      {"--ratio-4bit", {M::Mixed24}},
      {"--outliers-from", {M::Mixed24}},
      {"--layout", {M::Mixed24}},
      {"--unit-order", {M::Mixed24}},
      {"--layers-4bit", {M::Mixed24}},
      {"--wbits", {M::Quik}},
      {"--abits", {M::Quik}},
      {"--act-fp8", {M::Quik}},
      {"--outlier-frac", {M::Quik}},
      {"--outlier-threshold", {M::Quik}},
      {"--int8-down-proj", {M::Quik}},
      {"--clip", {M::Quik}},
  };
  return table;
}

// What sets the quantity that --bits (or --group) would have set, for the methods that take neither.
std::string instead(const std::string& option, M method) {
  if (option == "--bits" && method == M::AnyPrec)
    return "; anyprec's widths are set by --seed-bits, --parent-bits and --widths";
  if (option == "--bits" && method == M::Mixed24) return "; mixed24 mixes 2 and 4 bits: --ratio-4bit sets the mix";
  if (option == "--bits" && method == M::Quik) return "; quik's weight bits are --wbits";
  if (option == "--group" && method == M::Mixed24) return "; mixed24 groups are 16 inputs wide";
  return "";
}

void refuse_inapplicable(const CLI::App* sub, M method) {
  for (const Applies& a : option_methods()) {
    if (!given(sub, a.option)) continue;
    if (std::find(a.methods.begin(), a.methods.end(), method) != a.methods.end()) continue;
    std::string list;
    for (M m : a.methods) {
      if (!list.empty()) list += ", ";
      list += api::method_name(m);
    }
    fail(a.option, " does not apply to --method ", api::method_name(method),
         given(sub, "--method") ? "" : " (the default)", " (it applies to ", list, ")", instead(a.option, method));
  }
}

api::LinearKind linear_kind(const std::string& s) {
  if (s == "q") return api::LinearKind::Q;
  if (s == "k") return api::LinearKind::K;
  if (s == "v") return api::LinearKind::V;
  if (s == "o") return api::LinearKind::O;
  if (s == "gate") return api::LinearKind::Gate;
  if (s == "up") return api::LinearKind::Up;
  return api::LinearKind::Down;
}

void print_report(const api::QuantizeReport& r, const api::QuantizeOptions& o) {
  std::printf("wrote %s\n  quantized weights: %lld in %d blocks\n  average bits per quantized weight: %.4f "
              "(everything stored counted: codes or planes, scales, zeros, LUTs, indices, outliers)\n"
              "  file size: %.2f MiB\n  time: %.1f s\n",
              r.out_path.c_str(), static_cast<long long>(r.quantized_weights), r.blocks, r.avg_bits,
              r.file_bytes / 1048576.0, r.seconds);
  std::printf("  device: %s", r.device.c_str());
  if (r.peak_gpu_bytes > 0) std::printf("; peak GPU memory %.2f GiB", r.peak_gpu_bytes / 1073741824.0);
  std::printf("; peak host RSS %.2f GiB", r.peak_rss_bytes / 1073741824.0);
  if (r.peak_anon_rss_bytes > 0) std::printf(" (anonymous %.2f GiB)", r.peak_anon_rss_bytes / 1073741824.0);
  if (r.activations_on_host) std::printf("; calibration activations in pinned host memory");
  if (r.resumed_blocks > 0) std::printf("; %d blocks resumed from the checkpoint", r.resumed_blocks);
  std::printf("\n");
  if (!r.stage_seconds.empty()) {
    std::printf("  time by stage:");
    for (const auto& [stage, secs] : r.stage_seconds) std::printf(" %s %.1f s;", stage.c_str(), secs);
    std::printf("\n");
  }
  const char* sens = o.anyprec.sensitivity == api::Sensitivity::Fisher ? "fisher" : "hessian-diag";
  switch (o.method) {
    case api::QuantMethod::AnyPrec:
      std::printf("  sensitivity (%s) time: %.1f s%s\n", sens, r.sensitivity_seconds,
                  r.sensitivity_from_cache ? (" (read from " + o.anyprec.sensitivity_cache + ")").c_str()
                  : o.anyprec.sensitivity == api::Sensitivity::Fisher
                      ? (" (mean calibration loss " + std::to_string(r.mean_calib_loss) + ")").c_str()
                      : "");
      std::printf("  k-means seed + upscaling + packing time: %.1f s\n", r.seconds - r.sensitivity_seconds);
      for (const auto& [b, bits] : r.width_bits)
        std::printf("  width %d: %.4f bits per weight read (planes 0..%d, LUT, outliers); weighted error %.6g\n", b,
                    bits, b - 1, r.width_weighted_error.at(b));
      break;
    case api::QuantMethod::Mixed24:
      std::printf("  outliers kept: %lld; layer objective sum_l tr(dW H dWT): %.6g\n"
                  "  layouts: %d linears mixed24a (aligned), %d mixed24 (generic)\n"
                  "  paper-style average bits (eq. 10: codes, first-order scales and zeros, outlier values only): %.4f\n",
                  static_cast<long long>(r.outliers), r.hessian_error_sum, r.aligned_linears, r.generic_linears,
                  r.paper_avg_bits);
      break;
    case api::QuantMethod::Quik:
      std::printf("  fp16 outlier columns: %lld over all linears (%d linears below the threshold kept none); "
                  "layer objective sum_l tr(dW H dWT): %.6g\n",
                  static_cast<long long>(r.quik_outlier_columns), r.quik_linears_without_outliers, r.hessian_error_sum);
      break;
    case api::QuantMethod::Gptq:
      std::printf("  layer objective sum_l tr(dW H dWT): GPTQ %.6g vs RTN %.6g on the same Hessians (%.1f%% lower)\n",
                  r.hessian_error_sum, r.rtn_hessian_error_sum,
                  100.0 * (1.0 - r.hessian_error_sum / std::max(r.rtn_hessian_error_sum, 1e-300)));
      break;
    case api::QuantMethod::Rtn: break;
  }
}

}  // namespace

void register_quantize(CLI::App& app, Common& common) {
  auto a = std::make_shared<QuantArgs>();
  api::QuantizeOptions& o = a->opts;
  CLI::App* sub = app.add_subcommand("quantize", "Quantize a model's linear layers and write a .lowbit file");
  sub->add_option("model", a->model, "Model: HF directory, .gguf, or llama2.c .bin")->required();
  sub->add_option("-o,--output", a->out, "Output .lowbit file")->required();
  sub->add_option("--method", a->method, "rtn | gptq (default) | anyprec | mixed24 | quik")
      ->check(CLI::IsMember({"rtn", "gptq", "anyprec", "mixed24", "quik"}));
  sub->add_option("--bits", o.uniform.bits, "rtn/gptq: weight bits (2..8, default 4)")->check(in_range(2, 8));
  sub->add_option("--group", o.uniform.group_size, "rtn/gptq: inputs per group (0 = per channel, the default)")
      ->check(at_least(0, "0 = per channel"));
  sub->add_flag("--sym", o.uniform.symmetric, "rtn/gptq: symmetric quantization (default asymmetric)");
  sub->add_flag("--mse-clip", o.uniform.mse_clip, "rtn/gptq: search a clipping range minimising |err|^2.4");
  sub->add_flag("--act-order", o.gptq.act_order, "gptq: quantize columns by decreasing Hessian diagonal");
  sub->add_flag("--static-groups", o.gptq.static_groups, "gptq: group parameters from the unquantized weights");
  sub->add_option("--percdamp", o.percdamp, "gptq/mixed24/quik: damping as a fraction of mean(diag H) (default 0.01)")
      ->check(in_range(1e-6, 10));
  sub->add_option("--calib", o.calib.file, "Calibration text or .jsonl (default: the shared C4 sample)");
  sub->add_option("--calib-samples", o.calib.samples, "Calibration windows (default 128; anyprec 100)")
      ->check(in_range(1, 100000));
  sub->add_option("--calib-seqlen", o.calib.seqlen, "Tokens per calibration window (default 2048; anyprec 512)")
      ->check(in_range(2, 1 << 20));
  sub->add_option("--seed", o.calib.seed, "Seed for drawing the calibration windows (integer >= 0)")
      ->check(non_negative_integer());
  sub->add_flag("--no-sequential", a->no_sequential, "gptq/mixed24/quik: calibrate every block on full-precision inputs");
  sub->add_option("--seed-bits", o.anyprec.seed_bits, "anyprec: bits of the k-means seed (2..8, default 3)")
      ->check(in_range(2, 8));
  sub->add_option("--parent-bits", o.anyprec.parent_bits, "anyprec: width upscaled to (seed..8, default 8)")
      ->check(in_range(2, 8));
  sub->add_option("--widths", o.anyprec.widths, "anyprec: served widths, e.g. 3,4,8 (default: every seed..parent)")
      ->delimiter(',')
      ->check(in_range(2, 8));
  sub->add_option("--sensitivity", a->sensitivity, "anyprec: fisher | hessian-diag (k-means weights)")
      ->check(CLI::IsMember({"fisher", "hessian-diag"}));
  sub->add_option("--sensitivity-cache", o.anyprec.sensitivity_cache,
                  "anyprec: safetensors file of sensitivities, read if present (same model and calibration), else written");
  sub->add_option("--kmeans-iters", o.anyprec.kmeans_iters, "anyprec: Lloyd iteration cap (default 100)")
      ->check(at_least(0));
  sub->add_option("--outliers", a->outliers,
                  "anyprec (default 0) / mixed24 (default 0.002, at most 0.02): fraction of weights kept in fp16 (CSR); "
                  "quik: number of fp16 outlier input columns of a dim-wide input (default: --outlier-frac)")
      ->check(at_least(0));
  sub->add_option("--wbits", o.quik.wbits, "quik: weight bits (4 or 8)")->check(CLI::IsMember({4, 8}));
  sub->add_option("--abits", o.quik.abits, "quik: activation bits at run time (4, 8, or 16 = not quantized)")
      ->check(CLI::IsMember({4, 8, 16}));
  sub->add_flag("--act-fp8", o.quik.act_fp8, "quik: FP8-E4M3 activations with a per-token scale (W4A8)");
  sub->add_option("--outlier-frac", o.quik.outlier_frac,
                  "quik: outlier columns as a fraction of dim (default 0.0625 = the paper's 256 of 4096)")
      ->check(in_range(0, 1));
  sub->add_option("--outlier-threshold", o.quik.outlier_threshold,
                  "quik: a linear whose calibration inputs never exceed this max |x| keeps no outliers (0 = off)")
      ->check(at_least(0, "0 = off"));
  sub->add_flag("--int8-down-proj", o.quik.int8_down_proj, "quik: down_proj at W8A8");
  sub->add_flag("--clip", o.quik.clip, "quik: search each row's weight clipping on the squared error");
  sub->add_option("--ratio-4bit", o.mixed24.ratio_4bit, "mixed24: fraction of input-channel groups at 4 bits")
      ->check(in_range(0, 1));
  sub->add_option("--outliers-from", a->outliers_from, "mixed24: 2bit (the paper) | all (ablation)")
      ->check(CLI::IsMember({"2bit", "all"}));
  sub->add_option("--layout", a->layout,
                  "mixed24: auto (the aligned mixed24a wherever k % 64 = 0 and the ratio is 0.25) | aligned | generic")
      ->check(CLI::IsMember({"auto", "aligned", "generic"}));
  sub->add_option("--unit-order", a->unit_order,
                  "mixed24a: sensitivity (units and GPTQ's order by decreasing eq. 9 score) | column")
      ->check(CLI::IsMember({"sensitivity", "column"}));
  sub->add_option("--layers-4bit", a->layers_4bit,
                  "mixed24 ablation: these linears (q,k,v,o,gate,up,down) wholly 4-bit, the rest 2-bit")
      ->delimiter(',')
      ->check(CLI::IsMember({"q", "k", "v", "o", "gate", "up", "down"}));
  sub->add_option("--dense-dtype", a->dense, "Unquantized tensors: f32 or f16")->check(CLI::IsMember({"f32", "f16"}));
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  add_device_option(sub, a->device);
  sub->add_flag("--resume", o.resume, "cuda: continue from the checkpoint (<output>.partial/) an interrupted run left");
  sub->callback([a, sub, &common] {
    apply_threads(common);
    const std::map<std::string, M> methods = {{"rtn", M::Rtn},
                                              {"gptq", M::Gptq},
                                              {"anyprec", M::AnyPrec},
                                              {"mixed24", M::Mixed24},
                                              {"quik", M::Quik}};
    api::QuantizeOptions o = a->opts;
    o.method = methods.at(a->method);
    o.device = parse_device(a->device);
    refuse_inapplicable(sub, o.method);
    o.calib.sequential = !a->no_sequential;
    o.dense_dtype = a->dense == "f16" ? api::FloatType::F16 : api::FloatType::F32;
    o.tokenizer_path = common.tokenizer;
    o.anyprec.sensitivity = a->sensitivity == "fisher" ? api::Sensitivity::Fisher : api::Sensitivity::HessianDiagonal;
    o.mixed24.outliers_from_all_groups = a->outliers_from == "all";
    o.mixed24.layout = a->layout == "aligned"   ? api::Mixed24Options::Layout::Aligned
                       : a->layout == "generic" ? api::Mixed24Options::Layout::Generic
                                                : api::Mixed24Options::Layout::Auto;
    refuse_unless(sub, {"--unit-order"}, o.mixed24.layout != api::Mixed24Options::Layout::Generic,
                  "orders the aligned layout's units; --layout generic has none");
    o.mixed24.unit_order_by_sensitivity = a->unit_order == "sensitivity";
    for (const std::string& k : a->layers_4bit) o.mixed24.layers_4bit.push_back(linear_kind(k));
    if (given(sub, "--outliers")) {
      if (o.method == api::QuantMethod::Quik) {
        refuse_unless(sub, {"--outlier-frac"}, false, "and --outliers both set quik's outlier columns: give one");
        if (a->outliers != std::floor(a->outliers) || a->outliers > 1e9)
          fail("quik: --outliers is a column count, got ", a->outliers);
        o.quik.outlier_columns = static_cast<int64_t>(a->outliers);
      } else if (a->outliers >= 0.5) {
        fail("--outliers is a fraction of the weights below 0.5 for ", a->method, ", got ", a->outliers);
      } else if (o.method == api::QuantMethod::AnyPrec) {
        o.anyprec.outlier_fraction = a->outliers;
      } else {
        o.mixed24.outlier_fraction = a->outliers;
      }
    }
    api::validate(o);   // before the model is read
    std::printf("quantize %s: %s\n", a->model.c_str(), api::describe(o).c_str());
    std::fflush(stdout);
    // Progress per block with the time left, from the mean time per block of each stage so far (a GPU any-precision
    // run interleaves its sensitivity passes with the blocks the k-means has finished).
    struct StageClock {
      std::chrono::steady_clock::time_point start;
      int first_done = -1;
    };
    std::map<api::QuantizeProgress::Stage, StageClock> clocks;
    const api::QuantizeReport r = api::quantize(a->model, a->out, o, [&](const api::QuantizeProgress& p) {
      const auto now = std::chrono::steady_clock::now();
      StageClock& c = clocks[p.stage];
      if (c.first_done < 0 || p.done < c.first_done) c = {now, p.done};
      const double secs = std::chrono::duration<double>(now - c.start).count();
      char at[32];
      std::snprintf(at, sizeof at, ", at %.1f s", secs);
      std::string eta = at;   // logs show each block's time as the difference of two lines
      if (p.done > c.first_done && p.done < p.total) {
        const int left = static_cast<int>(secs / (p.done - c.first_done) * (p.total - p.done));
        eta = ", " + std::to_string(left / 60) + "m" + std::to_string(left % 60) + "s left";
      }
      if (p.stage == api::QuantizeProgress::Stage::Sensitivity)
        progress_line("fisher", p.done, p.total, "block passes (forward, backward)" + eta);
      else
        progress_line("quantize", p.done, p.total, "blocks" + eta);
    });
    print_report(r, o);
  });
}

}  // namespace lowbit::cli
