#include "leader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

namespace jumbo::serve {

void log_line(const std::string& line, std::FILE* to) {
  std::fwrite(line.data(), 1, line.size(), to);  // errors ignored: see leader.h
  std::fflush(to);
}

void JobQueue::cancel(Job& job) {
  {
    std::lock_guard lock(job.mu);  // a waiter checking done() does not miss it
    job.cancelled = true;
  }
  job.changed.notify_all();
  wake.notify_one();
}

Leader::Leader(GenerationEngine& engine, int32_t eos_id, JobQueue& queue, ServeMetrics& metrics,
               std::function<bool()> stop_requested, std::function<void()> stop_listening)
    : scheduler_(engine, eos_id),
      slots_(engine.shape().cache_slots),
      cache_positions_(engine.shape().cache_slots * engine.shape().cache_positions),
      queue_(queue),
      metrics_(metrics),
      stop_requested_(std::move(stop_requested)),
      stop_listening_(std::move(stop_listening)) {}

void Leader::run() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> starting;
    bool stop_now = false;
    {
      std::unique_lock lock(queue_.mu);
      if (scheduler_.idle() && queue_.jobs.empty()) {
        if (queue_.closing) break;
        // Timed: the stop signal is polled, not notified.
        queue_.wake.wait_for(lock, std::chrono::milliseconds(100));
      }
      if (!queue_.closing && stop_requested_ && stop_requested_()) {
        queue_.closing = stop_now = true;
      }
      // The scheduler gets only what it can start soon: the queue is the wait line.
      int64_t taken = scheduler_.running() + scheduler_.waiting();
      while (!queue_.jobs.empty() && taken < slots_) {
        taken += queue_.jobs.front()->request.sequences();
        starting.push_back(std::move(queue_.jobs.front()));
        queue_.jobs.pop_front();
      }
      set_free_slots(taken);
    }
    if (stop_now) {
      log_line("jumbo serve: stopping: no new requests, finishing those accepted\n");
      stop_listening_();
    }
    for (auto& job : starting) start(job);
    sweep_cancelled();
    if (!scheduler_.idle()) scheduler_.step();
    queue_.running = scheduler_.running();
    queue_.waiting = scheduler_.waiting();
    publish_gauges();
    std::lock_guard lock(queue_.mu);
    set_free_slots(scheduler_.running() + scheduler_.waiting());
  }
  publish_gauges();
}

void Leader::set_free_slots(int64_t taken) {
  queue_.free_slots = static_cast<size_t>(std::max<int64_t>(0, slots_ - taken));
}

void Leader::publish_gauges() {
  EngineGauges g;
  {
    std::lock_guard lock(queue_.mu);
    g.queued = static_cast<int64_t>(queue_.jobs.size());
  }
  g.running = scheduler_.running();
  g.waiting = scheduler_.waiting();
  g.slots = slots_;
  g.cached_positions = scheduler_.cached_positions();
  g.cache_positions = cache_positions_;
  metrics_.set_engine(g);
}

void Leader::start(const std::shared_ptr<Job>& job) {
  if (job->cancelled) {
    ++queue_.cancelled;
    return;
  }
  metrics_.count_tokens(job->request.prompt_tokens(), 0);
  job->last_token.assign(static_cast<size_t>(job->request.sequences()), job->arrived);
  for (int64_t c = 0; c < job->request.sequences(); ++c) {
    job->sequences.push_back(scheduler_.submit(
        generation_request(job->request, c), [this, job, c](const TokenEvent& e) {
          return on_token(*job, static_cast<size_t>(c), e);
        }));
  }
  active_.push_back(job);
}

bool Leader::on_token(Job& job, size_t c, const TokenEvent& e) {
  if (job.cancelled) return false;
  if (!e.prompt && !e.eos) {
    const Clock::time_point now = Clock::now();
    const double gap = std::chrono::duration<double>(now - job.last_token[c]).count();
    (job.last_token[c] == job.arrived ? metrics_.time_to_first_token : metrics_.inter_token_latency)
        .observe(gap);
    job.last_token[c] = now;
    metrics_.count_tokens(0, 1);
  }
  bool go_on = false;
  bool job_done = false;
  {
    std::lock_guard lock(job.mu);
    ChoiceState& choice = job.choices[c];
    go_on = choice.add(e);
    if (choice.finished()) ++job.finished;  // the sink is not called after it
    ++job.version;
    job_done = job.finished == job.choices.size();
  }
  if (job_done) {
    ++queue_.completed;
    metrics_.request_duration.observe(
        std::chrono::duration<double>(Clock::now() - job.arrived).count());
  }
  job.changed.notify_all();
  return go_on;
}

void Leader::sweep_cancelled() {
  std::erase_if(active_, [this](const std::shared_ptr<Job>& job) {
    std::lock_guard lock(job->mu);
    const bool finished = job->finished == job->choices.size();
    if (job->cancelled && !finished) {
      for (int64_t id : job->sequences) scheduler_.cancel(id);
      ++queue_.cancelled;
    }
    return job->cancelled || finished;
  });
}

}  // namespace jumbo::serve
