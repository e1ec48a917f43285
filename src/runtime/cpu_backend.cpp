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
    prompt_len_ = prompt.size();
  }
  int32_t next(const std::vector<int32_t>& history) override {
    return sampler_.sample(logits_.data(), m_.config().vocab_size, history, prompt_len_);
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
  size_t prompt_len_ = 0;
};

// The paged cache on the CPU: one fp32 pool [blocks][layers][kKvBlock][kv_dim] for k and one for v, allocated
// uninitialised (the pages are committed as positions are written, so an idle pool costs address space, not memory),
// and per slot a KVCache viewing the pool through the slot's block table.
class CpuBatchCache final : public BatchCache {
 public:
  CpuBatchCache(const ModelConfig& c, int slots, int capacity, int blocks)
      : BatchCache(slots, capacity, blocks, kKvBlock), block_floats_(static_cast<size_t>(c.n_layers) * kKvBlock * c.kv_dim()),
        k_(std::make_unique_for_overwrite<float[]>(block_floats_ * blocks)),
        v_(std::make_unique_for_overwrite<float[]>(block_floats_ * blocks)), caches_(static_cast<size_t>(slots)) {
    for (int s = 0; s < slots; ++s) {
      KVCache& kv = caches_[static_cast<size_t>(s)];
      kv.n_layers = c.n_layers;
      kv.capacity = capacity;
      kv.kv_dim = c.kv_dim();
      kv.pool_k = k_.get();
      kv.pool_v = v_.get();
      kv.table = table(s).data();
      kv.block = kKvBlock;
    }
  }
  int length(int slot) const override { return caches_[checked(slot)].len; }
  uint64_t bytes() const override { return 2 * block_floats_ * blocks_total() * sizeof(float); }
  // The slot's cache for a forward of `n` more positions (reserved, or a one-line error).
  KVCache& at(int slot, int n) {
    KVCache& c = caches_[checked(slot)];
    check_room(slot, c.len + n);
    return c;
  }

 private:
  void set_length(int slot, int length) override { caches_[checked(slot)].len = length; }
  void table_changed(int) override {}   // the KVCache views read the table in place
  size_t block_floats_;
  std::unique_ptr<float[]> k_, v_;
  std::vector<KVCache> caches_;
};

CpuBatchCache& batch_cache_of(BatchCache& cache) {
  auto* c = dynamic_cast<CpuBatchCache*>(&cache);
  LOWBIT_CHECK(c != nullptr, "cpu backend: the batch cache belongs to another backend");
  return *c;
}

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

uint64_t CpuBackend::kv_bytes_per_position() const {
  const ModelConfig& c = config();
  return static_cast<uint64_t>(c.n_layers) * 2 * c.kv_dim() * sizeof(float);
}

std::unique_ptr<BatchCache> CpuBackend::new_batch_cache(int slots, int capacity, int blocks) {
  LOWBIT_CHECK(slots >= 1 && capacity >= 1 && capacity <= config().max_seq_len && blocks >= 0, "batch cache: ", slots,
               " slots of ", capacity, " positions, ", blocks, " blocks (the model's context is ", config().max_seq_len, ")");
  if (blocks == 0) blocks = full_kv_blocks(slots, capacity);
  return std::make_unique<CpuBatchCache>(config(), slots, capacity, blocks);
}

uint64_t CpuBackend::kv_bytes_available() const { return UINT64_MAX; }

void CpuBackend::batch_extend(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) {
  const int n = static_cast<int>(tokens.size());
  KVCache& c = batch_cache_of(cache).at(slot, n);
  if (reference_) model_->forward_ref(tokens.data(), n, c, logits, false, bits);
  else model_->forward(tokens.data(), n, c, logits, false, bits);
}

void CpuBackend::batch_verify(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) {
  const int n = static_cast<int>(tokens.size());
  KVCache& c = batch_cache_of(cache).at(slot, n);
  if (reference_) model_->forward_ref(tokens.data(), n, c, logits, true, bits);
  else model_->forward(tokens.data(), n, c, logits, true, bits);
}

int CpuBackend::batch_decode(BatchCache& cache, std::span<const int> slots, std::span<const int32_t> tokens,
                             std::span<const int> bits, float* logits, size_t logit_rows, int32_t* greedy) {
  LOWBIT_CHECK(slots.size() == tokens.size() && !slots.empty() && logit_rows <= slots.size() &&
                   (bits.size() == 1 || bits.size() == slots.size()),
               "batch_decode: ", slots.size(), " slots, ", tokens.size(), " tokens, ", bits.size(), " widths, ",
               logit_rows, " rows of logits");
  CpuBatchCache& bc = batch_cache_of(cache);
  const size_t V = static_cast<size_t>(config().vocab_size), n = slots.size();
  auto width = [&](size_t i) { return bits.size() == 1 ? bits[0] : bits[i]; };
  // Every row's logits, in the caller's buffer when it has room for all of them.
  float* all = logits;
  if (logit_rows < n) {
    logits_.resize(n * V);
    all = logits_.data();
  }
  // One batched forward per width present (the CPU reads each width's planes for its rows).
  std::vector<int> widths;
  for (size_t i = 0; i < n; ++i)
    if (std::find(widths.begin(), widths.end(), width(i)) == widths.end()) widths.push_back(width(i));
  for (const int w : widths) {
    std::vector<size_t> rows;
    for (size_t i = 0; i < n; ++i)
      if (width(i) == w) rows.push_back(i);
    if (reference_) {
      for (size_t i : rows) model_->forward_ref(&tokens[i], 1, bc.at(slots[i], 1), all + i * V, false, w);
      continue;
    }
    std::vector<KVCache*> caches;
    std::vector<int32_t> toks;
    for (size_t i : rows) {
      caches.push_back(&bc.at(slots[i], 1));
      toks.push_back(tokens[i]);
    }
    if (rows.size() == n) {
      model_->forward_batch(toks.data(), caches, all, w);
    } else {
      std::vector<float> part(rows.size() * V);
      model_->forward_batch(toks.data(), caches, part.data(), w);
      for (size_t j = 0; j < rows.size(); ++j) std::copy_n(part.data() + j * V, V, all + rows[j] * V);
    }
  }
  if (greedy != nullptr)
    for (size_t i = 0; i < n; ++i)
      greedy[i] = static_cast<int32_t>(std::max_element(all + i * V, all + (i + 1) * V) - (all + i * V));
  if (all != logits) std::copy_n(all, logit_rows * V, logits);
  return static_cast<int>(widths.size());
}

}  // namespace lowbit
