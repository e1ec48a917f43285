#include "serve/scheduler.h"

#include <algorithm>
#include <exception>
#include <new>

#include "lowbit/error.h"

namespace lowbit::serve {

namespace {
void mark_done(Job& job) {
  std::lock_guard<std::mutex> lock(job.mu);
  job.done = true;
  job.cv.notify_all();
}

void finish(Job& job, ApiError error) {
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.error = std::move(error);
  }
  mark_done(job);
}
}  // namespace

Scheduler::Scheduler(api::Model& model, int max_queue, const api::BatchParams& batch, Metrics& metrics,
                     double request_timeout_s)
    : model_(model), max_queue_(static_cast<size_t>(std::max(max_queue, 0))), batch_params_(batch),
      request_timeout_s_(request_timeout_s), metrics_(metrics),
      batch_(model.new_batch(batch)), slots_(batch_->slots()) {
  metrics_.set_kv_capacity(batch_->kv_positions_total(), batch_->kv_blocks_total());
  thread_ = std::thread([this] { worker(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stopping_ = true;
    for (auto& j : queue_) j->cancel = true;
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
  const bool idle = cv_.wait_until(lock, deadline, [this] { return queue_.empty() && inflight_ == 0; });
  if (!idle) {
    // The running jobs' cancel flags are read by the batch before their next token.
    for (auto& j : queue_) j->cancel = true;
    cancel_running_ = true;   // the worker cancels what it runs at the top of its next round
  }
  return idle;
}

void Scheduler::worker() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> admit;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty() || !running_.empty(); });
      if (stopping_ || cancel_running_)   // the destructor or a drain past its time: cancel what runs
        for (auto& [id, j] : running_) j->cancel = true;
      if (stopping_) {   // the destructor: end what waits
        for (auto& j : queue_) admit.push_back(j);
        queue_.clear();
      } else {
        // In arrival order; a speculative request takes two slots (its draft's), so it may wait for a second one.
        for (int free = batch_->free_slots(); !queue_.empty();) {
          const int need = queue_.front()->params.draft_bits > 0 && slots_ >= 2 ? 2 : 1;
          if (free < need) break;
          admit.push_back(queue_.front());
          queue_.pop_front();
          free -= need;
        }
      }
      inflight_ += admit.size();
      metrics_.set_queue_length(static_cast<int64_t>(queue_.size()));
    }
    size_t refused = 0;
    for (const auto& job : admit)
      if (!start(job)) ++refused;
    std::vector<api::Batch::Finished> done;
    std::string failure;
    if (!running_.empty()) {
      try {
        done = batch_->step();
        metrics_.set_batch(batch_->last_decode_rows(), batch_->last_decode_forwards());
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    size_t ended = refused;
    // Handlers are told their job finished only after the gauges were published: a client that has its response
    // then reads running / KV figures that no longer count it.
    std::vector<std::shared_ptr<Job>> finished;
    for (api::Batch::Finished& f : done) {
      const auto it = running_.find(f.id);
      if (it == running_.end()) continue;
      Job& job = *it->second;
      metrics_.add_tokens(static_cast<int64_t>(f.result.prompt_ids.size()), static_cast<int64_t>(f.result.new_ids.size()));
      if (job.timed_out && f.result.stop_reason == api::StopReason::Cancelled) {
        f.result.stop_reason = api::StopReason::Length;   // cut by a limit, as max_tokens would
        metrics_.count_finished("timeout");
      } else {
        metrics_.count_finished(api::stop_reason_name(f.result.stop_reason));
      }
      metrics_.add_speculative(f.result.drafted_tokens, f.result.accepted_tokens);
      {
        std::lock_guard<std::mutex> lock(job.mu);
        job.result = std::move(f.result);
      }
      finished.push_back(it->second);
      running_.erase(it);
      ++ended;
    }
    if (request_timeout_s_ > 0) {   // the time limit: ended before their next token, like a cancellation
      const auto now = std::chrono::steady_clock::now();
      for (auto& [id, job] : running_)
        if (!job->cancel && std::chrono::duration<double>(now - job->arrived).count() > request_timeout_s_) {
          job->timed_out = true;
          job->cancel = true;
        }
    }
    if (!failure.empty()) {
      // A failed round leaves the batch's sequences in an unknown state: every running job fails, the batch is
      // made anew.
      for (auto& [id, job] : running_) {
        std::lock_guard<std::mutex> lock(job->mu);
        job->error = {500, "generation failed: " + failure, "server_error", ""};
        finished.push_back(job);
      }
      ended += running_.size();
      running_.clear();
      batch_ = model_.new_batch(batch_params_);
    }
    bool exiting;
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_ -= ended;
      publish_state();
      exiting = stopping_ && queue_.empty() && running_.empty();
    }
    for (const auto& job : finished) mark_done(*job);
    cv_.notify_all();   // drain() may be waiting for idleness, the destructor for the end
    if (exiting) return;
  }
}

void Scheduler::publish_state() {
  metrics_.set_running(static_cast<int64_t>(running_.size()));
  metrics_.set_kv_used(batch_->kv_positions_used(), batch_->kv_blocks_used(), batch_->preemptions());
}

bool Scheduler::start(const std::shared_ptr<Job>& job_ptr) {
  Job& job = *job_ptr;
  if (job.cancel) {   // the client left while the job waited in the queue
    job.result.stop_reason = api::StopReason::Cancelled;
    finish(job, {});
    return false;
  }
  try {
    if (job.chat) render_chat(job);
    if (!job.use_ids) {
      job.prompt_ids = model_.prompt_ids(job.prompt, job.params);
      job.use_ids = true;
    }
    if (job.params.draft_bits > 0 && slots_ < 2) {
      finish(job, {400, "draft_bits: speculative decoding takes two batch slots; this server has " +
                            std::to_string(slots_) + " (--max-batch)", "invalid_request_error", "draft_bits"});
      return false;
    }
    const int ctx = batch_->ctx();
    if (job.prompt_ids.size() >= static_cast<size_t>(ctx)) {
      finish(job, {413,
                   "the prompt has " + std::to_string(job.prompt_ids.size()) + " tokens; the context holds " +
                       std::to_string(ctx) + " (prompt and completion together)",
                   "invalid_request_error", "prompt"});
      return false;
    }
    api::GenerateParams p = job.params;
    p.chat = false;
    p.system.clear();
    std::weak_ptr<Job> weak = job_ptr;
    auto on_piece = [this, weak](std::string_view piece) {
      const std::shared_ptr<Job> j = weak.lock();
      if (!j) return;
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - (j->got_piece ? j->last_piece : j->arrived)).count();
      if (!j->got_piece) metrics_.observe_time_to_first_token(dt);
      else metrics_.observe_inter_token_latency(dt);
      j->got_piece = true;
      j->last_piece = now;
      std::lock_guard<std::mutex> lock(j->mu);
      j->pending.append(piece.data(), piece.size());
      j->cv.notify_all();
    };
    std::function<void(const api::TokenLogprobs&)> on_logprobs;
    if (p.logprobs >= 0 && p.max_tokens > 0)
      on_logprobs = [weak](const api::TokenLogprobs& lp) {
        const std::shared_ptr<Job> j = weak.lock();
        if (!j) return;
        std::lock_guard<std::mutex> lock(j->mu);
        j->pending_logprobs.push_back(lp);
        j->cv.notify_all();
      };
    const uint64_t id = batch_->add(job.prompt_ids, p, on_piece, std::move(on_logprobs));
    running_[id] = job_ptr;
    std::lock_guard<std::mutex> lock(job.mu);
    job.started = true;
    job.cv.notify_all();
    return true;
  } catch (const lowbit::Error& e) {
    finish(job, {400, e.what(), "invalid_request_error", ""});
  } catch (const std::bad_alloc&) {
    finish(job, {500, "out of memory", "server_error", ""});
  } catch (const std::exception& e) {
    finish(job, {500, std::string("internal error: ") + e.what(), "server_error", ""});
  }
  return false;
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

}  // namespace lowbit::serve
