// perplexity() and generate() (src/runtime/) on the GPU model: the same protocol, options and results.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cuda/gpu_model.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"

namespace lowbit::cuda {

PplResult perplexity_gpu(GpuModel& model, const std::vector<std::vector<int32_t>>& windows, const PplOptions& opts);
// Greedy decoding without a repetition penalty runs entirely on the GPU (argmax on the device, decode steps replayed
// as a CUDA graph); temperature / top-k / top-p sample on the GPU (cuda/sampling.h: the CPU Sampler's distribution,
// seeded the same way); a repetition penalty downloads the last logits and uses the CPU Sampler.
GenerateResult generate_gpu(GpuModel& model, const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                            const GenerateOptions& opts, const std::function<void(const std::string&)>& on_text = nullptr);

}  // namespace lowbit::cuda
