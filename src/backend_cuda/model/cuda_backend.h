// The CUDA backend: cuda::GpuModel behind the Backend interface (runtime/backend.h), loaded straight from the model
// file (GpuModel(const WeightSet&): one tensor's fp32 scratch in host memory at a time, never the whole model).
//
// Window scoring runs the all-position forward and the NLL / top-1 kernel on the device (GpuModel::score_window).
// Generation picks its path once from the sampling parameters:
//   greedy, no repetition penalty    argmax on the device, decode steps replayed as a CUDA graph (the token stays on
//                                    the device between steps; only its value is read back);
//   temperature / top-k / top-p      the GPU sampling kernel (backend_cuda/ops/sampling.h: the CPU Sampler's
//                                    distribution) with one uniform per step from mt19937_64(seed), as the CPU draws;
//   a repetition penalty             the last logits downloaded and the CPU Sampler (it needs the history).
#pragma once
#include <memory>
#include <string>

#include "backend_cuda/model/gpu_model.h"
#include "runtime/backend.h"

namespace lowbit::cuda {

// Whether batch_decode runs rows of different any-precision widths as one mixed-width forward (GpuModel::decode_slots
// with per-row widths) where the model serves it, instead of one forward per width: LOWBIT_MIXED_STEP (core/knobs.h,
// read once); set_mixed_step() overrides it (bench --serve times both in one run).
bool mixed_step_enabled();
void set_mixed_step(bool on);

class CudaBackend final : public Backend {
 public:
  // Uploads ws to the current device, timing the load and sampling host memory after every tensor (load_stats()).
  // The file's mappings are released once the weights are on the device; the tokenizer and config are kept.
  CudaBackend(WeightSet ws, const BackendOptions& opts);
  // Borrows a GPU model and (optionally) a tokenizer that the caller keeps alive (tests comparing models built
  // differently).
  CudaBackend(GpuModel& model, const Tokenizer* tokenizer, std::string path, ModelFormat format);
  ~CudaBackend() override;

  std::string device_name() const override { return device_; }
  const ModelConfig& config() const override { return model_->config(); }
  bool has_tokenizer() const override { return tok_ != nullptr; }
  const Tokenizer& tokenizer() const override;
  std::vector<int> widths() const override { return model_->widths(); }
  void check_bits(int bits) const override;
  uint64_t weight_bytes_per_token(int bits) const override { return model_->weight_bytes_per_token(bits); }
  LoadStats load_stats() const override { return stats_; }

  std::unique_ptr<Sequence> new_sequence(int capacity) override;
  WindowScore score_window(Sequence& seq, std::span<const int32_t> tokens, int bits, bool reference) override;
  std::unique_ptr<Decoder> new_decoder(Sequence& seq, const SamplingParams& sampling, int bits) override;
  uint64_t kv_bytes_per_position() const override;
  std::unique_ptr<BatchCache> new_batch_cache(int slots, int capacity, int blocks) override;
  uint64_t kv_bytes_available() const override;
  void batch_extend(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) override;
  void batch_verify(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) override;
  int batch_decode(BatchCache& cache, std::span<const int> slots, std::span<const int32_t> tokens, std::span<const int> bits,
                   float* logits, size_t logit_rows, int32_t* greedy) override;

  GpuModel& model() { return *model_; }
  const GpuModel& model() const { return *model_; }

 private:
  std::unique_ptr<GpuModel> owned_;
  GpuModel* model_ = nullptr;
  std::unique_ptr<Tokenizer> owned_tok_;
  const Tokenizer* tok_ = nullptr;
  std::string device_;
  LoadStats stats_;
  // Pinned host memory the batch paths copy logits through (a pageable copy is staged by the driver, slower).
  struct PinnedLogits {
    float* p = nullptr;
    size_t floats = 0;
    ~PinnedLogits();
    float* reserve(size_t n);
  } pinned_;
  // Copies n floats of device logits to host out through the pinned buffer, on the model's stream, and waits.
  void download_logits(const float* device, size_t n, float* out);
};

// The KV cache of a sequence of a CudaBackend (a one-sequence GpuKVCache); fails for another backend's sequence.
GpuKVCache& kv_cache_of(Sequence& seq);

}  // namespace lowbit::cuda
