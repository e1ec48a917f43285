#include "bench/bench_serve.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>

#include "backend_cuda/model/cuda_backend.h"
#include "bench/bench_e2e.h"
#include "backend_cuda/common/common.h"
#include "core/error.h"
#include "runtime/batch.h"

namespace lowbit::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

double gpu_used_mib() {
  size_t free_b = 0, total_b = 0;
  LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<double>(total_b - free_b) / (1 << 20);
}

struct LoadResult {
  double mem_warm_mib = 0, mem_end_mib = 0;   // GPU memory in use after the warm-up and after the run
  int requests = 0;
  int64_t tokens = 0;
  double wall_s = 0, decode_rows = 0, decode_s = 0, steps = 0;
  std::vector<double> ttft, itl;
  int kv_blocks = 0, kv_peak_blocks = 0;
  int64_t preemptions = 0;
  uint64_t kv_bytes = 0;
};

// Closed-loop load: `concurrency` requests in flight, 2x concurrency (at least 4) in all; request i runs at
// widths[i % widths.size()].
LoadResult run_load(Backend& b, const ServeBenchOptions& o, int concurrency, const std::vector<int>& widths, uint64_t seed) {
  BatchOptions bo;
  bo.max_seqs = concurrency;
  bo.capacity = o.prompt_max + o.new_tokens + 1;
  bo.prefill_chunk = o.prefill_chunk;
  if (o.kv_cache_bytes > 0) {
    const uint64_t block_bytes = b.kv_bytes_per_position() * kKvBlock;
    bo.kv_blocks = static_cast<int>(std::min<uint64_t>(o.kv_cache_bytes / block_bytes,
                                                       static_cast<uint64_t>(full_kv_blocks(concurrency, bo.capacity))));
  }
  BatchGenerator gen(b, bo);
  const int V = b.config().vocab_size;
  std::mt19937_64 rng(seed);
  auto prompt = [&](int len) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    return p;
  };
  // Warm-up: a prompt of a whole prefill chunk first (it sizes the model's workspace; growing it later would drop
  // every captured graph mid-run), then the decode graphs of every bucket this concurrency visits, at every width
  // (requests of staggered lengths, so the batch shrinks one row at a time).
  // A mix of widths warms its mixed-width steps too (w = -1: request i at widths[i % size]).
  std::vector<int> warm = widths;
  if (widths.size() > 1) warm.push_back(-1);
  for (int w : warm) {
    for (int i = 0; i < concurrency; ++i) {
      GenerateOptions g;
      g.stop_at_eos = false;
      g.max_new_tokens = 2 + i;
      g.bits = w >= 0 ? w : widths[static_cast<size_t>(i) % widths.size()];
      gen.add(prompt(i == 0 ? std::min(o.prefill_chunk, o.prompt_max) : 16), g);
    }
    while (gen.active() > 0) gen.step();
  }
  struct Live {
    Clock::time_point added, last;
    bool first = true;
  };
  LoadResult r;
  r.mem_warm_mib = gpu_used_mib();
  const int total = std::max(4, 2 * concurrency);
  std::uniform_int_distribution<int> len(o.prompt_min, o.prompt_max);
  int started = 0;
  const Clock::time_point t0 = Clock::now();
  while (started < total || gen.active() > 0) {
    while (started < total && gen.free_slots() > 0) {
      GenerateOptions g;
      g.stop_at_eos = false;
      g.max_new_tokens = o.new_tokens;
      g.bits = widths[static_cast<size_t>(started) % widths.size()];
      auto lv = std::make_shared<Live>();
      lv->added = lv->last = Clock::now();
      gen.add(prompt(len(rng)), g, nullptr, [&r, lv](int32_t, const TokenLogprob*) {
        const Clock::time_point now = Clock::now();
        (lv->first ? r.ttft : r.itl).push_back(seconds(lv->first ? lv->added : lv->last, now));
        lv->first = false;
        lv->last = now;
        ++r.tokens;
      });
      ++started;
    }
    gen.step();
    r.kv_peak_blocks = std::max(r.kv_peak_blocks, gen.kv_blocks_used());
    ++r.steps;
    r.decode_rows += gen.last_decode_rows();
    r.decode_s += gen.last_decode_seconds();
  }
  r.wall_s = seconds(t0, Clock::now());
  r.requests = total;
  r.mem_end_mib = gpu_used_mib();
  r.kv_blocks = gen.kv_blocks_total();
  r.kv_bytes = static_cast<uint64_t>(r.kv_blocks) * b.kv_bytes_per_position() * kKvBlock;
  r.preemptions = gen.preemptions();
  return r;
}

std::string widths_label(const std::vector<int>& w) {
  if (w.size() == 1) return w[0] == 0 ? "fp16" : std::to_string(w[0]) + "-bit";
  std::string s = "mix ";
  for (size_t i = 0; i < w.size(); ++i) s += (i ? "/" : "") + std::to_string(w[i]);
  return s;
}

}  // namespace

void run_serve_bench(const ServeBenchOptions& o, std::ostream& out) {
  LOWBIT_CHECK(o.prompt_min >= 1 && o.prompt_min <= o.prompt_max && o.new_tokens >= 3, "bench --serve: prompts of ",
               o.prompt_min, "..", o.prompt_max, " tokens, ", o.new_tokens, " new");
  char line[512];
  out << "device: " << device_name() << "\n";
  std::snprintf(line, sizeof line,
                "closed-loop clients, prompts of %d..%d random tokens, %d new tokens each (greedy, EOS off), prefill "
                "chunk %d; 2 x concurrency requests (at least 4) per row\n",
                o.prompt_min, o.prompt_max, o.new_tokens, o.prefill_chunk);
  out << line;
  out << "shape | weights | width | concurrency | requests | output tok/s | decode-step tok/s | mean decode rows | "
         "TTFT p50 / p99 ms | ITL p50 / p99 ms | e2e decode b8 tok/s (same weights, prompt of the mean length) | "
         "concurrency-8 decode-step / e2e b8 | GPU MiB in use after warm-up -> after the run | KV pool GB (blocks of 16) | "
         "peak blocks held | preemptions\n";
  out.flush();
  for (const std::string& shape : o.shapes) {
    const ModelConfig c = shape_config(shape);
    for (const std::string& kind : o.kinds) {
      const GpuModel::RandomKind rk = random_kind(kind);
      GpuModel m(c, rk, 1234);
      CudaBackend backend(m, nullptr, "random:" + shape, ModelFormat::Random);
      std::vector<std::vector<int>> configs;
      if (m.widths().empty()) {
        configs.push_back({0});
      } else {
        for (int w : o.bits) configs.push_back({w});
        if (o.bits.size() > 1) configs.push_back(o.bits);
      }
      for (const std::vector<int>& widths : configs)
      for (const bool mixed_step : widths.size() > 1 ? std::vector<bool>{false, true} : std::vector<bool>{mixed_step_enabled()}) {
        // A mix of widths runs twice: one forward per width, then (where served: up to 8 rows) one mixed-width forward.
        const bool mixed_was = mixed_step_enabled();
        set_mixed_step(mixed_step);
        double e2e_b8 = 0;
        if (widths.size() == 1) e2e_b8 = time_decode(m, widths[0], (o.prompt_min + o.prompt_max) / 2, 64, 8, nullptr);
        std::string label = widths_label(widths);
        if (widths.size() > 1) label += mixed_step ? " (mixed-width forward)" : " (a forward per width)";
        for (int conc : o.concurrency) {
          const LoadResult r = run_load(backend, o, conc, widths, 77 + static_cast<uint64_t>(conc));
          const double step_tps = r.decode_s > 0 ? r.decode_rows / r.decode_s : 0;
          char ratio[32] = "";
          if (conc == 8 && e2e_b8 > 0) std::snprintf(ratio, sizeof ratio, "%.2f", step_tps / e2e_b8);
          std::snprintf(line, sizeof line, "%s | %s | %s | %d | %d | %.1f | %.1f | %.1f | %.0f / %.0f | %.1f / %.1f | %s | %s | %.0f -> %.0f | %.2f (%d) | %d | %lld\n",
                        shape.c_str(), kind.c_str(), label.c_str(), conc, r.requests,
                        r.tokens / r.wall_s, step_tps, r.steps > 0 ? r.decode_rows / r.steps : 0.0,
                        1e3 * percentile(r.ttft, 0.5), 1e3 * percentile(r.ttft, 0.99), 1e3 * percentile(r.itl, 0.5),
                        1e3 * percentile(r.itl, 0.99), e2e_b8 > 0 ? std::to_string(static_cast<int>(e2e_b8 + 0.5)).c_str() : "-",
                        ratio[0] ? ratio : "-", r.mem_warm_mib, r.mem_end_mib, r.kv_bytes / 1e9, r.kv_blocks,
                        r.kv_peak_blocks, static_cast<long long>(r.preemptions));
          out << line;
          out.flush();
        }
        set_mixed_step(mixed_was);
      }
    }
  }
}

}  // namespace lowbit::cuda
