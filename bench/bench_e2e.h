// `lowbit bench --e2e`: end-to-end speed of the GPU forward on model shapes that are not on disk (random weights
// generated on the device): prefill tokens/s, greedy decode tokens/s at batch 1 and 8 (CUDA-graph steps), and the
// bytes each configuration holds on the GPU, for fp16, any-precision widths and 2/4/16 mixed24a.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "backend_cuda/model/gpu_model.h"

namespace lowbit::cuda {

struct E2EBenchOptions {
  std::vector<std::string> shapes = {"llama2-7b"};   // llama2-7b | llama3-8b | llama2-70b
  std::vector<std::string> kinds = {"fp16", "anyprec", "mixed24a"};
  std::vector<int> bits = {3, 4, 8};                  // any-precision widths
  int prefill = 512, prompt = 128, decode = 256;
  std::vector<int> batches = {1, 8};
  // Speculative decoding step times instead of the table (any-precision weights): each width's decode step, the
  // target's verify forward of 1..9 tokens after a 512-token context, and the speedup they model for a range of
  // acceptance rates.
  bool speculative = false;
  int spec_target = 8;
};

void run_speculative_timing(const E2EBenchOptions& o, std::ostream& out);

void run_e2e_bench(const E2EBenchOptions& o, std::ostream& out);

// The --model-shapes and --weights values (fail() on unknown ones), shared by bench --serve.
ModelConfig shape_config(const std::string& name);
GpuModel::RandomKind random_kind(const std::string& name);
// Prefill tokens/s of one forward of `prefill` tokens (batch 1, best of 3 after a warm-up run).
double time_prefill(GpuModel& m, int bits, int prefill);
// Greedy decode tokens/s (steps x batch / time) of `decode` CUDA-graph steps after a `prompt`-token prompt in each
// of `batch` sequences; *kv_bytes receives the KV cache's size.
double time_decode(GpuModel& m, int bits, int prompt, int decode, int batch, double* kv_bytes);
// The cost of switching any-precision width between decode steps (batch 1, CUDA-graph steps on one cache of a
// `prompt`-token context): each width's first step on the cache (run uncaptured, then captured), and the mean step
// time with the widths decoded in blocks of steps_per_width against changing width every step.
struct WidthSwitchTiming {
  std::vector<double> first_use_ms;   // per width, in the order given
  double blocked_us = 0, alternating_us = 0;
  int captures_alternating = 0;       // graphs captured during the alternating pass (0: every switch replayed)
};
WidthSwitchTiming time_width_switch(GpuModel& m, const std::vector<int>& widths, int prompt, int steps_per_width);
// Device-to-device copy bandwidth, bytes read + written per second (1 GiB, median of 20).
double device_copy_bandwidth();

}  // namespace lowbit::cuda
