// Token sampling on the CPU: repetition penalty, temperature, top-k, top-p, seeded RNG. temperature 0 = greedy.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace lowbit {

struct SamplingParams {
  float temperature = 0.0f;       // 0: greedy (argmax)
  int top_k = 0;                  // 0: off
  float top_p = 1.0f;             // 1: off
  float repetition_penalty = 1.0f;  // CTRL / HF convention: positive logits / p, negative logits * p
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits [vocab] is modified in place; history = prompt + generated tokens (for the repetition penalty).
  int32_t sample(float* logits, int vocab, const std::vector<int32_t>& history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

void validate_sampling(const SamplingParams& p);   // throws lowbit::Error for out-of-range values

}  // namespace lowbit
