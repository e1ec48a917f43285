// lowbit::api::quantize over the quantization driver (quantize/quantize_model.h): the public options are mapped
// onto the driver's, checked once here before the model is read, and its report mapped back.
#include "lowbit/quantize.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "api/internal.h"
#include "core/error.h"
#include "lowbit/system.h"
#include "model/model.h"
#include "model/weight_set.h"
#include "quantize/quantize_model.h"
#include "quantize/rtn.h"

namespace lowbit::api {

namespace {

// MemAvailable from /proc/meminfo in bytes (0 when unknown).
uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// The driver's calibration defaults per method: GPTQ's 128 x 2048, the any-precision paper's 100 x 512.
int default_samples(QuantMethod m) { return m == QuantMethod::AnyPrec ? 100 : 128; }
int default_seqlen(QuantMethod m) { return m == QuantMethod::AnyPrec ? 512 : 2048; }

const char* linear_kind_name(LinearKind k) {
  switch (k) {
    case LinearKind::Q: return "q";
    case LinearKind::K: return "k";
    case LinearKind::V: return "v";
    case LinearKind::O: return "o";
    case LinearKind::Gate: return "gate";
    case LinearKind::Up: return "up";
    case LinearKind::Down: return "down";
  }
  return "?";
}

lowbit::QuantizeOptions to_internal(const QuantizeOptions& o) {
  lowbit::QuantizeOptions q;
  switch (o.method) {
    case QuantMethod::Rtn: q.method = lowbit::QuantMethod::Rtn; break;
    case QuantMethod::Gptq: q.method = lowbit::QuantMethod::Gptq; break;
    case QuantMethod::AnyPrec: q.method = lowbit::QuantMethod::AnyPrec; break;
    case QuantMethod::Mixed24: q.method = lowbit::QuantMethod::Mixed24; break;
    case QuantMethod::Quik: q.method = lowbit::QuantMethod::Quik; break;
  }
  q.gptq.spec.bits = o.uniform.bits;
  q.gptq.spec.group_size = o.uniform.group_size;
  q.gptq.spec.symmetric = o.uniform.symmetric;
  q.gptq.spec.mse_clip = o.uniform.mse_clip;
  q.gptq.act_order = o.gptq.act_order;
  q.gptq.static_groups = o.gptq.static_groups;
  q.gptq.percdamp = o.percdamp;

  q.calib.file = o.calib.file;
  q.calib.jsonl_field = o.calib.jsonl_field;
  q.calib.samples = o.calib.samples > 0 ? o.calib.samples : default_samples(o.method);
  q.calib.seqlen = o.calib.seqlen > 0 ? o.calib.seqlen : default_seqlen(o.method);
  q.calib.seed = o.calib.seed;
  q.sequential = o.calib.sequential;
  q.dense_dtype = o.dense_dtype == FloatType::F16 ? DType::F16 : DType::F32;

  q.anyprec.seed_bits = o.anyprec.seed_bits;
  q.anyprec.parent_bits = o.anyprec.parent_bits;
  q.anyprec.widths = o.anyprec.widths;
  q.anyprec.max_iter = o.anyprec.kmeans_iters;
  q.anyprec.outlier_fraction = o.anyprec.outlier_fraction;
  q.sensitivity = o.anyprec.sensitivity == Sensitivity::Fisher ? lowbit::Sensitivity::Fisher
                                                                : lowbit::Sensitivity::HessianDiag;
  q.sensitivity_cache = o.anyprec.sensitivity_cache;

  q.mixed24.ratio_4bit = o.mixed24.ratio_4bit;
  q.mixed24.outlier_fraction = o.mixed24.outlier_fraction;
  q.mixed24.outliers_from_all_groups = o.mixed24.outliers_from_all_groups;
  q.mixed24.layout = o.mixed24.layout == Mixed24Options::Layout::Aligned   ? lowbit::Mixed24Options::Layout::Aligned
                     : o.mixed24.layout == Mixed24Options::Layout::Generic ? lowbit::Mixed24Options::Layout::Generic
                                                                           : lowbit::Mixed24Options::Layout::Auto;
  q.mixed24.unit_order_by_sensitivity = o.mixed24.unit_order_by_sensitivity;
  q.mixed24.percdamp = o.percdamp;
  for (LinearKind k : o.mixed24.layers_4bit) q.mixed24_layers_4bit.push_back(linear_kind_name(k));

  q.quik.wbits = o.quik.wbits;
  q.quik.abits = o.quik.abits;
  q.quik.act_fp8 = o.quik.act_fp8;
  q.quik.outliers = o.quik.outlier_columns;
  q.quik.outlier_frac = o.quik.outlier_frac;
  q.quik.outlier_threshold = o.quik.outlier_threshold;
  q.quik.int8_down_proj = o.quik.int8_down_proj;
  q.quik.clip = o.quik.clip;
  q.quik.percdamp = o.percdamp;
  return q;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

}  // namespace

const char* method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::Rtn: return "rtn";
    case QuantMethod::Gptq: return "gptq";
    case QuantMethod::AnyPrec: return "anyprec";
    case QuantMethod::Mixed24: return "mixed24";
    case QuantMethod::Quik: return "quik";
  }
  return "?";
}

void validate(const QuantizeOptions& o) {
  const lowbit::QuantizeOptions q = to_internal(o);
  LOWBIT_CHECK(o.calib.samples >= 0, "--calib-samples must be >= 1, got ", o.calib.samples);
  LOWBIT_CHECK(o.calib.seqlen == 0 || o.calib.seqlen >= 2, "--calib-seqlen must be >= 2, got ", o.calib.seqlen);
  LOWBIT_CHECK(o.percdamp > 0 && o.percdamp <= 10, "--percdamp must be in (0, 10], got ", o.percdamp);
  switch (o.method) {
    case QuantMethod::Rtn:
    case QuantMethod::Gptq:
      validate_uniform_spec(q.gptq.spec, 0);
      break;
    case QuantMethod::AnyPrec:
      anyprec_width_mask(q.anyprec);
      LOWBIT_CHECK(o.anyprec.kmeans_iters >= 0, "--kmeans-iters must be >= 0, got ", o.anyprec.kmeans_iters);
      break;
    case QuantMethod::Mixed24:
      validate_mixed24_options(q.mixed24);
      LOWBIT_CHECK(o.mixed24.layout != Mixed24Options::Layout::Aligned ||
                       (o.mixed24.layers_4bit.empty() && o.mixed24.ratio_4bit == 0.25),
                   "--layout aligned needs --ratio-4bit 0.25 and no --layers-4bit (other allocations use --layout "
                   "generic)");
      break;
    case QuantMethod::Quik:
      LOWBIT_CHECK(o.quik.outlier_columns >= -1, "quik: --outliers is a column count >= 0, got ",
                   o.quik.outlier_columns);
      validate_quik_options(q.quik);
      break;
  }
}

std::string describe(const QuantizeOptions& o) {
  const lowbit::QuantizeOptions q = to_internal(o);
  const std::string calib =
      "calibration " + std::to_string(q.calib.samples) + " x " + std::to_string(q.calib.seqlen);
  std::ostringstream os;
  os << method_name(o.method);
  switch (o.method) {
    case QuantMethod::Rtn:
    case QuantMethod::Gptq:
      os << ", " << o.uniform.bits << " bits, "
         << (o.uniform.group_size > 0 ? "group " + std::to_string(o.uniform.group_size) : std::string("per channel"))
         << (o.uniform.symmetric ? ", symmetric" : "") << (o.uniform.mse_clip ? ", mse clipping" : "");
      if (o.method == QuantMethod::Gptq) os << (o.gptq.act_order ? ", act-order" : "") << ", " << calib;
      break;
    case QuantMethod::AnyPrec: {
      std::vector<int> widths;
      const uint32_t mask = anyprec_width_mask(q.anyprec);
      for (int b = 0; b < 32; ++b)
        if ((mask >> b) & 1u) widths.push_back(b);
      os << ", seed " << o.anyprec.seed_bits << " bits upscaled to " << o.anyprec.parent_bits << ", widths "
         << join(widths) << ", "
         << (o.anyprec.sensitivity == Sensitivity::Fisher ? "fisher" : "hessian-diag") << " sensitivity, " << calib;
      if (o.anyprec.outlier_fraction > 0) os << ", outliers " << o.anyprec.outlier_fraction;
      break;
    }
    case QuantMethod::Mixed24:
      os << ", " << 100 * o.mixed24.ratio_4bit << "% of 16-column groups at 4 bits, "
         << 100 * o.mixed24.outlier_fraction << "% outliers from "
         << (o.mixed24.outliers_from_all_groups ? "all" : "2-bit") << " groups, " << calib;
      break;
    case QuantMethod::Quik:
      os << " W" << o.quik.wbits << "A" << o.quik.abits << (o.quik.act_fp8 ? " (fp8 activations)" : "")
         << ", outlier columns "
         << (o.quik.outlier_columns >= 0 ? std::to_string(o.quik.outlier_columns)
                                         : "fraction " + std::to_string(o.quik.outlier_frac) + " of dim")
         << (o.quik.int8_down_proj ? ", down_proj W8A8" : "") << (o.quik.clip ? ", clipping" : "") << ", " << calib;
      break;
  }
  return os.str();
}

QuantizeReport quantize(const std::string& in_path, const std::string& out_path, const QuantizeOptions& opts,
                        const QuantizeProgressFn& progress) {
  validate(opts);   // before anything is read
  const lowbit::QuantizeOptions q = to_internal(opts);
  namespace fs = std::filesystem;
  const fs::path out(out_path);
  std::error_code ec;
  LOWBIT_CHECK(!out_path.empty(), "quantize: no output path");
  LOWBIT_CHECK(!out.has_parent_path() || fs::is_directory(out.parent_path(), ec), out_path,
               ": the directory does not exist");
  LOWBIT_CHECK(!fs::is_directory(out, ec), out_path, ": is a directory");
  LoadOptions lo;
  lo.tokenizer_path = opts.tokenizer_path;
  const auto on_progress = [&](int done, int total, const std::string& what) {
    if (!progress) return;
    QuantizeProgress p;
    p.stage = what == "fisher" ? QuantizeProgress::Stage::Sensitivity : QuantizeProgress::Stage::Blocks;
    p.done = done;
    p.total = total;
    progress(p);
  };
  std::string why;
  const bool gpu = opts.device == Device::Cuda || (opts.device == Device::Auto && cuda_available(&why));
  LOWBIT_CHECK(!opts.resume || gpu, "--resume continues a GPU run's checkpoint; the CPU quantizer keeps none");
  lowbit::QuantizeReport r;
  int blocks = 0;
  if (gpu) {
#ifdef LOWBIT_WITH_CUDA
    const WeightSet ws = read_weights(in_path, lo);
    detail::check_tokenizer_option(ws.format, in_path, opts.tokenizer_path);
    blocks = ws.config.n_layers;
    lowbit::QuantizeOptions qg = q;
    qg.resume = opts.resume;
    r = quantize_to_file_gpu(ws, qg, out_path, on_progress);
#else
    fail("--device cuda: lowbit was built without CUDA; use --device cpu");
#endif
  } else {
    WeightSet ws = read_weights(in_path, lo);
    // The CPU quantizer holds every tensor in fp32: refuse up front what cannot fit rather than fail mid-load.
    uint64_t fp32_bytes = 0;
    for (const auto& [name, t] : ws.tensors) fp32_bytes += static_cast<uint64_t>(t.numel()) * 4;
    const uint64_t avail = available_memory_bytes();
    LOWBIT_CHECK(avail == 0 || fp32_bytes < avail, in_path, ": the CPU quantizer holds the model in fp32 (",
                 fp32_bytes >> 30, " GiB), this machine has ", avail >> 30, " GiB available; use --device cuda");
    auto model = lowbit::Model::load(std::move(ws));
    detail::check_tokenizer_option(model->weights().format, in_path, opts.tokenizer_path);
    if (opts.method == QuantMethod::Rtn || opts.method == QuantMethod::Gptq)
      validate_uniform_spec(q.gptq.spec, model->config().dim);
    blocks = model->config().n_layers;
    r = quantize_to_file(*model, q, out_path, on_progress);
  }
  QuantizeReport rep;
  rep.out_path = out_path;
  rep.seconds = r.seconds;
  rep.blocks = blocks;
  rep.calib_windows = r.calib_windows;
  rep.calib_seqlen = r.calib_seqlen;
  rep.quantized_weights = r.quantized_weights;
  rep.avg_bits = r.avg_bits;
  rep.file_bytes = r.file_bytes;
  rep.hessian_error_sum = r.hessian_error_sum;
  rep.rtn_hessian_error_sum = r.rtn_hessian_error_sum;
  rep.sensitivity_seconds = r.sensitivity_seconds;
  rep.sensitivity_from_cache = r.sensitivity_from_cache;
  rep.mean_calib_loss = r.mean_calib_loss;
  rep.width_bits = r.width_avg_bits;
  rep.width_weighted_error = r.width_weighted_error;
  rep.outliers = r.outliers;
  rep.paper_avg_bits = r.paper_avg_bits;
  rep.aligned_linears = r.mixed24_aligned_linears;
  rep.generic_linears = r.mixed24_generic_linears;
  rep.quik_outlier_columns = r.quik_outlier_columns;
  rep.quik_linears_without_outliers = r.quik_linears_without_outliers;
  rep.device = r.device;
  rep.stage_seconds = r.stage_seconds;
  rep.peak_gpu_bytes = r.peak_gpu_bytes;
  rep.peak_rss_bytes = r.peak_rss_bytes;
  rep.peak_anon_rss_bytes = r.peak_anon_rss_bytes;
  rep.resumed_blocks = r.resumed_blocks;
  rep.activations_on_host = r.activations_on_host;
  return rep;
}

}  // namespace lowbit::api
