#include "backend_cuda/model/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "core/knobs.h"
#include "core/rss.h"
#include "model/weight_convert.h"
#include "runtime/sampler.h"

namespace lowbit::cuda {

namespace {

class CudaSequence final : public Sequence {
 public:
  explicit CudaSequence(GpuKVCache c) : cache(std::move(c)) {}
  int capacity() const override { return cache.capacity; }
  int length() const override { return cache.len[0]; }
  GpuKVCache cache;
};

class CudaDecoder final : public Decoder {
 public:
  CudaDecoder(GpuModel& m, GpuKVCache& cache, const SamplingParams& p, int bits)
      : m_(m), cache_(cache), bits_(bits), sampler_(p), rng_(p.seed),
        greedy_on_device_(p.temperature == 0.0f && !sampler_.penalizes()),
        // The penalties need the history: that path downloads the logits and uses the CPU Sampler.
        gpu_sampling_(!greedy_on_device_ && !sampler_.penalizes()) {
    gp_.temperature = p.temperature;
    gp_.top_k = p.top_k;
    gp_.top_p = p.top_p;
  }

  void prefill(std::span<const int32_t> prompt) override {
    LOWBIT_CHECK(cache_.len[0] == 0, "prefill: the sequence already holds ", cache_.len[0], " positions");
    dlog_ = m_.forward(prompt.data(), 1, static_cast<int>(prompt.size()), cache_, false, bits_);
    prompt_len_ = prompt.size();
    if (greedy_on_device_) m_.greedy_from_last_logits(1);
    m_.synchronize();
    device_token_known_ = false;
  }

  int32_t next(const std::vector<int32_t>& history) override {
    if (greedy_on_device_) {
      device_token_ = m_.get_decode_tokens(1)[0];
      device_token_known_ = true;
      return device_token_;
    }
    if (gpu_sampling_) {
      const float u = std::min(static_cast<float>(uniform_(rng_)), 0x1.fffffep-1f);   // [0, 1) after rounding to float
      m_.sample_from_last_logits(1, gp_, {u});
      return m_.get_decode_tokens(1)[0];
    }
    logits_.resize(static_cast<size_t>(m_.config().vocab_size));
    // The model's stream is non-blocking: the copy must be queued on it, then waited for.
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(logits_.data(), dlog_, sizeof(float) * logits_.size(), cudaMemcpyDeviceToHost,
                                      m_.stream()));
    m_.synchronize();
    return sampler_.sample(logits_.data(), m_.config().vocab_size, history, prompt_len_);
  }

  void advance(int32_t token) override {
    if (greedy_on_device_) {
      // The step reads its input token on the device, where next() left it; any other token is uploaded first.
      if (!device_token_known_ || token != device_token_) m_.set_decode_tokens({token});
      m_.decode_step_greedy(cache_, bits_, /*use_graph=*/true);
      device_token_known_ = false;
    } else {
      dlog_ = m_.forward(&token, 1, 1, cache_, false, bits_);
    }
  }

  void wait() override { m_.synchronize(); }

 private:
  GpuModel& m_;
  GpuKVCache& cache_;
  const int bits_;
  Sampler sampler_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  GpuSamplingParams gp_;
  const bool greedy_on_device_, gpu_sampling_;
  const float* dlog_ = nullptr;   // the device logits of the last forward ([vocab])
  std::vector<float> logits_;     // their host copy (repetition-penalty path)
  int32_t device_token_ = -1;     // the token the device holds for the next step, when known
  bool device_token_known_ = false;
  size_t prompt_len_ = 0;
};

// Continuous batching's cache: a paged GpuKVCache of slots + 1 sequences over blocks + 1 blocks. The last sequence
// and the last block are the padding rows' of GpuModel::decode_slots (position 0 of that block), outside the pool the
// slots share.
class CudaBatchCache final : public BatchCache {
 public:
  CudaBatchCache(GpuModel& m, int slots, int capacity, int blocks)
      : BatchCache(slots, capacity, blocks, kKvBlock), cache(m.new_paged_cache(slots + 1, capacity, blocks + 1, kKvBlock)) {
    cache.table[static_cast<size_t>(slots) * cache.max_blocks] = blocks;
  }
  int length(int slot) const override { return cache.len[checked(slot)]; }
  uint64_t bytes() const override { return cache.bytes(); }
  GpuKVCache cache;

 private:
  void set_length(int slot, int length) override { cache.len[checked(slot)] = length; }
  void table_changed(int slot) override {
    const std::vector<int32_t>& t = table(slot);
    std::copy(t.begin(), t.end(), cache.table.begin() + static_cast<std::ptrdiff_t>(slot) * cache.max_blocks);
    cache.table_dirty = true;
  }
};

CudaBatchCache& batch_cache_of(BatchCache& c) {
  auto* b = dynamic_cast<CudaBatchCache*>(&c);
  LOWBIT_CHECK(b != nullptr, "cuda backend: the batch cache belongs to another backend");
  return *b;
}

}  // namespace

GpuKVCache& kv_cache_of(Sequence& seq) {
  auto* s = dynamic_cast<CudaSequence*>(&seq);
  LOWBIT_CHECK(s != nullptr, "cuda backend: the sequence belongs to another backend");
  return s->cache;
}

CudaBackend::CudaBackend(WeightSet ws, const BackendOptions& opts) : Backend(ws.path, ws.format) {
  LOWBIT_CHECK(!opts.reference, "--device cuda: the reference forward (--reference) runs on the CPU");
  // The CUDA context first, so that the memory it takes is part of the baseline, not of the load.
  LOWBIT_CUDA_CHECK(cudaFree(nullptr));
  const auto t0 = std::chrono::steady_clock::now();
  AnonRssPeak peak;
  ws.config.validate(ws.path);
  owned_tok_ = make_model_tokenizer(ws);
  owned_ = std::make_unique<GpuModel>(ws, [&peak] { peak.sample(); });
  ws = WeightSet();   // unmaps the file: everything on the device from here on
  model_ = owned_.get();
  tok_ = owned_tok_.get();
  peak.sample();
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.anon_rss_before_bytes = peak.start_bytes();
  stats_.peak_anon_rss_bytes = peak.peak_bytes();
  stats_.vm_hwm_bytes = peak_rss_bytes();
  device_ = "cuda: " + cuda::device_name();
}

CudaBackend::CudaBackend(GpuModel& model, const Tokenizer* tokenizer, std::string path, ModelFormat format)
    : Backend(std::move(path), format), model_(&model), tok_(tokenizer), device_("cuda: " + cuda::device_name()) {}

CudaBackend::~CudaBackend() = default;

const Tokenizer& CudaBackend::tokenizer() const {
  LOWBIT_CHECK(tok_ != nullptr, path(), ": the model has no tokenizer (for llama2.c pass --tokenizer)");
  return *tok_;
}

void CudaBackend::check_bits(int bits) const {
  uint32_t mask = 0;
  for (int b : model_->widths()) mask |= 1u << b;
  check_served_width(path(), mask, bits);
}

std::unique_ptr<Sequence> CudaBackend::new_sequence(int capacity) {
  return std::make_unique<CudaSequence>(model_->new_cache(1, capacity));
}

WindowScore CudaBackend::score_window(Sequence& seq, std::span<const int32_t> tokens, int bits, bool reference) {
  LOWBIT_CHECK(!reference, "perplexity: the reference path runs on the CPU (--device cpu)");
  WindowScore s;
  model_->score_window(tokens.data(), static_cast<int>(tokens.size()), kv_cache_of(seq), bits, &s.nll_sum,
                       &s.top1_hits);
  return s;
}

std::unique_ptr<Decoder> CudaBackend::new_decoder(Sequence& seq, const SamplingParams& sampling, int bits) {
  return std::make_unique<CudaDecoder>(*model_, kv_cache_of(seq), sampling, bits);
}

CudaBackend::PinnedLogits::~PinnedLogits() {
  if (p != nullptr) cudaFreeHost(p);
}

float* CudaBackend::PinnedLogits::reserve(size_t n) {
  if (n > floats) {
    if (p != nullptr) cudaFreeHost(p);
    p = nullptr;
    floats = 0;
    LOWBIT_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(float)));
    floats = n;
  }
  return p;
}

void CudaBackend::download_logits(const float* device, size_t n, float* out) {
  float* stage = pinned_.reserve(n);
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(stage, device, sizeof(float) * n, cudaMemcpyDeviceToHost, model_->stream()));
  model_->synchronize();
  std::memcpy(out, stage, sizeof(float) * n);
}

uint64_t CudaBackend::kv_bytes_per_position() const {
  const ModelConfig& c = config();
  return static_cast<uint64_t>(c.n_layers) * 2 * c.kv_dim() * sizeof(__half);
}

std::unique_ptr<BatchCache> CudaBackend::new_batch_cache(int slots, int capacity, int blocks) {
  LOWBIT_CHECK(slots >= 1 && capacity >= 1 && capacity <= config().max_seq_len && blocks >= 0, "batch cache: ", slots,
               " slots of ", capacity, " positions, ", blocks, " blocks (the model's context is ", config().max_seq_len, ")");
  if (blocks == 0) blocks = full_kv_blocks(slots, capacity);
  return std::make_unique<CudaBatchCache>(*model_, slots, capacity, blocks);
}

uint64_t CudaBackend::kv_bytes_available() const {
  size_t free = 0, total = 0;
  LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  // Left for the forward's workspace, the GEMM scratch and the decode graphs, which grow after the cache is made.
  const uint64_t margin = std::max<uint64_t>(uint64_t{2} << 30, total / 20);
  return free > margin ? free - margin : 0;
}

void CudaBackend::batch_extend(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) {
  CudaBatchCache& bc = batch_cache_of(cache);
  bc.check_room(slot, bc.length(slot) + static_cast<int>(tokens.size()));
  const float* d = model_->forward(tokens.data(), 1, static_cast<int>(tokens.size()), bc.cache, false, bits,
                                   slot);
  if (logits != nullptr) download_logits(d, static_cast<size_t>(config().vocab_size), logits);
  else model_->synchronize();
}

void CudaBackend::batch_verify(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) {
  CudaBatchCache& bc = batch_cache_of(cache);
  bc.check_room(slot, bc.length(slot) + static_cast<int>(tokens.size()));
  const float* d = model_->forward(tokens.data(), 1, static_cast<int>(tokens.size()), bc.cache, true, bits,
                                   slot);
  download_logits(d, static_cast<size_t>(config().vocab_size) * tokens.size(), logits);
}

namespace {
bool& mixed_step_state() {   // from the environment on first use
  static bool on = knob_bool(Knob::MixedStep);
  return on;
}
}  // namespace
bool mixed_step_enabled() { return mixed_step_state(); }
void set_mixed_step(bool on) { mixed_step_state() = on; }

int CudaBackend::batch_decode(BatchCache& cache, std::span<const int> slots, std::span<const int32_t> tokens,
                              std::span<const int> bits, float* logits, size_t logit_rows, int32_t* greedy) {
  LOWBIT_CHECK(logit_rows <= slots.size() && (bits.size() == 1 || bits.size() == slots.size()), "batch_decode: ",
               logit_rows, " rows of logits, ", bits.size(), " widths for ", slots.size(), " slots");
  CudaBatchCache& bc = batch_cache_of(cache);
  for (int slot : slots) bc.check_room(slot, bc.length(slot) + 1);
  const size_t V = static_cast<size_t>(config().vocab_size), n = slots.size();
  auto width = [&](size_t i) { return bits.size() == 1 ? bits[0] : bits[i]; };
  std::vector<int> widths;
  for (size_t i = 0; i < n; ++i)
    if (std::find(widths.begin(), widths.end(), width(i)) == widths.end()) widths.push_back(width(i));
  // The rows in `rows` as one step (all of them at width w, or, w < 0, each at its own width in one mixed step).
  auto step = [&](const std::vector<size_t>& rows, int w) {
    std::vector<int> sl;
    std::vector<int32_t> tk;
    std::vector<int> rb;
    for (size_t i : rows) {
      sl.push_back(slots[i]);
      tk.push_back(tokens[i]);
      rb.push_back(width(i));
    }
    const float* d = w >= 0 ? model_->decode_slots(bc.cache, sl, tk, w, /*use_graph=*/true)
                            : model_->decode_slots(bc.cache, sl, tk, rb, /*use_graph=*/true);
    if (greedy != nullptr) {   // the step's own argmax (decode_slots picks every row's on the device)
      const std::vector<int32_t> ids = model_->get_decode_tokens(static_cast<int>(rows.size()));
      for (size_t j = 0; j < rows.size(); ++j) greedy[rows[j]] = ids[j];
    }
    // The rows that want logits lead the caller's order, so they lead each step's rows too: one download.
    size_t want = 0;
    while (want < rows.size() && rows[want] < logit_rows) ++want;
    if (want == 0) return;
    if (want == rows.size() && rows.front() == 0 && rows.back() == rows.size() - 1) {
      download_logits(d, V * want, logits);
      return;
    }
    std::vector<float> part(V * want);
    download_logits(d, V * want, part.data());
    for (size_t j = 0; j < want; ++j) std::copy_n(part.data() + j * V, V, logits + rows[j] * V);
  };
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  if (widths.size() == 1) {
    step(all, widths[0]);
    return 1;
  }
  if (mixed_step_enabled() && model_->mixed_decode_serves(static_cast<int>(n))) {
    step(all, -1);
    return 1;
  }
  for (const int w : widths) {
    std::vector<size_t> rows;
    for (size_t i = 0; i < n; ++i)
      if (width(i) == w) rows.push_back(i);
    step(rows, w);
  }
  return static_cast<int>(widths.size());
}

}  // namespace lowbit::cuda

namespace lowbit {

namespace {
std::unique_ptr<Backend> open_cuda_backend(WeightSet ws, const BackendOptions& opts) {
  return std::make_unique<cuda::CudaBackend>(std::move(ws), opts);
}
const CudaBackendHooks kCudaHooks{&cuda::device_available, &open_cuda_backend};
}  // namespace

// The CUDA build's open_backend (runtime/backend.h): the one device choice of open_backend_with, with the GPU in it.
// Defined here rather than in runtime/backend.cpp because the runtime library is linked after this one.
std::unique_ptr<Backend> open_backend(const std::string& path, const BackendOptions& opts) {
  return open_backend_with(path, opts, &kCudaHooks);
}

}  // namespace lowbit
