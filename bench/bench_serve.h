// `lowbit bench --serve`: the serving engine under load on a model shape that is not on disk (random weights
// generated on the device). The continuous batch `lowbit serve` runs (runtime/batch.h, on the CUDA backend) is driven
// in process by closed-loop clients: at concurrency C, C requests are in flight and each one that ends is replaced
// by the next, until 2C (at least 4) have run. Prompts are random token ids of uniformly drawn lengths, every
// request generates exactly new_tokens tokens (EOS off), greedy. HTTP is not in the loop (its cost per token is a few
// microseconds of JSON beside milliseconds of decode step).
//
// Reported per weights / width / concurrency: output tokens/s over the run (prefill included), decode-step tokens/s
// (rows per second of decode steps alone), time to first token and inter-token latency p50 / p99, mean decode rows per
// step; and, timed in the same run on the same weights, bench --e2e's greedy decode at batch 8 from a prompt of the
// mean prompt length: the reference of the "concurrency 8 ≥ 85%" goal. Also the paged KV cache's pool, the most blocks
// the requests held at once, and the preemptions when the pool ran out.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace lowbit::cuda {

struct ServeBenchOptions {
  std::vector<std::string> shapes = {"llama2-7b"};
  std::vector<std::string> kinds = {"fp16", "anyprec"};
  std::vector<int> bits = {3, 4, 8};          // any-precision: each width alone, then all of them mixed
  std::vector<int> concurrency = {1, 8, 32, 64};
  int prompt_min = 128, prompt_max = 1024, new_tokens = 256;
  int prefill_chunk = 512;
  // The paged KV cache's size (0: every request's whole context, prompt_max + new_tokens + 1 positions, for every
  // request in flight: what a cache without paging reserves).
  uint64_t kv_cache_bytes = 0;
};

void run_serve_bench(const ServeBenchOptions& o, std::ostream& out);

}  // namespace lowbit::cuda
