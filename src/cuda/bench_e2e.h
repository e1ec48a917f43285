// `lowbit bench --e2e`: end-to-end speed of the GPU forward on model shapes that are not on disk (random weights
// generated on the device): prefill tokens/s, greedy decode tokens/s at batch 1 and 8 (CUDA-graph steps), and the
// bytes each configuration holds on the GPU, for fp16, any-precision widths and 2/4/16 mixed24a.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace lowbit::cuda {

struct E2EBenchOptions {
  std::vector<std::string> shapes = {"llama2-7b"};   // llama2-7b | llama3-8b | llama2-70b
  std::vector<std::string> kinds = {"fp16", "anyprec", "mixed24a"};
  std::vector<int> bits = {3, 4, 8};                  // any-precision widths
  int prefill = 512, prompt = 128, decode = 256;
  std::vector<int> batches = {1, 8};
};

void run_e2e_bench(const E2EBenchOptions& o, std::ostream& out);

}  // namespace lowbit::cuda
