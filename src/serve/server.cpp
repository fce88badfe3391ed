// The HTTP side and the leader loop of `jumbo serve`. Handler threads (httplib's pool) parse
// a request, push a Job into the bounded queue and wait on the job; the main thread alone
// moves jobs into the Scheduler and steps it, so every engine collective stays on one
// thread. Sinks (main thread) write token events into the job under its mutex and wake its
// handler; a handler whose client went away marks the job cancelled for the main thread.
#include "jumbo/serve/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "jumbo/config/config.h"
#include "jumbo/infer/scheduler.h"
#include "openai.h"

namespace jumbo {
namespace {

using serve::json;

// One /v1/completions request from acceptance to its last token.
struct Job {
  serve::CompletionRequest request;
  serve::ResponseHead head;
  std::mutex mu;
  std::condition_variable changed;         // a choice got a token, or the job ended
  std::vector<serve::ChoiceState> choices;  // under mu
  size_t finished = 0;                      // choices finished, under mu
  uint64_t version = 0;                     // bumped on every change, under mu
  std::atomic<bool> cancelled{false};       // the client went away
  std::vector<int64_t> sequences;           // scheduler ids (main thread only)

  bool done() const { return cancelled || finished == choices.size(); }
};

// The handoff between handler threads and the main thread, and what /health reports.
struct JobQueue {
  std::mutex mu;
  std::condition_variable wake;  // the main thread: a job arrived, one was cancelled
  std::deque<std::shared_ptr<Job>> jobs;
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

  void cancel(Job& job) {
    {
      std::lock_guard lock(job.mu);  // a waiter checking done() does not miss it
      job.cancelled = true;
    }
    job.changed.notify_all();
    wake.notify_one();
  }
};

// The main thread's loop: queue -> scheduler -> engine steps, until a stop and then drained.
class Leader {
 public:
  Leader(GenerationEngine& engine, const Tokenizer& tokenizer, JobQueue& queue,
         std::function<bool()> stop_requested, std::function<void()> stop_listening)
      : scheduler_(engine, tokenizer.eos_id()),
        slots_(engine.shape().cache_slots),
        queue_(queue),
        stop_requested_(std::move(stop_requested)),
        stop_listening_(std::move(stop_listening)) {}

  void run() {
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
          taken += queue_.jobs.front()->request.choices();
          starting.push_back(std::move(queue_.jobs.front()));
          queue_.jobs.pop_front();
        }
        set_free_slots(taken);
      }
      if (stop_now) {
        fmt::print(stderr, "jumbo serve: stopping: no new requests, finishing those accepted\n");
        stop_listening_();
      }
      for (auto& job : starting) start(job);
      sweep_cancelled();
      if (!scheduler_.idle()) scheduler_.step();
      queue_.running = scheduler_.running();
      queue_.waiting = scheduler_.waiting();
      std::lock_guard lock(queue_.mu);
      set_free_slots(scheduler_.running() + scheduler_.waiting());
    }
  }

 private:
  // Under queue_.mu: `taken` sequences hold or will hold a slot.
  void set_free_slots(int64_t taken) {
    queue_.free_slots = static_cast<size_t>(std::max<int64_t>(0, slots_ - taken));
  }
  void start(const std::shared_ptr<Job>& job) {
    if (job->cancelled) {
      ++queue_.cancelled;
      return;
    }
    for (int64_t c = 0; c < job->request.choices(); ++c) {
      job->sequences.push_back(scheduler_.submit(
          serve::generation_request(job->request, c), [this, job, c](const TokenEvent& e) {
            if (job->cancelled) return false;
            bool go_on = false;
            {
              std::lock_guard lock(job->mu);
              serve::ChoiceState& choice = job->choices[static_cast<size_t>(c)];
              go_on = choice.add(e);
              if (choice.finished()) ++job->finished;
              ++job->version;
              if (job->finished == job->choices.size()) ++queue_.completed;
            }
            job->changed.notify_all();
            return go_on;
          }));
    }
    active_.push_back(job);
  }

  // Frees the slots of jobs whose client went away; forgets finished jobs.
  void sweep_cancelled() {
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

  Scheduler scheduler_;
  int64_t slots_;
  JobQueue& queue_;
  std::function<bool()> stop_requested_;
  std::function<void()> stop_listening_;
  std::vector<std::shared_ptr<Job>> active_;
};

// httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when the
// library was built): a burst of clients overflows it and Linux resets the extra
// connections. listen() again on the bound socket sets a larger backlog.
class HttpServer : public httplib::Server {
 public:
  bool widen_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

void send_error(httplib::Response& res, const serve::ApiError& e) {
  res.status = e.status;
  res.set_content(serve::dump(serve::error_json(e)), "application/json");
}

// Writes the job's chunks as they arrive, in one call of the content provider: httplib stops
// calling a provider once the server stops listening, and a stream accepted before a stop
// must still end with [DONE]. A failed write (the client went away) cancels the job.
bool write_stream(Job& job, JobQueue& queue, httplib::DataSink& sink) {
  uint64_t seen = 0;
  for (;;) {
    std::string out;
    bool done = false;
    {
      std::unique_lock lock(job.mu);
      const bool news = job.changed.wait_for(lock, std::chrono::seconds(2), [&] {
        return job.version != seen || job.done();
      });
      seen = job.version;
      for (size_t c = 0; c < job.choices.size(); ++c) {
        const json chunk = job.choices[c].take_chunk(static_cast<int64_t>(c));
        if (!chunk.is_null()) out += serve::stream_event(job.head, chunk);
      }
      done = job.done();
      // An SSE comment while nothing happens: a client that left is found by the write.
      if (!news && out.empty()) out = ": waiting\n\n";
    }
    if (done) out += "data: [DONE]\n\n";
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      queue.cancel(job);
      return false;
    }
    if (done) {
      sink.done();
      return true;
    }
  }
}

}  // namespace

int serve_completions(GenerationEngine& engine, const Tokenizer& tokenizer,
                      const ServeOptions& opts) {
  auto refuse = [&](const std::string& message) {
    engine.stop_followers();
    return UserError("jumbo serve: " + message);
  };
  if (opts.max_queue < 1 || opts.max_queue > 4096) {
    throw refuse(fmt::format("--max-queue {}: expected 1 .. 4096", opts.max_queue));
  }
  if (opts.port < 0 || opts.port > 65535) {
    throw refuse(fmt::format("--port {}: expected 0 .. 65535 (0 = any free port)", opts.port));
  }
  const serve::ServedModel model{opts.model_name, engine.shape(), engine.model().vocab};
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  JobQueue queue;
  queue.max_jobs = static_cast<size_t>(opts.max_queue);
  queue.free_slots = static_cast<size_t>(engine.shape().cache_slots);
  std::atomic<int64_t> next_id{0};
  std::atomic<uint64_t> next_seed{0};

  HttpServer http;
  // Every request waiting to start, every running one, and a few for /health and /v1/models
  // have a thread, so a full queue is answered (429) rather than left in the pool's backlog.
  const size_t threads = queue.max_jobs + static_cast<size_t>(engine.shape().cache_slots) + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_keep_alive_timeout(2);
  http.set_payload_max_length(size_t{16} << 20);

  http.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    auto job = std::make_shared<Job>();
    try {
      job->request = serve::parse_completion_request(req.body, model, tokenizer);
    } catch (const serve::ApiError& e) {
      return send_error(res, e);
    }
    if (!job->request.seeded) job->request.sampling.seed = next_seed++;
    job->head = {fmt::format("cmpl-{}", next_id++), static_cast<int64_t>(std::time(nullptr)),
                 model.name};
    for (int64_t c = 0; c < job->request.choices(); ++c) {
      job->choices.emplace_back(tokenizer, job->request.stop, job->request.logprobs);
    }
    {
      std::lock_guard lock(queue.mu);
      if (queue.closing) {
        return send_error(res, serve::ApiError(503, "", "the server is stopping", "server_error"));
      }
      if (queue.full()) {
        return send_error(res, serve::ApiError(429, "", fmt::format(
            "the queue is full ({} requests waiting, --max-queue); retry later", queue.max_jobs),
            "server_error"));
      }
      queue.jobs.push_back(job);
    }
    queue.wake.notify_one();
    if (job->request.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [job, &queue](size_t, httplib::DataSink& sink) { return write_stream(*job, queue, sink); },
          [job, &queue](bool success) {
            if (!success) queue.cancel(*job);
          });
      return;
    }
    std::unique_lock lock(job->mu);
    job->changed.wait(lock, [&] { return job->done(); });
    res.set_content(serve::dump(serve::completion_response(job->head, job->choices, job->request)),
                    "application/json");
  });

  http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    const json models = {
        {"object", "list"},
        {"data", json::array({{{"id", model.name},
                               {"object", "model"},
                               {"created", created},
                               {"owned_by", "jumbo"}}})}};
    res.set_content(serve::dump(models), "application/json");
  });

  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    json health;
    {
      std::lock_guard lock(queue.mu);
      health = {{"status", queue.closing ? "stopping" : "ok"},
                {"model", model.name},
                {"queued", queue.jobs.size()}};
    }
    health["running"] = queue.running.load();
    health["waiting"] = queue.waiting.load();
    health["completed"] = queue.completed.load();
    health["cancelled"] = queue.cancelled.load();
    res.set_content(serve::dump(health), "application/json");
  });

  // Unknown routes and methods get a JSON error too (ours already have a body).
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    send_error(res, serve::ApiError(res.status, "", fmt::format(
        "no route {} {} (jumbo serves POST /v1/completions, GET /v1/models, GET /health)",
        req.method, req.path)));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    fmt::print(stderr, "jumbo serve: internal error in a request: {}\n", what);
    send_error(res, serve::ApiError(500, "", "internal error: " + what, "server_error"));
  });

  const int port = opts.port == 0 ? http.bind_to_any_port(opts.host)
                   : http.bind_to_port(opts.host, opts.port) ? opts.port
                                                             : -1;
  if (port < 0 || !http.widen_backlog(1024)) {
    throw refuse(fmt::format("--host {} --port {}: cannot listen there (in use, or not an "
                             "address of this machine)", opts.host, opts.port));
  }
  fmt::print("jumbo serve: model {}, context {} tokens, {} sequences at once\n", model.name,
             model.shape.cache_positions, model.shape.cache_slots);
  fmt::print("listening on http://{}:{}\n", opts.host, port);
  std::fflush(stdout);
  std::atomic<bool> listener_returned{false};
  std::thread listener([&] {
    http.listen_after_bind();
    listener_returned = true;
  });
  // stop() does nothing before the listener runs: a stop signal at once must not be lost.
  while (!http.is_running() && !listener_returned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (listener_returned) {
    listener.join();
    throw refuse(fmt::format("--host {} --port {}: cannot listen there", opts.host, port));
  }
  try {
    Leader(engine, tokenizer, queue, opts.stop_requested, [&http] { http.stop(); }).run();
  } catch (...) {
    // The engine failed: handlers may wait on jobs that will never end, so the listener
    // is not joined; the process is ending (main aborts the other ranks).
    http.stop();
    listener.detach();
    throw;
  }
  // Nothing is queued or running: the handler threads have what they wait for.
  listener.join();
  engine.stop_followers();
  fmt::print("jumbo serve: stopped after {} requests ({} cancelled)\n", queue.completed.load(),
             queue.cancelled.load());
  return 0;
}

}  // namespace jumbo
