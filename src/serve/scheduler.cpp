#include "serve/scheduler.h"

#include <algorithm>
#include <exception>
#include <new>

#include "lowbit/error.h"

namespace lowbit::serve {

namespace {
void finish(Job& job, ApiError error) {
  std::lock_guard<std::mutex> lock(job.mu);
  job.error = std::move(error);
  job.done = true;
  job.cv.notify_all();
}
}  // namespace

Scheduler::Scheduler(api::Model& model, int max_queue, int ctx_limit, Metrics& metrics)
    : model_(model), max_queue_(static_cast<size_t>(std::max(max_queue, 0))), ctx_limit_(ctx_limit),
      metrics_(metrics), thread_([this] { worker(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stopping_ = true;
    for (auto& j : queue_) j->cancel = true;
    if (running_) running_->cancel = true;
  }
  cv_.notify_all();
  thread_.join();
}

Scheduler::Admit Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) return Admit::ShuttingDown;
    if (queue_.size() >= max_queue_) return Admit::QueueFull;
    job->params.cancel = &job->cancel;
    queue_.push_back(job);
    metrics_.set_queue_length(static_cast<int64_t>(queue_.size()));
  }
  cv_.notify_all();
  return Admit::Ok;
}

void Scheduler::stop_accepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

bool Scheduler::drain(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  const bool idle = cv_.wait_until(lock, deadline, [this] { return queue_.empty() && !running_; });
  if (!idle) {
    for (auto& j : queue_) j->cancel = true;
    if (running_) running_->cancel = true;
  }
  return idle;
}

void Scheduler::worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;   // stopping, nothing left
      job = queue_.front();
      queue_.pop_front();
      running_ = job;
      metrics_.set_queue_length(static_cast<int64_t>(queue_.size()));
      metrics_.set_running(1);
    }
    run(*job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_.reset();
      metrics_.set_running(0);
    }
    cv_.notify_all();   // drain() may be waiting for idleness
  }
}

void Scheduler::render_chat(Job& job) const {
  if (model_.has_chat_template()) {
    // As Model::generate does for params.chat: the template's own control tokens are parsed, BOS is in the template.
    job.prompt_ids = model_.tokenize(model_.apply_chat_template(job.messages), /*add_bos=*/false, /*parse_special=*/true);
    job.use_ids = true;
    return;
  }
  std::string text;
  for (const api::ChatMessage& m : job.messages) {
    const char* role = m.role == "system" ? "System" : m.role == "user" ? "User" : "Assistant";
    text += std::string(role) + ": " + m.content + "\n";
  }
  job.prompt = text + "Assistant:";
  job.use_ids = false;
}

void Scheduler::run(Job& job) {
  if (job.cancel) {   // the client left while the job waited in the queue
    job.result.stop_reason = api::StopReason::Cancelled;
    finish(job, {});
    return;
  }
  try {
    if (job.chat) render_chat(job);
    // The prompt must leave room for at least one token. A text prompt is counted with BOS (at most one token more
    // than Model::generate runs), so the check never lets through a prompt that the model would refuse.
    const size_t prompt_tokens = job.use_ids ? job.prompt_ids.size() : model_.tokenize(job.prompt, true).size();
    if (prompt_tokens >= static_cast<size_t>(ctx_limit_)) {
      finish(job, {413,
                   "the prompt has " + std::to_string(prompt_tokens) + " tokens; the context holds " +
                       std::to_string(ctx_limit_) + " (prompt and completion together)",
                   "invalid_request_error", "prompt"});
      return;
    }
    api::GenerateParams p = job.params;
    p.ctx = static_cast<int>(std::min<int64_t>(ctx_limit_, static_cast<int64_t>(prompt_tokens) + p.max_tokens));
    {
      std::lock_guard<std::mutex> lock(job.mu);
      job.started = true;
      job.cv.notify_all();
    }
    auto last = job.arrived;
    bool first = true;
    auto on_piece = [&](std::string_view piece) {
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      if (first) metrics_.observe_time_to_first_token(dt);
      else metrics_.observe_inter_token_latency(dt);
      first = false;
      last = now;
      std::lock_guard<std::mutex> lock(job.mu);
      job.pending.append(piece.data(), piece.size());
      job.cv.notify_all();
    };
    api::GenerateResult r = job.use_ids ? model_.generate(job.prompt_ids, p, on_piece) : model_.generate(job.prompt, p, on_piece);
    metrics_.add_tokens(static_cast<int64_t>(r.prompt_ids.size()), static_cast<int64_t>(r.new_ids.size()));
    {
      std::lock_guard<std::mutex> lock(job.mu);
      job.result = std::move(r);
      job.done = true;
      job.cv.notify_all();
    }
  } catch (const lowbit::Error& e) {
    finish(job, {400, e.what(), "invalid_request_error", ""});
  } catch (const std::bad_alloc&) {
    finish(job, {500, "out of memory", "server_error", ""});
  } catch (const std::exception& e) {
    finish(job, {500, std::string("internal error: ") + e.what(), "server_error", ""});
  }
}

}  // namespace lowbit::serve
