// Prometheus text-format metrics of `lowbit serve`: plain counters, gauges and fixed-bucket histograms behind one
// mutex (a few updates per generated token, far below the cost of the token itself).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace lowbit::serve {

class Metrics {
 public:
  void count_response(int status);
  void add_tokens(int64_t prompt, int64_t generated);
  void set_queue_length(int64_t n);
  void set_running(int64_t n);
  void set_batch(int64_t decode_rows, int64_t decode_forwards);   // the last round's (also summed into totals)
  void count_finished(const std::string& reason);                  // a generation ended: eos, length, stop, ...
  void add_speculative(int64_t drafted, int64_t accepted);         // a speculative generation's draft tokens
  // The paged KV cache: positions filled, blocks held, generations preempted so far (set each round), and its size.
  void set_kv_used(int64_t positions, int64_t blocks, int64_t preemptions);
  void set_kv_capacity(int64_t positions, int64_t blocks);
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  std::string render() const;   // the /metrics body (text/plain; version=0.0.4)

 private:
  struct Histogram {
    std::vector<double> bounds;           // upper bounds of the buckets, ascending; +Inf implied
    std::vector<uint64_t> counts;         // [bounds.size() + 1], not cumulative
    double sum = 0;
    uint64_t count = 0;
    void observe(double v);
    void render(std::string& out, const char* name, const char* help) const;
  };
  static Histogram make(std::vector<double> bounds);

  mutable std::mutex mu_;
  std::map<int, uint64_t> responses_;     // HTTP status -> responses
  std::map<std::string, uint64_t> finished_;   // stop reason -> generations
  int64_t decode_steps_ = 0, decode_rows_total_ = 0, spec_drafted_ = 0, spec_accepted_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  int64_t queue_length_ = 0, running_ = 0, batch_rows_ = 0, batch_forwards_ = 0, kv_used_ = 0, kv_capacity_ = 0;
  int64_t kv_blocks_used_ = 0, kv_blocks_total_ = 0, preemptions_ = 0;
  // Buckets from 1 ms (a tiny model's token on the CPU) to a minute (a long prompt on a big model on the CPU).
  Histogram ttft_ = make({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  Histogram itl_ = make({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
};

}  // namespace lowbit::serve
