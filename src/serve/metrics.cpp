#include "serve/metrics.h"

#include <cstdio>

namespace lowbit::serve {

namespace {
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
// One unlabelled series with its HELP and TYPE lines.
void series(std::string& out, const char* name, const char* type, const char* help, int64_t value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         std::to_string(value) + "\n";
}
}  // namespace

Metrics::Histogram Metrics::make(std::vector<double> bounds) {
  Histogram h;
  h.counts.assign(bounds.size() + 1, 0);
  h.bounds = std::move(bounds);
  return h;
}

void Metrics::Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

void Metrics::Histogram::render(std::string& out, const char* name, const char* help) const {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    out += std::string(name) + "_bucket{le=\"" + num(bounds[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(count) + "\n";
  out += std::string(name) + "_sum " + num(sum) + "\n";
  out += std::string(name) + "_count " + std::to_string(count) + "\n";
}

void Metrics::count_response(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[status];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::set_queue_length(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_length_ = n;
}

void Metrics::set_running(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = n;
}

void Metrics::set_batch(int64_t decode_rows, int64_t decode_forwards) {
  std::lock_guard<std::mutex> lock(mu_);
  batch_rows_ = decode_rows;
  batch_forwards_ = decode_forwards;
  if (decode_rows > 0) {
    ++decode_steps_;
    decode_rows_total_ += decode_rows;
  }
}

void Metrics::add_speculative(int64_t drafted, int64_t accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  spec_drafted_ += drafted;
  spec_accepted_ += accepted;
}

void Metrics::count_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[reason];
}

void Metrics::set_kv_used(int64_t positions, int64_t blocks, int64_t preemptions) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_used_ = positions;
  kv_blocks_used_ = blocks;
  preemptions_ = preemptions;
}

void Metrics::set_kv_capacity(int64_t positions, int64_t blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_capacity_ = positions;
  kv_blocks_total_ = blocks;
}

void Metrics::observe_time_to_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::observe_inter_token_latency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out += "# HELP lowbit_http_responses_total HTTP responses sent, by status code.\n";
  out += "# TYPE lowbit_http_responses_total counter\n";
  for (const auto& [status, n] : responses_)
    out += "lowbit_http_responses_total{code=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
  series(out, "lowbit_prompt_tokens_total", "counter", "Prompt tokens of finished generations.", prompt_tokens_);
  series(out, "lowbit_generated_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  series(out, "lowbit_queue_length", "gauge", "Requests waiting for the generation worker.", queue_length_);
  series(out, "lowbit_running_requests", "gauge", "Requests being generated.", running_);
  series(out, "lowbit_batch_size", "gauge", "Requests in the last decode step (the running batch).", batch_rows_);
  series(out, "lowbit_batch_forwards", "gauge", "Forwards the last decode step took (one per width present).",
         batch_forwards_);
  series(out, "lowbit_decode_steps_total", "counter", "Decode steps run (each advances every running request).",
         decode_steps_);
  series(out, "lowbit_decode_rows_total", "counter", "Requests advanced by decode steps, summed over the steps.",
         decode_rows_total_);
  series(out, "lowbit_speculative_drafted_tokens_total", "counter", "Draft tokens proposed (speculative decoding).",
         spec_drafted_);
  series(out, "lowbit_speculative_accepted_tokens_total", "counter", "Draft tokens the target kept.", spec_accepted_);
  out += "# HELP lowbit_requests_finished_total Generations ended, by reason.\n";
  out += "# TYPE lowbit_requests_finished_total counter\n";
  for (const auto& [reason, n] : finished_)
    out += "lowbit_requests_finished_total{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  series(out, "lowbit_kv_cache_used_positions", "gauge", "KV cache positions the running requests have filled.", kv_used_);
  series(out, "lowbit_kv_cache_capacity_positions", "gauge", "KV cache positions in the paged cache's blocks.", kv_capacity_);
  series(out, "lowbit_kv_cache_used_blocks", "gauge", "KV cache blocks the running requests hold.", kv_blocks_used_);
  series(out, "lowbit_kv_cache_blocks", "gauge", "KV cache blocks in all.", kv_blocks_total_);
  series(out, "lowbit_kv_cache_preemptions_total", "counter",
         "Running requests preempted for KV blocks (resumed later, their output unchanged).", preemptions_);
  ttft_.render(out, "lowbit_time_to_first_token_seconds", "From the request's arrival to its first generated token.");
  itl_.render(out, "lowbit_inter_token_latency_seconds", "Between consecutive generated tokens of one request.");
  return out;
}

}  // namespace lowbit::serve
