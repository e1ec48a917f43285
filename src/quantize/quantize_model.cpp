#include "quantize/quantize_model.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/rss.h"
#include "io/lowbit_file.h"
#include "io/safetensors.h"
#include "model/backward.h"
#include "quantize/capture.h"

namespace lowbit {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A DenseLinear over the exact weights a quantized tensor encodes, so the calibration forward sees them.
struct OwnedDense final : LinearOp {
  OwnedDense(std::vector<float> w, const float* bias, int64_t n, int64_t k)
      : LinearOp(n, k), w_(std::move(w)), impl_(w_.data(), bias, n, k) {}
  void forward(const float* x, int64_t m, float* y, int) const override { impl_.forward(x, m, y); }
  void forward_ref(const float* x, int64_t m, float* y, int) const override { impl_.forward_ref(x, m, y); }
  std::vector<float> w_;
  DenseLinear impl_;
};

const float* bias_of(const Model& m, const std::string& weight_name) {
  const std::string b = weight_name.substr(0, weight_name.size() - 6) + "bias";   // "...weight" -> "...bias"
  const auto names = m.tensor_names();
  return std::find(names.begin(), names.end(), b) != names.end() ? m.tensor_f32(b) : nullptr;
}

// The calibration windows: drawn from the text by the model's tokenizer, or random token ids for a source without
// one (random: models, timing only).
std::vector<std::vector<int32_t>> calibration_windows(const Model& m, const CalibOptions& o) {
  return m.has_tokenizer() ? draw_calibration(m.tokenizer(), o) : draw_random_calibration(m.config().vocab_size, o);
}

// Hessian-diagonal sensitivity: s[r][c] = 2/N Σ_t x_t[c]^2 over the calibration tokens entering the weight's
// input (the full-precision model), the same for every output row r.
std::map<std::string, std::vector<float>> hessian_diagonal_sensitivity(const Model& model,
                                                                      const std::vector<std::vector<int32_t>>& calib) {
  const ModelConfig& c = model.config();
  std::vector<std::map<LinearSlot, std::vector<double>>> sq(static_cast<size_t>(c.n_layers));
  int64_t tokens = 0;
  const LinearInputHook hook = [&](int l, LinearSlot slot, const float* x, int n, int64_t k) {
    std::vector<double>& acc = sq[static_cast<size_t>(l)][slot];
    acc.resize(static_cast<size_t>(k), 0.0);
    for (int t = 0; t < n; ++t)
      for (int64_t i = 0; i < k; ++i) acc[static_cast<size_t>(i)] += static_cast<double>(x[t * k + i]) * x[t * k + i];
  };
  for (const auto& win : calib) {
    const int T = static_cast<int>(win.size());
    std::vector<float> x(static_cast<size_t>(T) * c.dim);
    KVCache cache(c.n_layers, T, c.kv_dim());
    model.embed(win.data(), T, x.data());
    for (int l = 0; l < c.n_layers; ++l) model.layer_forward(l, x.data(), T, 0, cache, &hook);
    tokens += T;
  }
  std::map<std::string, std::vector<float>> out;
  for (int l = 0; l < c.n_layers; ++l) {
    const auto names = model.linear_names(l);
    for (size_t i = 0; i < names.size(); ++i) {
      const std::vector<double>& acc = sq[static_cast<size_t>(l)].at(kLinearSlot[i]);
      const auto& shape = model.tensor_shape(names[i]);
      std::vector<float>& s = out[names[i]];
      s.resize(static_cast<size_t>(shape[0] * shape[1]));
      for (int64_t r = 0; r < shape[0]; ++r)
        for (int64_t k = 0; k < shape[1]; ++k)
          s[static_cast<size_t>(r * shape[1] + k)] = static_cast<float>(2.0 * acc[static_cast<size_t>(k)] / static_cast<double>(tokens));
    }
  }
  return out;
}

// What a sensitivity cache must have been made from to be reused.
std::map<std::string, std::string> sensitivity_key(const Model& model, const QuantizeOptions& o) {
  return {{"lowbit_sensitivity", o.sensitivity == Sensitivity::Fisher ? "fisher" : "hessian-diag"},
          {"model", model.weights().path},
          {"calib_file", o.calib.file.empty() ? default_calibration_file() : o.calib.file},
          {"calib_samples", std::to_string(o.calib.samples)},
          {"calib_seqlen", std::to_string(o.calib.seqlen)},
          {"calib_seed", std::to_string(o.calib.seed)}};
}

std::map<std::string, std::vector<float>> read_sensitivity_cache(const Model& model, const QuantizeOptions& o) {
  const SafetensorsFile f = SafetensorsFile::open(o.sensitivity_cache);
  for (const auto& [key, want] : sensitivity_key(model, o)) {
    const auto it = f.metadata().find(key);
    const std::string have = it == f.metadata().end() ? "(absent)" : it->second;
    LOWBIT_CHECK(have == want, o.sensitivity_cache, ": sensitivity cache was made with ", key, " = ", have,
                 ", this run has ", want, " (delete the file or pass another --sensitivity-cache)");
  }
  std::map<std::string, std::vector<float>> out;
  for (int l = 0; l < model.config().n_layers; ++l)
    for (const std::string& name : model.linear_names(l)) {
      const TensorView* t = f.find(name);
      const auto& shape = model.tensor_shape(name);
      LOWBIT_CHECK(t != nullptr && t->dtype == DType::F32 && t->shape == shape, o.sensitivity_cache,
                   ": sensitivity cache has no F32 tensor ", name, " of shape ", shape_str(shape));
      std::vector<float>& v = out[name];
      v.resize(static_cast<size_t>(t->numel()));
      std::memcpy(v.data(), t->data, t->nbytes);
    }
  return out;
}

}  // namespace

double mixed24a_paper_bits(const Mixed24AQuantized& q, int64_t outliers) {
  return static_cast<double>(q.n * q.units() * (3 * 16 * 2 + 16 * 4 + 4 + 3 + 3 + 3 * 2 + 4 + 4)) +
         16.0 * static_cast<double>(outliers);
}

double mixed24_paper_bits(const Mixed24Quantized& q, int64_t outliers) {
  return static_cast<double>(q.n * (q.g2 * (16 * 2 + kMixedScaleBits + 2) + q.g4 * (16 * 4 + 16 + 4))) +
         16.0 * static_cast<double>(outliers);
}

std::string method_json(const QuantizeOptions& o) {
  nlohmann::ordered_json j;
  if (o.method == QuantMethod::Quik) {
    const QuikOptions& q = o.quik;
    j["name"] = "quik";
    j["wbits"] = q.wbits;
    j["abits"] = q.abits;
    j["act_fp8"] = q.act_fp8;
    if (q.outliers >= 0) j["outliers"] = q.outliers;
    else j["outlier_frac"] = q.outlier_frac;
    j["down_factor"] = q.down_factor;
    j["outlier_threshold"] = q.outlier_threshold;
    j["int8_down_proj"] = q.int8_down_proj;
    j["clip"] = q.clip;
    j["weights"] = "symmetric per output channel, GPTQ with outlier columns last";
    j["percdamp"] = q.percdamp;
    j["sequential"] = o.sequential;
  } else if (o.method == QuantMethod::Mixed24) {
    j["name"] = "mixed24";
    j["ratio_4bit"] = o.mixed24.ratio_4bit;
    j["outlier_fraction"] = o.mixed24.outlier_fraction;
    j["outliers_from"] = o.mixed24.outliers_from_all_groups ? "all groups" : "2-bit groups";
    j["group_size"] = kMixedGroup;
    j["scale_group_rows"] = kMixedRowGroup;
    j["scale_bits"] = kMixedScaleBits;
    j["error_feedback"] = o.mixed24.error_feedback ? "gptq" : "none";
    j["layout"] = o.mixed24.layout == Mixed24Options::Layout::Auto ? "auto (mixed24a where it fits)"
                  : o.mixed24.layout == Mixed24Options::Layout::Aligned ? "mixed24a" : "mixed24";
    j["unit_order"] = o.mixed24.unit_order_by_sensitivity ? "sensitivity" : "column";
    if (!o.mixed24_layers_4bit.empty()) j["layers_4bit"] = o.mixed24_layers_4bit;
    j["percdamp"] = o.mixed24.percdamp;
    j["sequential"] = o.sequential;
  } else if (o.method == QuantMethod::AnyPrec) {
    const AnyPrecOptions& a = o.anyprec;
    j["name"] = "anyprec";
    j["seed_bits"] = a.seed_bits;
    j["parent_bits"] = a.parent_bits;
    const uint32_t mask = anyprec_width_mask(a);
    std::vector<int> widths;
    for (int b = 0; b < 32; ++b)
      if ((mask >> b) & 1u) widths.push_back(b);
    j["widths"] = widths;
    j["sensitivity"] = o.sensitivity == Sensitivity::Fisher ? "fisher" : "hessian-diag";
    j["kmeans_max_iter"] = a.max_iter;
    j["outlier_fraction"] = a.outlier_fraction;
  } else {
    const UniformSpec& s = o.gptq.spec;
    j["name"] = o.method == QuantMethod::Gptq ? "gptq" : "rtn";
    j["bits"] = s.bits;
    j["group_size"] = s.group_size;
    j["symmetric"] = s.symmetric;
    j["mse_clip"] = s.mse_clip;
    if (o.method == QuantMethod::Gptq) {
      j["act_order"] = o.gptq.act_order;
      j["static_groups"] = o.gptq.static_groups;
      j["percdamp"] = o.gptq.percdamp;
      j["block_size"] = o.gptq.block_size;
      j["sequential"] = o.sequential;
    }
  }
  if (o.method != QuantMethod::Rtn)   // every other method is calibrated
    j["calibration"] = {{"file", o.calib.file.empty() ? default_calibration_file() : o.calib.file},
                        {"samples", o.calib.samples}, {"seqlen", o.calib.seqlen}, {"seed", o.calib.seed}};
  j["dense_dtype"] = std::string(dtype_info(o.dense_dtype).name);
  return j.dump();
}

QuantizeReport quantize_to_file(Model& model, const QuantizeOptions& opts, const std::string& out_path,
                                const std::function<void(int, int, const std::string&)>& progress) {
  const double t0 = now_s();
  const ModelConfig& c = model.config();
  LOWBIT_CHECK(!model.has_packed_weights(), model.weights().path, ": is already quantized");
  LOWBIT_CHECK(opts.dense_dtype == DType::F32 || opts.dense_dtype == DType::F16, "dense dtype must be F32 or F16");
  QuantizeReport rep;
  std::map<std::string, PackedWeight> quantized;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;   // the packed parts' bytes
  double paper_bits = 0;   // Mixed24: QuantizeReport::paper_avg_bits' numerator

  // Quantizes the linears of block l whose inputs are described by stats (nullptr for RTN), and swaps them into
  // the model so the next capture pass runs the quantized block.
  // The GPTQ factor of each input: mixed24 needs groups of contiguous columns (no act-order) and its own damping.
  GptqOptions factor_opts = opts.gptq;
  if (opts.method == QuantMethod::Mixed24) {
    factor_opts.act_order = false;
    factor_opts.percdamp = opts.mixed24.percdamp;
  }
  auto quantize_block = [&](int l, const std::map<LinearSlot, InputStats>* stats) {
    const auto names = model.linear_names(l);
    std::map<LinearSlot, std::vector<double>> hessians;
    std::map<LinearSlot, GptqFactor> factors;   // one Cholesky per input, shared by q/k/v and by gate/up
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      const float* w = model.tensor_f32(name);
      const auto& shape = model.tensor_shape(name);
      const int64_t n = shape[0], k = shape[1];
      std::vector<float> deq(static_cast<size_t>(n * k));   // exactly what the packed weight encodes
      if (stats == nullptr) {
        const UniformQuantized q = rtn_quantize(w, n, k, opts.gptq.spec);
        q.dequantize(deq.data());
        quantized[name] = pack_uniform(q, storage);
      } else {
        auto& h = hessians[kLinearSlot[i]];
        if (h.empty()) {
          h = stats->at(kLinearSlot[i]).hessian();
          if (opts.method != QuantMethod::Quik) factors[kLinearSlot[i]] = gptq_factor(h, k, factor_opts);
        }
        if (opts.method == QuantMethod::Quik) {   // outlier columns by max |x|, GPTQ with them last
          const QuikOptions& qo = opts.quik;
          const bool down = kLinearSlot[i] == LinearSlot::Down;
          const std::vector<double> amax = stats->at(kLinearSlot[i]).max_abs();
          const int64_t per_dim = qo.outliers >= 0 ? qo.outliers : std::llround(qo.outlier_frac * static_cast<double>(c.dim));
          int64_t count = down ? std::llround(qo.down_factor * static_cast<double>(per_dim)) : per_dim;
          if (qo.outlier_threshold > 0 && *std::max_element(amax.begin(), amax.end()) < qo.outlier_threshold) {
            count = 0;
            ++rep.quik_linears_without_outliers;
          }
          const bool w8a8 = down && qo.int8_down_proj;
          QuikStats qs;
          const QuikQuantized qq = quik_quantize(w, n, k, h, quik_outlier_columns(amax, count), w8a8 ? 8 : qo.wbits,
                                                 w8a8 ? 8 : qo.abits, !w8a8 && qo.act_fp8, qo.clip, qo.percdamp, &qs);
          rep.hessian_error_sum += qs.hessian_error;
          rep.quik_outlier_columns += qq.outliers();
          qq.dequantize(deq.data());
          quantized[name] = pack_quik(qq, storage);
        } else if (opts.method == QuantMethod::Mixed24) {   // 2/4-bit groups over GPTQ's error feedback
          Mixed24Options mo = opts.mixed24;
          if (!opts.mixed24_layers_4bit.empty()) {
            static constexpr const char* kKinds[7] = {"q", "k", "v", "o", "gate", "up", "down"};
            const bool four = std::find(opts.mixed24_layers_4bit.begin(), opts.mixed24_layers_4bit.end(), kKinds[i]) !=
                              opts.mixed24_layers_4bit.end();
            mo.group_bits.assign(static_cast<size_t>((k + kMixedGroup - 1) / kMixedGroup), four ? 4 : 2);
          }
          Mixed24Stats ms;
          const bool aligned = mo.layout == Mixed24Options::Layout::Aligned ||
                               (mo.layout == Mixed24Options::Layout::Auto && mixed24_aligned_fits(k, mo));
          if (aligned) {
            const Mixed24AQuantized mq = mixed24a_quantize(w, n, k, h, factors.at(kLinearSlot[i]), mo, &ms);
            mq.dequantize(deq.data());
            quantized[name] = pack_mixed24a(mq, storage);
            paper_bits += mixed24a_paper_bits(mq, ms.outliers);
            ++rep.mixed24_aligned_linears;
          } else {
            const Mixed24Quantized mq = mixed24_quantize(w, n, k, {}, factors.at(kLinearSlot[i]), mo, &ms);
            mq.dequantize(deq.data());
            quantized[name] = pack_mixed24(mq, storage);
            paper_bits += mixed24_paper_bits(mq, ms.outliers);
            ++rep.mixed24_generic_linears;
          }
          rep.hessian_error_sum += hessian_weighted_error(w, deq.data(), n, k, h);
          rep.outliers += ms.outliers;
        } else {
          GptqStats gs;
          const UniformQuantized q = gptq_quantize(w, n, k, h, factors.at(kLinearSlot[i]), opts.gptq, &gs);
          rep.hessian_error_sum += gs.hessian_error;
          // RTN on the same Hessian: what GPTQ's error feedback buys, layer by layer
          rep.rtn_hessian_error_sum += hessian_weighted_error(w, rtn_quantize(w, n, k, opts.gptq.spec), h);
          q.dequantize(deq.data());
          quantized[name] = pack_uniform(q, storage);
        }
      }
      model.replace_linear(name, std::make_unique<OwnedDense>(std::move(deq), bias_of(model, name), n, k));
    }
  };

  if (opts.method == QuantMethod::Quik) validate_quik_options(opts.quik);   // before any calibration work
  if (opts.method == QuantMethod::Mixed24) {   // before any calibration work
    validate_mixed24_options(opts.mixed24);
    if (opts.mixed24.layout == Mixed24Options::Layout::Aligned)
      for (int l = 0; l < c.n_layers; ++l)
        for (const std::string& name : model.linear_names(l)) {
          const int64_t k = model.tensor_shape(name)[1];
          LOWBIT_CHECK(mixed24_aligned_fits(k, opts.mixed24), "--layout aligned: ", name, " has k = ", k,
                       " (the aligned layout needs k a multiple of 64, --ratio-4bit 0.25 and no --layers-4bit); use --layout auto");
        }
  }
  if (opts.method == QuantMethod::AnyPrec) {
    const uint32_t mask = anyprec_width_mask(opts.anyprec);   // refuse bad options before any work
    rep.calib_windows = opts.calib.samples;   // draw_calibration returns exactly this many
    rep.calib_seqlen = opts.calib.seqlen;
    const double ts = now_s();
    const bool cached = !opts.sensitivity_cache.empty() && std::filesystem::exists(opts.sensitivity_cache);
    std::map<std::string, std::vector<float>> sens;
    if (cached) {   // the cache key already pins the calibration: no windows are drawn
      sens = read_sensitivity_cache(model, opts);
    } else {
      const auto calib = calibration_windows(model, opts.calib);
      if (opts.sensitivity == Sensitivity::Fisher) {
        FisherDiag f = fisher_diagonal(model, calib, [&](int done, int total) {
          if (progress) progress(done, total, "fisher");
        });
        rep.mean_calib_loss = f.mean_loss;
        sens = std::move(f.diag);
      } else {
        sens = hessian_diagonal_sensitivity(model, calib);
      }
    }
    rep.sensitivity_seconds = now_s() - ts;
    rep.sensitivity_from_cache = cached;
    if (!cached && !opts.sensitivity_cache.empty()) {
      std::vector<SafetensorsWriteTensor> ts_out;
      for (const auto& [name, v] : sens) ts_out.push_back({name, DType::F32, model.tensor_shape(name), v.data()});
      write_safetensors(opts.sensitivity_cache, ts_out, sensitivity_key(model, opts));
    }
    for (int l = 0; l < c.n_layers; ++l) {
      for (const std::string& name : model.linear_names(l)) {
        const auto& shape = model.tensor_shape(name);
        const float* w = model.tensor_f32(name);
        const std::vector<float>& s = sens.at(name);
        const AnyPrecQuantized q = anyprec_quantize(w, s.data(), shape[0], shape[1], opts.anyprec);
        for (int b = 0; b < 32; ++b)
          if ((mask >> b) & 1u) rep.width_weighted_error[b] += anyprec_weighted_error(w, s.data(), q, b);
        quantized[name] = pack_anyprec(q, storage);
        sens.erase(name);
      }
      if (progress) progress(l + 1, c.n_layers, "block " + std::to_string(l));
    }
    int64_t weights = 0;
    for (const auto& [name, pw] : quantized) weights += pw.shape[0] * pw.shape[1];
    for (int b = 0; b < 32; ++b) {
      if (((mask >> b) & 1u) == 0) continue;
      uint64_t bits = 0;
      for (const auto& [name, pw] : quantized) bits += anyprec_view_bits(pw, b);
      rep.width_avg_bits[b] = static_cast<double>(bits) / static_cast<double>(weights);
    }
  } else if (opts.method == QuantMethod::Rtn) {
    for (int l = 0; l < c.n_layers; ++l) {
      quantize_block(l, nullptr);
      if (progress) progress(l + 1, c.n_layers, "block " + std::to_string(l));
    }
  } else {
    const auto calib = calibration_windows(model, opts.calib);
    const int N = static_cast<int>(calib.size()), T = opts.calib.seqlen;
    rep.calib_windows = N;
    rep.calib_seqlen = T;
    std::vector<std::vector<float>> x(static_cast<size_t>(N)), x_fp;   // block inputs [T, dim] per window
    for (int s = 0; s < N; ++s) {
      x[static_cast<size_t>(s)].resize(static_cast<size_t>(T) * c.dim);
      model.embed(calib[static_cast<size_t>(s)].data(), T, x[static_cast<size_t>(s)].data());
    }
    KVCache cache(c.n_layers, T, c.kv_dim());
    std::vector<float> work(static_cast<size_t>(T) * c.dim);
    for (int l = 0; l < c.n_layers; ++l) {
      std::map<LinearSlot, InputStats> stats;
      stats.emplace(LinearSlot::Qkv, InputStats(c.dim));
      stats.emplace(LinearSlot::O, InputStats(c.q_dim()));
      stats.emplace(LinearSlot::GateUp, InputStats(c.dim));
      stats.emplace(LinearSlot::Down, InputStats(c.hidden_dim));
      const LinearInputHook hook = [&](int, LinearSlot slot, const float* in, int n, int64_t) {
        stats.at(slot).add(in, n);
      };
      // Capture pass (full-precision block); without `sequential` its outputs are the next block's inputs.
      for (int s = 0; s < N; ++s) {
        auto& xs = x[static_cast<size_t>(s)];
        std::copy(xs.begin(), xs.end(), work.begin());
        model.layer_forward(l, work.data(), T, 0, cache, &hook);
        if (!opts.sequential) std::copy(work.begin(), work.end(), xs.begin());
      }
      quantize_block(l, &stats);
      if (opts.sequential)   // re-run the quantized block: the next block sees what the quantized model computes
        for (int s = 0; s < N; ++s) model.layer_forward(l, x[static_cast<size_t>(s)].data(), T, 0, cache, nullptr);
      if (progress) progress(l + 1, c.n_layers, "block " + std::to_string(l));
    }
  }

  // Pack and write.
  LowbitWriteSpec spec;
  spec.source_path = model.weights().path;
  spec.source_format = model_format_name(model.weights().format);
  spec.config = c;
  if (model.has_tokenizer()) spec.vocab = model.tokenizer().vocab();
  spec.method_json = method_json(opts);
  std::vector<std::vector<uint16_t>> halves;
  for (const std::string& name : model.tensor_names()) {
    if (quantized.count(name)) continue;
    const auto& shape = model.tensor_shape(name);
    const float* data = model.tensor_f32(name);
    if (opts.dense_dtype == DType::F16) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = f32_to_f16(data[i]);
      halves.push_back(std::move(h));
      spec.dense.push_back({name, DType::F16, shape, halves.back().data()});
    } else {
      spec.dense.push_back({name, DType::F32, shape, data});
    }
  }
  spec.packed = std::move(quantized);
  const LowbitSummary sum = write_lowbit(out_path, spec);
  rep.quantized_weights = sum.quantized_weights;
  rep.avg_bits = sum.avg_bits_per_weight;
  if (opts.method == QuantMethod::Mixed24) rep.paper_avg_bits = paper_bits / static_cast<double>(rep.quantized_weights);
  rep.file_bytes = sum.file_bytes;
  rep.seconds = now_s() - t0;
  rep.device = "cpu";
  rep.peak_rss_bytes = peak_rss_bytes();
  return rep;
}

}  // namespace lowbit
