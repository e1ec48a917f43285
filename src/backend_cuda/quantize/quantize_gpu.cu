// The streaming GPU quantizer (quantize_to_file_gpu in quantize/quantize_model.h).
//
// Data flow, one transformer block at a time (what the CPU driver does with a fully loaded fp32 model):
//   file --(tensor_as_f32, per tensor)--> host scratch --> device block weights (block_loader.h)
//   calibration windows: embedded once into X [N, T, dim] fp32, on the device (or in pinned host memory when it does
//   not fit, staged through one device window)
//   capture: each window through the fp32 block (block_f32.h), the four linear inputs reduced into Hessians
//   (input_stats_gpu.h), the block's outputs kept only when the run is not sequential
//   solve: per linear on the device (gptq_gpu.h, mixed24_gpu.h), one inverse-Hessian factor per input shared by
//   q/k/v and by gate/up; the quantized struct comes back to the host, is packed (src/formats) and the block is
//   checkpointed (quantize/checkpoint.h); the device weights are replaced by exactly what the packed weights encode
//   sequential: X <- quantized block(X), so the next block calibrates on what the quantized model computes
// Any-precision: the Fisher diagonal by a backward pass streamed block by block (fisher_gpu.h), or the Hessian
// diagonal from a capture pass; a worker thread quantizes block l (k-means seed and upscaling on the GPU, on its own
// stream: anyprec_gpu.h, bit-identical to the CPU twin) and packs and checkpoints it while the sensitivity pass
// computes block l + 1. The CPU twin on all 16 cores of the lent machine could not keep up with the Fisher pass
// (docs/QUANTIZE.md has both timings).
// The final file is assembled from the checkpoint's block files (memory-mapped) and the dense tensors converted from
// the source one at a time, and written atomically.
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend_cuda/common/common.h"
#include "backend_cuda/common/owned_stream.h"
#include "backend_cuda/quantize/block_f32.h"
#include "backend_cuda/quantize/anyprec_gpu.h"
#include "backend_cuda/quantize/block_loader.h"
#include "backend_cuda/quantize/fisher_gpu.h"
#include "backend_cuda/quantize/gptq_gpu.h"
#include "backend_cuda/quantize/input_stats_gpu.h"
#include "backend_cuda/quantize/mixed24_gpu.h"
#include "core/error.h"
#include "core/half.h"
#include "core/rss.h"
#include "io/lowbit_file.h"
#include "model/weight_convert.h"
#include "quantize/checkpoint.h"
#include "quantize/quantize_model.h"

namespace lowbit {

namespace {

using cuda::DeviceF32;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Peaks of device memory in use (all processes; the lent machines run one) and of host anonymous memory.
struct Peaks {
  uint64_t gpu = 0;
  AnonRssPeak anon;
  void sample() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) gpu = std::max<uint64_t>(gpu, total_b - free_b);
    anon.sample();
  }
};

// Adds the wall time of a scope to a stage, after synchronising the stream (so the GPU work is counted where it ran).
class Stage {
 public:
  Stage(std::map<std::string, double>& acc, const char* name, cudaStream_t s) : acc_(acc), name_(name), s_(s) {
    if (s_) LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s_));
    t0_ = now_s();
  }
  ~Stage() {
    if (s_) cudaStreamSynchronize(s_);
    acc_[name_] += now_s() - t0_;
  }

 private:
  std::map<std::string, double>& acc_;
  const char* name_;
  cudaStream_t s_;
  double t0_ = 0;
};

// The calibration activations X [N, T, dim]: on the device when they fit, else in pinned host memory with one device
// window they are staged through.
class Activations {
 public:
  Activations(int n, int64_t per_window, bool on_device) : n_(n), per_(per_window), device_(on_device) {
    const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(per_window) * sizeof(float);
    if (device_) {
      LOWBIT_CUDA_CHECK(cudaMalloc(&dev_, bytes));
    } else {
      LOWBIT_CUDA_CHECK(cudaMallocHost(&host_, bytes));
      LOWBIT_CUDA_CHECK(cudaMalloc(&dev_, static_cast<size_t>(per_window) * sizeof(float)));
    }
  }
  Activations(const Activations&) = delete;
  Activations& operator=(const Activations&) = delete;
  ~Activations() {
    if (dev_) cudaFree(dev_);
    if (host_) cudaFreeHost(host_);
  }
  // Device pointer holding window s (staged from the host when spilled).
  float* acquire(int s, cudaStream_t st) {
    if (device_) return dev_ + static_cast<int64_t>(s) * per_;
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(dev_, host_ + static_cast<int64_t>(s) * per_, per_ * sizeof(float),
                                      cudaMemcpyHostToDevice, st));
    return dev_;
  }
  // After acquire(s): writes the staged window back when it was changed.
  void release(int s, bool changed, cudaStream_t st) {
    if (device_ || !changed) return;
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(host_ + static_cast<int64_t>(s) * per_, dev_, per_ * sizeof(float),
                                      cudaMemcpyDeviceToHost, st));
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  void upload(int s, const float* src, cudaStream_t st) {
    float* d = device_ ? dev_ + static_cast<int64_t>(s) * per_ : host_ + static_cast<int64_t>(s) * per_;
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(d, src, per_ * sizeof(float), device_ ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost, st));
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(st));
  }

 private:
  int n_;
  int64_t per_;
  bool device_;
  float* dev_ = nullptr;
  float* host_ = nullptr;
};

// Shape [n, k] of linear i of a block, in slot order q, k, v, o, gate, up, down.
std::vector<int64_t> linear_shape(const ModelConfig& c, size_t i) {
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  switch (i) {
    case 0: return {qd, dim};
    case 1:
    case 2: return {kvd, dim};
    case 3: return {dim, qd};
    case 4:
    case 5: return {hid, dim};
    default: return {dim, hid};
  }
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Every dense (not quantized) tensor of the model with its shape and whether its rows are q/k rows, in the CPU
// model's order (Model::tensor_names).
struct DenseTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool qk_rows = false;
};
std::vector<DenseTensor> dense_tensors(const ModelConfig& c) {
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), V = c.vocab_size;
  std::vector<DenseTensor> out;
  out.push_back({"model.embed_tokens.weight", {V, dim}, false});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {dim}, false});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {qd}, true});
      out.push_back({p + "self_attn.k_proj.bias", {kvd}, true});
      out.push_back({p + "self_attn.v_proj.bias", {kvd}, false});
    }
    out.push_back({p + "post_attention_layernorm.weight", {dim}, false});
  }
  out.push_back({"model.norm.weight", {dim}, false});
  if (!c.tie_embeddings) out.push_back({"lm_head.weight", {V, dim}, false});
  return out;
}

// The weight a packed linear encodes, as fp32 on the host (resume: the replayed blocks see the quantized weights).
std::vector<float> dequantize_packed(const PackedWeight& pw, const std::string& where) {
  std::vector<float> w(static_cast<size_t>(pw.shape[0] * pw.shape[1]));
  switch (pw.format) {
    case FormatId::Uniform: unpack_uniform(pw, where).dequantize(w.data()); break;
    case FormatId::Quik: unpack_quik(pw, where).dequantize(w.data()); break;
    case FormatId::Mixed24A: unpack_mixed24a(pw, where).dequantize(w.data()); break;
    case FormatId::Mixed24: unpack_mixed24(pw, where).dequantize(w.data()); break;
    case FormatId::AnyPrec: fail(where, ": an any-precision block is never replayed");
  }
  return w;
}

DeviceF32 upload(const std::vector<float>& v, cudaStream_t s) {
  DeviceF32 d(v.size());
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(d.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return d;
}

std::vector<float> download(const float* d, int64_t n, cudaStream_t s) {
  std::vector<float> h(static_cast<size_t>(n));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost, s));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

std::vector<double> download(const double* d, int64_t n, cudaStream_t s) {
  std::vector<double> h(static_cast<size_t>(n));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, static_cast<size_t>(n) * sizeof(double), cudaMemcpyDeviceToHost, s));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

// X <- the embedding rows of every calibration window (ids checked against the vocabulary); frees the host copy of the
// embedding table after.
void embed_windows(const WeightSet& ws, const std::vector<std::vector<int32_t>>& calib, int T, Activations& X,
                   std::vector<float>& scratch, cudaStream_t stream) {
  const ModelConfig& c = ws.config;
  const float* emb = tensor_as_f32(ws, "model.embed_tokens.weight", {c.vocab_size, c.dim}, false, scratch);
  std::vector<float> rows(static_cast<size_t>(T) * c.dim);
  for (size_t s = 0; s < calib.size(); ++s) {
    for (int t = 0; t < T; ++t) {
      const int32_t id = calib[s][static_cast<size_t>(t)];
      LOWBIT_CHECK(id >= 0 && id < c.vocab_size, "calibration token id ", id, " out of range [0, ", c.vocab_size, ")");
      std::memcpy(rows.data() + static_cast<size_t>(t) * c.dim, emb + static_cast<int64_t>(id) * c.dim,
                  static_cast<size_t>(c.dim) * sizeof(float));
    }
    X.upload(static_cast<int>(s), rows.data(), stream);
  }
  scratch.clear();
  scratch.shrink_to_fit();
}

// The statistics of a block's four linear inputs (q/k/v, o, gate/up, down).
std::map<LinearSlot, cuda::GpuInputStats> slot_stats(const ModelConfig& c, bool full_hessian) {
  std::map<LinearSlot, cuda::GpuInputStats> stats;
  stats.emplace(LinearSlot::Qkv, cuda::GpuInputStats(c.dim, full_hessian));
  stats.emplace(LinearSlot::O, cuda::GpuInputStats(c.q_dim(), full_hessian));
  stats.emplace(LinearSlot::GateUp, cuda::GpuInputStats(c.dim, full_hessian));
  stats.emplace(LinearSlot::Down, cuda::GpuInputStats(c.hidden_dim, full_hessian));
  return stats;
}

// Device bytes one calibrated block needs besides the activations: its weights twice (original and quantized), the
// four inputs' statistics, the forward's workspace, and the solver's largest linear (W, its working copy, the fp64
// Hessian copy and fp32 factor of the widest input).
size_t block_bytes_needed(const ModelConfig& c, int T, bool hessians) {
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  const int64_t weights = qd * dim + 2 * kvd * dim + dim * qd + 3 * hid * dim;
  const int64_t kmax = std::max<int64_t>(hid, std::max<int64_t>(dim, qd));
  size_t b = static_cast<size_t>(weights) * 8;
  b += cuda::GpuInputStats::bytes_needed(dim, hessians) * 2 + cuda::GpuInputStats::bytes_needed(qd, hessians) +
       cuda::GpuInputStats::bytes_needed(hid, hessians);
  b += cuda::BlockWorkspace::bytes_needed(c, T, false);
  if (hessians) b += static_cast<size_t>(kmax * kmax) * 12 + static_cast<size_t>(kmax * dim) * 12;
  return b;
}

}  // namespace

QuantizeReport quantize_to_file_gpu(const WeightSet& ws, const QuantizeOptions& opts, const std::string& out_path,
                                    const std::function<void(int, int, const std::string&)>& progress) {
  const double t0 = now_s();
  std::string why;
  LOWBIT_CHECK(cuda::device_available(&why), "--device cuda: no usable CUDA device (", why, "); use --device cpu");
  const ModelConfig& c = ws.config;
  c.validate(ws.path);
  LOWBIT_CHECK(ws.packed.empty(), ws.path, ": is already quantized");
  LOWBIT_CHECK(opts.dense_dtype == DType::F32 || opts.dense_dtype == DType::F16, "dense dtype must be F32 or F16");
  LOWBIT_CHECK(opts.sensitivity_cache.empty(), "--sensitivity-cache is not supported with --device cuda (the GPU "
               "Fisher pass is faster than reading a cache of a large model); use --device cpu");
  const QuantMethod method = opts.method;
  if (method == QuantMethod::Quik) validate_quik_options(opts.quik);
  if (method == QuantMethod::Mixed24) {
    validate_mixed24_options(opts.mixed24);
    LOWBIT_CHECK(opts.mixed24_layers_4bit.empty(), "--layers-4bit is not supported with --device cuda; use --device cpu");
  }
  uint32_t width_mask = 0;
  if (method == QuantMethod::AnyPrec) width_mask = anyprec_width_mask(opts.anyprec);
  if (method == QuantMethod::Rtn || method == QuantMethod::Gptq) validate_uniform_spec(opts.gptq.spec, c.dim);

  QuantizeReport rep;
  rep.device = cuda::device_name();
  std::map<std::string, double>& st = rep.stage_seconds;
  Peaks peaks;
  peaks.sample();
  const cuda::OwnedStream owned_stream;
  const cudaStream_t stream = owned_stream.get();

  const bool calibrated = method != QuantMethod::Rtn;
  const int L = c.n_layers;
  std::vector<std::vector<int32_t>> calib;
  if (calibrated) {
    Stage s(st, "calibration text", nullptr);
    const std::unique_ptr<Tokenizer> tok = make_model_tokenizer(ws);
    calib = tok ? draw_calibration(*tok, opts.calib) : draw_random_calibration(c.vocab_size, opts.calib);
    rep.calib_windows = static_cast<int>(calib.size());
    rep.calib_seqlen = opts.calib.seqlen;
  }

  // The run's identity for --resume: the method JSON (options and calibration) and the source.
  nlohmann::ordered_json run;
  run["source"] = ws.path;
  run["method"] = nlohmann::json::parse(method_json(opts));
  QuantCheckpoint ckpt(out_path, run.dump(), L, opts.resume);
  rep.resumed_blocks = ckpt.finished_blocks();

  std::vector<float> scratch;   // host conversion buffer, reused tensor after tensor
  auto notify = [&](int done, int total, const std::string& what) {
    peaks.sample();
    if (progress) progress(done, total, what);
  };

  // Packs and checkpoints one block.
  auto save_block = [&](int l, const std::map<std::string, PackedWeight>& packed,
                        const std::map<std::string, double>& figures) {
    Stage s(st, "checkpoint", nullptr);
    ckpt.save_block(l, packed, figures);
  };

  if (method == QuantMethod::Rtn) {
    for (int l = 0; l < L; ++l) {
      if (ckpt.has_block(l)) continue;
      std::map<std::string, PackedWeight> packed;
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const std::array<std::string, 7> names = cuda::block_linear_names(l);
      for (size_t i = 0; i < 7; ++i) {
        const std::vector<int64_t> shape = linear_shape(c, i);
        DeviceF32 w;
        {
          Stage s(st, "load", nullptr);
          w = cuda::upload_tensor_f32(ws, names[i], shape, i < 2, scratch, stream);
        }
        UniformQuantized q;
        {
          Stage s(st, "solve", stream);
          q = cuda::rtn_quantize_gpu(w.get(), shape[0], shape[1], opts.gptq.spec, stream);
        }
        Stage s(st, "pack", nullptr);
        packed[names[i]] = pack_uniform(q, storage);
      }
      save_block(l, packed, {});
      notify(l + 1, L, "block " + std::to_string(l));
    }
  } else if (method == QuantMethod::AnyPrec) {
    // k-means of one block on the GPU, in a worker thread on its own stream, while the sensitivity pass produces
    // the next block's sensitivities on the main stream.
    // Written by the one worker in flight; read after its future is joined.
    double kmeans_s = 0, werr_s = 0, pack_s = 0, ckpt_s = 0, wait_s = 0;
    const cuda::OwnedStream owned_kstream;
    const cudaStream_t kstream = owned_kstream.get();
    DeviceF32 dw, ds;   // the worker's device copies of one linear's weights and sensitivities, reused
    // Declared after everything the worker touches: on an exception its destructor waits for the worker before
    // those go.
    std::future<void> kmeans;
    auto quantize_block = [&](int l, std::map<std::string, std::vector<float>> sens) {
      std::map<std::string, PackedWeight> packed;
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      std::map<std::string, double> figures;
      std::vector<float> wbuf;
      const std::array<std::string, 7> names = cuda::block_linear_names(l);
      for (size_t i = 0; i < 7; ++i) {
        const double tk = now_s();
        const std::vector<float>& s = sens.at(names[i]);
        const std::vector<int64_t> shape = linear_shape(c, i);
        const int64_t n = shape[0], k = shape[1];
        const size_t nk = static_cast<size_t>(n * k);
        LOWBIT_CHECK(s.size() == nk, names[i], ": sensitivity of ", s.size(), " values");
        const float* w = tensor_as_f32(ws, names[i], {n, k}, i < 2, wbuf);
        if (dw.size() < nk) {
          dw = DeviceF32(nk);
          ds = DeviceF32(nk);
        }
        LOWBIT_CUDA_CHECK(cudaMemcpyAsync(dw.get(), w, nk * sizeof(float), cudaMemcpyHostToDevice, kstream));
        LOWBIT_CUDA_CHECK(cudaMemcpyAsync(ds.get(), s.data(), nk * sizeof(float), cudaMemcpyHostToDevice, kstream));
        const AnyPrecQuantized q = cuda::anyprec_quantize_gpu(dw.get(), ds.get(), n, k, opts.anyprec, kstream);
        const double te = now_s();
        for (int b = 0; b < 32; ++b)
          if ((width_mask >> b) & 1u) figures["werr" + std::to_string(b)] += anyprec_weighted_error(w, s.data(), q, b);
        const double tp = now_s();
        packed[names[i]] = pack_anyprec(q, storage);
        kmeans_s += te - tk;
        werr_s += tp - te;
        pack_s += now_s() - tp;
      }
      const double tc = now_s();
      ckpt.save_block(l, packed, figures);
      ckpt_s += now_s() - tc;
    };
    int in_flight = -1;   // the block the worker is quantizing
    auto join = [&] {
      const double tw = now_s();
      if (kmeans.valid()) kmeans.get();
      wait_s += now_s() - tw;
      if (in_flight >= 0) notify(in_flight + 1, L, "block " + std::to_string(in_flight));
      in_flight = -1;
    };
    auto hand_over = [&](int l, std::map<std::string, std::vector<float>> sens) {
      join();   // at most one block in flight: bounds host memory to two blocks' sensitivities
      peaks.sample();
      if (ckpt.has_block(l)) return notify(l + 1, L, "block " + std::to_string(l));
      kmeans = std::async(std::launch::async, quantize_block, l, std::move(sens));
      in_flight = l;
    };
    const double ts = now_s();
    if (opts.sensitivity == Sensitivity::Fisher) {
      const cuda::FisherGpuReport fr = cuda::fisher_diagonal_gpu(
          ws, calib,
          [&](int l, std::map<std::string, std::vector<float>>& diag) { hand_over(l, std::move(diag)); },
          {}, [&](int done, int total) { notify(done, total, "fisher"); });
      rep.mean_calib_loss = fr.mean_loss;
      rep.activations_on_host = fr.host_spill_bytes > 0;
      peaks.gpu = std::max<uint64_t>(peaks.gpu, fr.peak_device_bytes);
    } else {
      // Hessian diagonal: s[r][c] = 2/N Σ_t x_t[c]² of the full-precision model, the same for every row.
      const int T = opts.calib.seqlen, N = static_cast<int>(calib.size());
      cuda::BlockWorkspace bw(c, T, false);
      Activations X(N, static_cast<int64_t>(T) * c.dim, true);
      embed_windows(ws, calib, T, X, scratch, stream);
      for (int l = 0; l < L; ++l) {
        const cuda::DeviceBlock blk = cuda::load_block_f32(ws, l, scratch, stream);
        std::map<LinearSlot, cuda::GpuInputStats> stats = slot_stats(c, /*full_hessian=*/false);
        const cuda::BlockCaptureFn cap = [&](LinearSlot slot, const float* x, int rows, int64_t) {
          stats.at(slot).add(x, rows, bw.cublas(), stream);
        };
        for (int s = 0; s < N; ++s) cuda::block_forward_f32(blk.view(), X.acquire(s, stream), T, bw, stream, &cap);
        std::map<std::string, std::vector<float>> sens;
        for (size_t i = 0; i < 7; ++i) {
          const std::vector<double> ms = stats.at(kLinearSlot[i]).mean_square();
          const int64_t n = blk.shapes[i][0], k = blk.shapes[i][1];
          std::vector<float>& s = sens[blk.names[i]];
          s.resize(static_cast<size_t>(n * k));
          for (int64_t r = 0; r < n; ++r)
            for (int64_t j = 0; j < k; ++j) s[static_cast<size_t>(r * k + j)] = static_cast<float>(2.0 * ms[static_cast<size_t>(j)]);
        }
        hand_over(l, std::move(sens));
      }
    }
    join();
    // The sensitivity pass's own time: the wall time less the waits for the k-means of earlier blocks.
    rep.sensitivity_seconds = now_s() - ts - wait_s;
    st[opts.sensitivity == Sensitivity::Fisher ? "fisher" : "capture"] += rep.sensitivity_seconds;
    st["kmeans"] += kmeans_s;
    st["kmeans error"] += werr_s;
    st["pack"] += pack_s;
    st["kmeans wait"] += wait_s;
    st["checkpoint"] += ckpt_s;
  } else {
    // GPTQ, Mixed24, QUIK: sequential calibration block by block.
    const int T = opts.calib.seqlen, N = static_cast<int>(calib.size());
    size_t free_b = 0, total_b = 0;
    LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t need_block = block_bytes_needed(c, T, true);
    const size_t need_x = static_cast<size_t>(N) * T * c.dim * sizeof(float) + static_cast<size_t>(T) * c.dim * 4;
    const size_t margin = size_t{1} << 30;
    LOWBIT_CHECK(free_b > need_block + margin, "--device cuda: quantizing one block of this model with ", T,
                 "-token windows needs about ", need_block / kGiB + 1.0, " GiB of GPU memory, the GPU has ",
                 free_b / kGiB, " GiB free (", cuda::device_name(), "); use a larger GPU or --device cpu");
    const bool x_on_device = free_b > need_block + need_x + margin;
    rep.activations_on_host = !x_on_device;
    Activations X(N, static_cast<int64_t>(T) * c.dim, x_on_device);
    {
      Stage s(st, "embed", stream);
      embed_windows(ws, calib, T, X, scratch, stream);
    }
    cuda::BlockWorkspace bw(c, T, false);
    DeviceF32 work(static_cast<size_t>(T) * c.dim);
    peaks.sample();
    // Runs every window through the block in place (the next block's inputs).
    auto advance = [&](const cuda::DeviceBlock& blk) {
      for (int s = 0; s < N; ++s) {
        float* x = X.acquire(s, stream);
        cuda::block_forward_f32(blk.view(), x, T, bw, stream, nullptr);
        X.release(s, true, stream);
      }
    };
    const bool mixed = method == QuantMethod::Mixed24, quik = method == QuantMethod::Quik;
    GptqOptions factor_opts = opts.gptq;
    if (mixed) {
      factor_opts.act_order = false;
      factor_opts.percdamp = opts.mixed24.percdamp;
    }
    for (int l = 0; l < L; ++l) {
      cuda::DeviceBlock blk;
      {
        Stage s(st, "load", stream);
        blk = cuda::load_block_f32(ws, l, scratch, stream);
      }
      if (ckpt.has_block(l)) {   // resume: the block's inputs for the next block, from its saved weights
        Stage s(st, "replay", stream);
        if (opts.sequential) {
          const std::map<std::string, PackedWeight> saved = ckpt.load_block(l);
          for (size_t i = 0; i < 7; ++i)
            blk.replace(static_cast<int>(i), upload(dequantize_packed(saved.at(blk.names[i]), ckpt.dir()), stream));
        }
        advance(blk);
        notify(l + 1, L, "block " + std::to_string(l));
        continue;
      }
      std::map<LinearSlot, cuda::GpuInputStats> stats = slot_stats(c, /*full_hessian=*/true);
      double hessian_s = 0;
      const cuda::BlockCaptureFn cap = [&](LinearSlot slot, const float* x, int rows, int64_t) {
        LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
        const double th = now_s();
        stats.at(slot).add(x, rows, bw.cublas(), stream);
        LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
        hessian_s += now_s() - th;
      };
      {
        Stage s(st, "capture", stream);
        for (int s2 = 0; s2 < N; ++s2) {
          float* x = X.acquire(s2, stream);
          if (opts.sequential) {   // the full-precision outputs are not needed: run a copy
            LOWBIT_CUDA_CHECK(cudaMemcpyAsync(work.get(), x, work.bytes(), cudaMemcpyDeviceToDevice, stream));
            cuda::block_forward_f32(blk.view(), work.get(), T, bw, stream, &cap, /*need_output=*/false);
          } else {
            cuda::block_forward_f32(blk.view(), x, T, bw, stream, &cap);
            X.release(s2, true, stream);
          }
        }
      }
      st["capture"] -= hessian_s;
      st["hessian"] += hessian_s;
      peaks.sample();

      std::map<std::string, PackedWeight> packed;
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      std::map<std::string, double> figures;
      std::optional<cuda::GpuGptqFactor> factor;
      LinearSlot factor_slot = LinearSlot::Qkv;
      for (size_t i = 0; i < 7; ++i) {
        const LinearSlot slot = kLinearSlot[i];
        const int64_t n = blk.shapes[i][0], k = blk.shapes[i][1];
        const float* w = blk.linear[i].get();
        DeviceF32 deq(static_cast<size_t>(n * k));
        const double* h = nullptr;
        {
          Stage s(st, "hessian", stream);
          h = stats.at(slot).hessian(stream);
        }
        Stage s(st, "solve", stream);
        if (quik) {
          const QuikOptions& qo = opts.quik;
          const bool down = slot == LinearSlot::Down;
          const std::vector<double> amax = stats.at(slot).max_abs();
          const int64_t per_dim = qo.outliers >= 0 ? qo.outliers : std::llround(qo.outlier_frac * static_cast<double>(c.dim));
          int64_t count = down ? std::llround(qo.down_factor * static_cast<double>(per_dim)) : per_dim;
          if (qo.outlier_threshold > 0 && *std::max_element(amax.begin(), amax.end()) < qo.outlier_threshold) {
            count = 0;
            figures["quik_without"] += 1;
          }
          const bool w8a8 = down && qo.int8_down_proj;
          QuikStats qs;
          const QuikQuantized qq = cuda::quik_quantize_gpu(w, n, k, h, quik_outlier_columns(amax, count),
                                                           w8a8 ? 8 : qo.wbits, w8a8 ? 8 : qo.abits,
                                                           !w8a8 && qo.act_fp8, qo.clip, qo.percdamp, stream,
                                                           deq.get(), &qs);
          figures["hessian_error"] += qs.hessian_error;
          figures["quik_columns"] += static_cast<double>(qq.outliers());
          Stage p(st, "pack", nullptr);
          packed[blk.names[i]] = pack_quik(qq, storage);
        } else if (mixed) {
          Mixed24Stats ms;
          const bool aligned = opts.mixed24.layout == Mixed24Options::Layout::Aligned ||
                               (opts.mixed24.layout == Mixed24Options::Layout::Auto &&
                                mixed24_aligned_fits(k, opts.mixed24));
          if (aligned) {
            const Mixed24AQuantized mq = cuda::mixed24a_quantize_gpu(w, n, k, h, opts.mixed24, stream, deq.get(), &ms);
            figures["paper_bits"] += mixed24a_paper_bits(mq, ms.outliers);
            figures["hessian_error"] += ms.hessian_error;
            figures["aligned"] += 1;
            Stage p(st, "pack", nullptr);
            packed[blk.names[i]] = pack_mixed24a(mq, storage);
          } else {   // the generic layout has no GPU solver: its CPU twin on the downloaded weight and Hessian
            const std::vector<float> wh = download(w, n * k, stream);
            const std::vector<double> hh = download(h, k * k, stream);
            const Mixed24Quantized mq = mixed24_quantize(wh.data(), n, k, {}, gptq_factor(hh, k, factor_opts),
                                                         opts.mixed24, &ms);
            std::vector<float> d(static_cast<size_t>(n * k));
            mq.dequantize(d.data());
            LOWBIT_CUDA_CHECK(cudaMemcpy(deq.get(), d.data(), d.size() * sizeof(float), cudaMemcpyHostToDevice));
            figures["paper_bits"] += mixed24_paper_bits(mq, ms.outliers);
            figures["hessian_error"] += cuda::hessian_weighted_error_gpu(w, deq.get(), n, k, h, stream);
            figures["generic"] += 1;
            Stage p(st, "pack", nullptr);
            packed[blk.names[i]] = pack_mixed24(mq, storage);
          }
          figures["outliers"] += static_cast<double>(ms.outliers);
        } else {
          if (!factor || factor_slot != slot) {
            factor.reset();
            factor.emplace(cuda::gptq_factor_gpu(h, k, factor_opts, stream));
            factor_slot = slot;
          }
          GptqStats gs;
          const UniformQuantized q = cuda::gptq_quantize_gpu(w, n, k, *factor, opts.gptq, stream, deq.get(), h, &gs);
          figures["hessian_error"] += gs.hessian_error;
          {   // RTN on the same Hessian: what GPTQ's error feedback buys, layer by layer
            DeviceF32 rtn(static_cast<size_t>(n * k));
            cuda::rtn_quantize_gpu(w, n, k, opts.gptq.spec, stream, rtn.get());
            figures["rtn_hessian_error"] += cuda::hessian_weighted_error_gpu(w, rtn.get(), n, k, h, stream);
          }
          Stage p(st, "pack", nullptr);
          packed[blk.names[i]] = pack_uniform(q, storage);
        }
        peaks.sample();
        blk.replace(static_cast<int>(i), std::move(deq));
        // The last linear reading an input frees its statistics (q/k/v share one, gate/up another).
        if (i == 2 || i == 3 || i == 5 || i == 6) {
          if (factor_slot == slot) factor.reset();
          stats.erase(slot);
        }
      }
      save_block(l, packed, figures);
      if (opts.sequential) {   // the next block sees what the quantized model computes
        Stage s(st, "capture", stream);
        advance(blk);
      }
      notify(l + 1, L, "block " + std::to_string(l));
    }
  }

  // Assemble the file: packed linears from the checkpoint (memory-mapped), dense tensors converted one at a time.
  {
    Stage s(st, "write", nullptr);
    LowbitWriteSpec spec;
    spec.source_path = ws.path;
    spec.source_format = model_format_name(ws.format);
    spec.config = c;
    spec.vocab = ws.vocab;
    spec.method_json = method_json(opts);
    std::map<std::string, double> totals;
    for (int l = 0; l < L; ++l) {
      LOWBIT_CHECK(ckpt.has_block(l), ckpt.dir(), ": block ", l, " is missing after the run");
      std::map<std::string, double> figures;
      for (auto& [name, pw] : ckpt.load_block(l, &figures)) spec.packed[name] = std::move(pw);
      for (const auto& [key, v] : figures) totals[key] += v;
    }
    std::vector<std::vector<float>> owned;
    std::vector<std::vector<uint16_t>> halves;
    for (const DenseTensor& d : dense_tensors(c)) {
      owned.emplace_back();
      const float* data = tensor_as_f32(ws, d.name, d.shape, d.qk_rows, owned.back());
      if (opts.dense_dtype == DType::F16) {
        const int64_t n = numel(d.shape);
        std::vector<uint16_t> h(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = f32_to_f16(data[i]);
        halves.push_back(std::move(h));
        owned.back() = {};
        spec.dense.push_back({d.name, DType::F16, d.shape, halves.back().data()});
      } else {
        if (data != owned.back().data()) owned.back() = {};   // zero copy from the file
        spec.dense.push_back({d.name, DType::F32, d.shape, data});
      }
      peaks.sample();
    }
    const LowbitSummary sum = write_lowbit(out_path, spec);
    rep.quantized_weights = sum.quantized_weights;
    rep.avg_bits = sum.avg_bits_per_weight;
    rep.file_bytes = sum.file_bytes;
    rep.hessian_error_sum = totals["hessian_error"];
    rep.rtn_hessian_error_sum = totals["rtn_hessian_error"];
    rep.outliers = static_cast<int64_t>(totals["outliers"]);
    rep.mixed24_aligned_linears = static_cast<int>(totals["aligned"]);
    rep.mixed24_generic_linears = static_cast<int>(totals["generic"]);
    if (method == QuantMethod::Mixed24) rep.paper_avg_bits = totals["paper_bits"] / static_cast<double>(rep.quantized_weights);
    rep.quik_outlier_columns = static_cast<int64_t>(totals["quik_columns"]);
    rep.quik_linears_without_outliers = static_cast<int>(totals["quik_without"]);
    if (method == QuantMethod::AnyPrec) {
      int64_t weights = 0;
      for (const auto& [name, pw] : spec.packed) weights += pw.shape[0] * pw.shape[1];
      for (int b = 0; b < 32; ++b) {
        if (((width_mask >> b) & 1u) == 0) continue;
        uint64_t bits = 0;
        for (const auto& [name, pw] : spec.packed) bits += anyprec_view_bits(pw, b);
        rep.width_avg_bits[b] = static_cast<double>(bits) / static_cast<double>(weights);
        rep.width_weighted_error[b] = totals["werr" + std::to_string(b)];
      }
    }
  }
  ckpt.remove();
  peaks.sample();
  rep.peak_gpu_bytes = peaks.gpu;
  rep.peak_anon_rss_bytes = peaks.anon.peak_bytes();
  rep.peak_rss_bytes = peak_rss_bytes();
  rep.seconds = now_s() - t0;
  return rep;
}

}  // namespace lowbit
