// The CPU backend: the fp32 Model (src/model) behind the Backend interface. Window scoring and generation run
// Model::forward (or forward_ref, the scalar oracle) exactly as the CPU always has: the same calls, the same
// reductions, so perplexity and generation through a CpuBackend give the Model's numbers bit for bit.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/backend.h"

namespace lowbit {

class CpuBackend final : public Backend {
 public:
  // Owns the model. opts.reference: every forward through forward_ref.
  CpuBackend(std::unique_ptr<Model> model, const BackendOptions& opts, const LoadStats& stats);
  // Borrows a model the caller keeps alive (the Model overloads of perplexity() and generate()).
  explicit CpuBackend(const Model& model);

  std::string device_name() const override { return "cpu"; }
  const ModelConfig& config() const override { return model_->config(); }
  bool has_tokenizer() const override { return model_->has_tokenizer(); }
  const Tokenizer& tokenizer() const override { return model_->tokenizer(); }
  std::vector<int> widths() const override { return model_->widths(); }
  void check_bits(int bits) const override { model_->check_bits(bits); }
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

  const Model& model() const { return *model_; }

 private:
  std::unique_ptr<Model> owned_;
  const Model* model_;
  bool reference_ = false;
  LoadStats stats_;
  std::vector<float> logits_;   // score_window's [n, vocab] (kept between windows); batch_decode's rows not asked for
};

}  // namespace lowbit
