// Token sampling on the GPU: temperature, top-k and top-p over each row of logits, one block per sequence, no sort.
// The CPU twin is Sampler (src/runtime/sampler.h) with the same parameters: the kept set is the same (the top-k
// tokens by logit with ties broken by the lower index, then the smallest prefix of them, in descending order,
// whose probability mass reaches top_p; ties at the top-p boundary are all kept), and the token is drawn from the
// renormalised probabilities of the kept set by inverse CDF in token-index order with the caller's uniform u — so
// the distribution equals the CPU's, the token for a given u need not.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda {

struct GpuSamplingParams {
  float temperature = 1.0f;   // > 0 (temperature 0 is greedy: argmax_rows)
  int top_k = 0;              // 0: off
  float top_p = 1.0f;         // 1: off
};

// logits [rows, vocab] (read only); u [rows] uniform in [0, 1) on the device; out [rows] token ids.
void sample_rows(const float* logits, int rows, int vocab, const GpuSamplingParams& p, const float* u, int32_t* out,
                 cudaStream_t s);

}  // namespace lowbit::cuda
