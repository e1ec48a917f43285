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
  // OpenAI convention, over the generated tokens only: logit -= presence * (count > 0) + frequency * count.
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits [vocab] is modified in place; history = prompt + generated tokens (the repetition penalty reads all of
  // it; the presence and frequency penalties the generated ones, history[prompt_len..]).
  int32_t sample(float* logits, int vocab, const std::vector<int32_t>& history, size_t prompt_len = 0);
  // Whether a penalty reads the history (the GPU's on-device paths do not take one).
  bool penalizes() const {
    return p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  }
  bool greedy() const { return p_.temperature == 0.0f; }

  // Speculative decoding: the distribution sample() draws from, over the whole vocabulary (penalties, temperature,
  // top-k, top-p applied; greedy: all mass on the argmax): probs [vocab], zero outside the kept tokens. logits are
  // modified in place as by sample().
  void distribution(float* logits, int vocab, const std::vector<int32_t>& history, size_t prompt_len,
                    std::vector<double>& probs);
  double uniform();                                   // one draw in [0, 1) from this sampler's generator
  int32_t draw(const std::vector<double>& probs);     // a token from unnormalised non-negative weights

 private:
  void penalize(float* logits, int vocab, const std::vector<int32_t>& history, size_t prompt_len) const;
  // The tokens sampling keeps, most likely first, with their probabilities (top-k, top-p applied): n of cand_.
  size_t kept(const float* logits, int vocab, std::vector<double>& prob);
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

void validate_sampling(const SamplingParams& p);   // throws lowbit::Error for out-of-range values

}  // namespace lowbit
