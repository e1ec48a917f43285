#include "runtime/cpu_backend.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lowbit {

namespace {

class CpuSequence final : public Sequence {
 public:
  explicit CpuSequence(KVCache c) : cache(std::move(c)) {}
  int capacity() const override { return cache.capacity; }
  int length() const override { return cache.len; }
  KVCache cache;
};

KVCache& cache_of(Sequence& seq) {
  auto* s = dynamic_cast<CpuSequence*>(&seq);
  LOWBIT_CHECK(s != nullptr, "cpu backend: the sequence belongs to another backend");
  return s->cache;
}

class CpuDecoder final : public Decoder {
 public:
  CpuDecoder(const Model& m, KVCache& cache, const SamplingParams& p, int bits, bool reference)
      : m_(m), cache_(cache), sampler_(p), logits_(static_cast<size_t>(m.config().vocab_size)), bits_(bits),
        reference_(reference) {}

  void prefill(std::span<const int32_t> prompt) override {
    LOWBIT_CHECK(cache_.len == 0, "prefill: the sequence already holds ", cache_.len, " positions");
    run(prompt.data(), static_cast<int>(prompt.size()));
  }
  int32_t next(const std::vector<int32_t>& history) override {
    return sampler_.sample(logits_.data(), m_.config().vocab_size, history);
  }
  void advance(int32_t token) override { run(&token, 1); }
  void wait() override {}

 private:
  void run(const int32_t* tokens, int n) {
    if (reference_) m_.forward_ref(tokens, n, cache_, logits_.data(), false, bits_);
    else m_.forward(tokens, n, cache_, logits_.data(), false, bits_);
  }
  const Model& m_;
  KVCache& cache_;
  Sampler sampler_;
  std::vector<float> logits_;   // [vocab]: the last position's
  int bits_;
  bool reference_;
};

}  // namespace

CpuBackend::CpuBackend(std::unique_ptr<Model> model, const BackendOptions& opts, const LoadStats& stats)
    : Backend(model->weights().path, model->weights().format), owned_(std::move(model)), model_(owned_.get()),
      reference_(opts.reference), stats_(stats) {}

CpuBackend::CpuBackend(const Model& model) : Backend(model.weights().path, model.weights().format), model_(&model) {}

std::unique_ptr<Sequence> CpuBackend::new_sequence(int capacity) {
  return std::make_unique<CpuSequence>(model_->new_cache(capacity));
}

WindowScore CpuBackend::score_window(Sequence& seq, std::span<const int32_t> tokens, int bits, bool reference) {
  KVCache& cache = cache_of(seq);
  const int n = static_cast<int>(tokens.size());
  LOWBIT_CHECK(n >= 2 && n <= cache.capacity, "score_window: a window of ", n, " tokens (2 to ", cache.capacity,
               " fit this sequence)");
  const int V = config().vocab_size;
  cache.clear();
  logits_.resize(static_cast<size_t>(n) * V);
  if (reference || reference_) model_->forward_ref(tokens.data(), n, cache, logits_.data(), true, bits);
  else model_->forward(tokens.data(), n, cache, logits_.data(), true, bits);
  double window_nll = 0;   // double: a window of 2048 predictions, many windows
  int64_t window_correct = 0;
  const float* logits = logits_.data();
#pragma omp parallel for reduction(+ : window_nll, window_correct) schedule(static) if (static_cast<int64_t>(n) * V >= (1 << 16))
  for (int t = 0; t < n - 1; ++t) {
    const float* lg = logits + static_cast<size_t>(t) * V;
    float mx = lg[0];
    int arg = 0;
    for (int i = 1; i < V; ++i)
      if (lg[i] > mx) { mx = lg[i]; arg = i; }
    // float exp (vectorizes) with a double total: 49k terms <= 1 each, so float partial sums lose < 1e-6.
    double sum = 0;
    for (int i0 = 0; i0 < V; i0 += 1024) {
      float part = 0;
      const int i1 = std::min(V, i0 + 1024);
      for (int i = i0; i < i1; ++i) part += std::exp(lg[i] - mx);
      sum += part;
    }
    const int target = tokens[static_cast<size_t>(t) + 1];
    window_nll += std::log(sum) + mx - lg[target];
    window_correct += arg == target;
  }
  return {window_nll, window_correct};
}

std::unique_ptr<Decoder> CpuBackend::new_decoder(Sequence& seq, const SamplingParams& sampling, int bits) {
  return std::make_unique<CpuDecoder>(*model_, cache_of(seq), sampling, bits, reference_);
}

}  // namespace lowbit
