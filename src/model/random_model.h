// Synthetic model sources, "random:<preset>[?layers=N&seed=S]": a Llama-family model at a real shape (Llama 2 7B,
// Llama 3 8B, Llama 2 70B, SmolLM2-135M) or a tiny one for tests, whose weights are generated when read, so that
// quantization can be timed at shapes that are not on disk. Nothing is written out or held: the WeightSet lists
// every tensor (F32, data == nullptr) and tensor_as_f32 (model/weight_convert.h) generates one tensor into its
// scratch buffer on each read. A value depends only on (seed, tensor name, index), so a tensor read twice, or by
// the CPU and the GPU loaders, is the same bits.
//
// Statistics, chosen so that quantizers do real work:
//   linear weights  N(0, kRandomWeightStd), except kRandomOutlierColumnFraction of the input columns (at least one),
//                   which are kRandomOutlierColumnScale times wider: the outlier columns that outlier-aware methods
//                   look for. The columns depend on (seed, k) only, so every weight reading the same input width
//                   has the same ones, as real models' outlier features sit in fixed hidden channels.
//   norm weights    1 + N(0, kRandomNormNoiseStd)
//   embeddings      N(0, kRandomWeightStd) (embed_tokens and an untied lm_head)
// "Normal" is the sum of four 16-bit uniforms of one splitmix64 output (Irwin-Hall, rescaled): exact mean and std,
// tails cut at 3.46 std, and a branch-free loop the compiler vectorizes (the generator sits on the quantizer's
// critical path: a 7B model is 6.7e9 values).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/weight_set.h"

namespace lowbit {

constexpr float kRandomWeightStd = 0.02f;             // linear weights and embeddings (Llama's initializer range)
constexpr float kRandomNormNoiseStd = 0.05f;          // norm weights: 1 + this much noise
constexpr double kRandomOutlierColumnFraction = 0.005;   // of a linear weight's input columns
constexpr float kRandomOutlierColumnScale = 8.0f;     // their std over the others'

// True for "random:..." (read_weights sends such a path here instead of the file system).
bool is_random_source(const std::string& path);
// The presets, smallest first: tiny, smollm2-135m, llama2-7b, llama3-8b, llama2-70b.
std::vector<std::string> random_preset_names();

// The WeightSet of a synthetic source: format Random, the preset's config (layers overridden by ?layers=N, 1..1024),
// no vocabulary, every tensor a data-less F32 view, and the generator (seed from ?seed=S, default 0). Throws one line,
// "<source>: unknown preset 'x' (...)" or "<source>: bad override ...", that lists the presets and the syntax.
WeightSet read_random_model(const std::string& source);

// Generates the tensors of one synthetic source.
class TensorGenerator {
 public:
  explicit TensorGenerator(uint64_t seed) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  // Writes tensor `name` [numel(shape)] into out; the kind (norm, embedding, linear) follows from the name and rank.
  // Rows are generated in parallel (OpenMP); the values do not depend on the thread count.
  void fill(const std::string& name, const std::vector<int64_t>& shape, float* out) const;

 private:
  uint64_t seed_;
};

// The outlier input columns of a linear weight with k columns under `seed`: sorted, distinct,
// max(1, round(k * kRandomOutlierColumnFraction)) of them.
std::vector<int64_t> random_outlier_columns(uint64_t seed, int64_t k);

}  // namespace lowbit
