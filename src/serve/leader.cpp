#include "leader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "jumbo/config/config.h"

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

void AdapterLoad::answer(int status_code, std::string message, AdapterEntry loaded) {
  {
    std::lock_guard lock(mu);
    status = status_code;
    error = std::move(message);
    entry = std::move(loaded);
    answered = true;
  }
  changed.notify_all();
}

Leader::Leader(GenerationEngine& engine, int32_t eos_id, JobQueue& queue, ServeMetrics& metrics,
               AdapterTable& adapters, std::function<bool()> stop_requested,
               std::function<void()> stop_listening)
    : engine_(engine),
      adapters_(adapters),
      scheduler_(engine, eos_id),
      slots_(engine.shape().cache_slots),
      cache_positions_(engine.shape().cache_slots * engine.shape().cache_positions),
      queue_(queue),
      metrics_(metrics),
      stop_requested_(std::move(stop_requested)),
      stop_listening_(std::move(stop_listening)) {}

void Leader::run() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> starting;
    std::deque<std::shared_ptr<AdapterLoad>> loads;
    bool stop_now = false;
    {
      std::unique_lock lock(queue_.mu);
      if (scheduler_.idle() && queue_.jobs.empty() && queue_.adapter_loads.empty()) {
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
      loads.swap(queue_.adapter_loads);
    }
    free_removed_adapters();  // first: a slot freed now may take a load asked for now
    for (auto& load : loads) load_adapter(*load);
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
  std::deque<std::shared_ptr<AdapterLoad>> late;  // asked for as the server stopped
  {
    std::lock_guard lock(queue_.mu);
    late.swap(queue_.adapter_loads);
  }
  for (auto& load : late) load->answer(503, "the server is stopping");
  publish_gauges();
}

void Leader::load_adapter(AdapterLoad& load) {
  if (queue_.closing) return load.answer(503, "the server is stopping");
  if (adapters_.has_name(load.name)) {
    return load.answer(409, fmt::format("an adapter named \"{}\" is served (or being removed): "
                                        "DELETE it first, or choose another name", load.name));
  }
  const int32_t slot = adapters_.free_slot();
  if (slot < 0) {
    return load.answer(409, fmt::format("every adapter slot is taken (--max-adapters {}): DELETE "
                                        "/v1/adapters/NAME frees one once its requests finish",
                                        adapters_.slots()));
  }
  try {
    AdapterEntry e{load.name, load.path, slot, engine_.load_adapter(slot, load.path),
                   static_cast<int64_t>(std::time(nullptr))};
    adapters_.add(e);
    log_line(fmt::format("jumbo serve: adapter {} loaded from {} (slot {}, LoRA rank {})\n",
                         e.name, e.path, slot, e.lora.rank));
    load.answer(200, "", std::move(e));
  } catch (const UserError& err) {
    log_line(fmt::format("jumbo serve: adapter {} not loaded: {}\n", load.name, err.what()));
    load.answer(400, err.what());
  }
}

void Leader::free_removed_adapters() {
  for (int32_t slot : adapters_.removable()) {
    if (scheduler_.uses_adapter(slot)) continue;  // a cancelled request's sequence, this step
    engine_.remove_adapter(slot);
    adapters_.forget(slot);
    log_line(fmt::format("jumbo serve: adapter slot {} freed\n", slot));
  }
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
  g.adapters = static_cast<int64_t>(adapters_.served().size());
  g.adapter_slots = adapters_.slots();
  g.mixed_adapter_steps = scheduler_.mixed_steps();
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
