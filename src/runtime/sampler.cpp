#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace lowbit {

void validate_sampling(const SamplingParams& p) {
  LOWBIT_CHECK(p.temperature >= 0 && std::isfinite(p.temperature), "--temperature must be >= 0 (0 = greedy), got ",
               p.temperature);
  LOWBIT_CHECK(p.top_k >= 0, "--top-k must be >= 0 (0 = off), got ", p.top_k);
  LOWBIT_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1] (1 = off), got ", p.top_p);
  LOWBIT_CHECK(p.repetition_penalty > 0 && std::isfinite(p.repetition_penalty),
               "--repetition-penalty must be > 0 (1 = off), got ", p.repetition_penalty);
  LOWBIT_CHECK(p.presence_penalty >= -2 && p.presence_penalty <= 2, "presence_penalty must be in [-2, 2], got ",
               p.presence_penalty);
  LOWBIT_CHECK(p.frequency_penalty >= -2 && p.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2], got ",
               p.frequency_penalty);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate_sampling(p); }

void Sampler::penalize(float* logits, int vocab, const std::vector<int32_t>& history, size_t prompt_len) const {
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> count;
    for (size_t i = std::min(prompt_len, history.size()); i < history.size(); ++i) ++count[history[i]];
    for (const auto& [t, c] : count)
      if (t >= 0 && t < vocab) logits[t] -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(c);
  }
  if (p_.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= vocab) continue;
      logits[t] = logits[t] > 0 ? logits[t] / p_.repetition_penalty : logits[t] * p_.repetition_penalty;
    }
  }
}

size_t Sampler::kept(const float* logits, int vocab, std::vector<double>& prob) {
  cand_.resize(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) cand_[static_cast<size_t>(i)] = {logits[i] / p_.temperature, i};
  size_t n = cand_.size();
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // softmax over the kept candidates (sorted descending)
  const float mx = cand_[0].first;
  double sum = 0;
  prob.resize(n);
  for (size_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(static_cast<double>(cand_[i].first - mx)));
  for (double& q : prob) q /= sum;
  if (p_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p (at least one token)
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += prob[keep++];
      if (cum >= p_.top_p) break;
    }
    n = keep;
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += prob[i];
    for (size_t i = 0; i < n; ++i) prob[i] /= s;
  }
  return n;
}

int32_t Sampler::sample(float* logits, int vocab, const std::vector<int32_t>& history, size_t prompt_len) {
  penalize(logits, vocab, history, prompt_len);
  if (p_.temperature == 0.0f) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<double> prob;
  const size_t n = kept(logits, vocab, prob);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double r = u(rng_), cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += prob[i];
    if (r < cum) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

void Sampler::distribution(float* logits, int vocab, const std::vector<int32_t>& history, size_t prompt_len,
                           std::vector<double>& probs) {
  penalize(logits, vocab, history, prompt_len);
  probs.assign(static_cast<size_t>(vocab), 0.0);
  if (p_.temperature == 0.0f) {
    probs[static_cast<size_t>(std::max_element(logits, logits + vocab) - logits)] = 1.0;
    return;
  }
  std::vector<double> prob;
  const size_t n = kept(logits, vocab, prob);
  for (size_t i = 0; i < n; ++i) probs[static_cast<size_t>(cand_[i].second)] = prob[i];
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

int32_t Sampler::draw(const std::vector<double>& probs) {
  double total = 0;
  for (double q : probs) total += q;
  LOWBIT_CHECK(total > 0, "sampler: no probability mass to draw from");
  const double r = uniform() * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (r < cum) return last;
  }
  return last;
}

}  // namespace lowbit
