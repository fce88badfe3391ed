#pragma once
// The handoff between httplib's handler threads and rank 0's main thread, which alone drives
// the Scheduler (continuous batching) and so every engine collective. A handler parses a
// request into a Job and pushes it into the bounded JobQueue; the Leader moves jobs into the
// scheduler and steps it; its sinks write token events into the job under its mutex and
// wake the handler; a handler whose client went away marks the job cancelled.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "adapters.h"
#include "completions.h"
#include "jumbo/infer/engine.h"
#include "metrics.h"

namespace jumbo::serve {

using Clock = std::chrono::steady_clock;

// A line on stderr that never throws: fmt::print throws when the write fails (a closed pipe
// to a log collector), and the server must outlive its log.
void log_line(const std::string& line, std::FILE* to = stderr);

// One generation request from acceptance to its last token.
struct Job {
  CompletionRequest request;
  ResponseHead head;
  Clock::time_point arrived = Clock::now();
  std::mutex mu;
  std::condition_variable changed;     // a choice got a token, or the job ended
  std::vector<ChoiceState> choices;    // one per sequence (prompts x best_of), under mu
  size_t finished = 0;                 // choices finished, under mu
  uint64_t version = 0;                // bumped on every change, under mu
  std::atomic<bool> cancelled{false};  // the client went away
  // Main thread only: scheduler ids, and each sequence's last token time (latencies).
  std::vector<int64_t> sequences;
  std::vector<Clock::time_point> last_token;

  bool done() const { return cancelled || finished == choices.size(); }
};

// POST /v1/adapters: an adapter to load, and the leader's answer (status 200 with the entry,
// or an error status and message); the handler waits for `answered`.
struct AdapterLoad {
  std::string name, path;
  std::mutex mu;
  std::condition_variable changed;
  bool answered = false;  // under mu, as the rest of the answer
  int status = 200;
  std::string error;
  AdapterEntry entry;
  void answer(int status_code, std::string message, AdapterEntry loaded = {});
};

// What /health and /metrics report of the leader, and the wait line.
struct JobQueue {
  std::mutex mu;
  std::condition_variable wake;  // the main thread: a job arrived, one was cancelled
  std::deque<std::shared_ptr<Job>> jobs;
  std::deque<std::shared_ptr<AdapterLoad>> adapter_loads;  // loaded between engine steps
  size_t max_jobs = 64;
  // Slots the main thread will fill at its next step, as of its last look. A request that
  // arrives during a step and will take one of them is not waiting, so it does not count
  // against max_jobs (without this, a burst could be refused while slots were free).
  size_t free_slots = 0;
  bool closing = false;  // a stop was asked: new requests get 503

  // Under mu: requests that will wait for a slot are at most max_jobs.
  bool full() const { return jobs.size() >= max_jobs + free_slots; }
  // Written by the main thread after each step; read by /health.
  std::atomic<int64_t> running{0}, waiting{0}, completed{0}, cancelled{0};

  void cancel(Job& job);
};

// The main thread's loop: queue -> scheduler -> engine steps, until a stop and then drained.
class Leader {
 public:
  Leader(GenerationEngine& engine, int32_t eos_id, JobQueue& queue, ServeMetrics& metrics,
         AdapterTable& adapters, std::function<bool()> stop_requested,
         std::function<void()> stop_listening);
  void run();

 private:
  void set_free_slots(int64_t taken);  // under queue_.mu
  void start(const std::shared_ptr<Job>& job);
  bool on_token(Job& job, size_t choice, const TokenEvent& e);
  void sweep_cancelled();
  void publish_gauges();
  // Between steps: adapters asked for are loaded into free slots, and those marked for
  // removal that nothing uses any more are freed.
  void load_adapter(AdapterLoad& load);
  void free_removed_adapters();

  GenerationEngine& engine_;
  AdapterTable& adapters_;
  Scheduler scheduler_;
  int64_t slots_;
  int64_t cache_positions_;
  JobQueue& queue_;
  ServeMetrics& metrics_;
  std::function<bool()> stop_requested_;
  std::function<void()> stop_listening_;
  std::vector<std::shared_ptr<Job>> active_;
};

}  // namespace jumbo::serve
