// `jumbo serve`: the options checked, the HTTP(S) listener (http_front.h installs its routes)
// on its own thread, and the leader's loop (leader.h) on this one until a stop.
#include "jumbo/serve/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <ctime>

#include "http_front.h"
#include "jumbo/config/config.h"
#include "leader.h"
#include "metrics.h"

namespace jumbo {
namespace {

using serve::JobQueue;

// httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when the
// library was built): a burst of clients overflows it and Linux resets the extra
// connections. listen() again on the bound socket sets a larger backlog.
template <class Base>
class Listener : public Base {
 public:
  using Base::Base;
  bool widen_backlog(int backlog) { return ::listen(this->svr_sock_, backlog) == 0; }
};

// The longest piece's bytes: a text longer than context x this cannot fit the context. A
// stored piece is never shorter than the bytes it decodes to ("▁" is 3 bytes for 1, a
// byte-level character 1 or 2); token_bytes too, so the bound holds for any tokenizer.
int64_t longest_piece_bytes(const Tokenizer& tokenizer) {
  size_t longest = 1;
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const auto i = static_cast<int32_t>(id);
    longest = std::max({longest, tokenizer.piece(i).size(), tokenizer.token_bytes(i).size()});
  }
  return static_cast<int64_t>(longest);
}

// The options' mistakes a flag check cannot see alone, as one line ("" when none).
std::string options_problem(const ServeOptions& opts) {
  if (opts.max_queue < 1 || opts.max_queue > 4096) {
    return fmt::format("--max-queue {}: expected 1 .. 4096", opts.max_queue);
  }
  if (opts.port < 0 || opts.port > 65535) {
    return fmt::format("--port {}: expected 0 .. 65535 (0 = any free port)", opts.port);
  }
  if (opts.tls_cert.empty() != opts.tls_key.empty()) {
    return "--tls-cert and --tls-key go together (HTTPS needs both)";
  }
  return "";
}

// An HTTP or (with --tls-cert) HTTPS server not yet bound, and how to widen its backlog once
// it is; no server when the certificate and key cannot be loaded.
struct ListeningServer {
  std::unique_ptr<httplib::Server> server;
  std::function<bool(int)> widen_backlog;
};
ListeningServer make_server(const ServeOptions& opts) {
  ListeningServer out;
  if (!opts.tls_cert.empty()) {
    auto s = std::make_unique<Listener<httplib::SSLServer>>(opts.tls_cert.c_str(),
                                                              opts.tls_key.c_str());
    if (!s->is_valid()) return out;
    out.widen_backlog = [p = s.get()](int b) { return p->widen_backlog(b); };
    out.server = std::move(s);
  } else {
    auto s = std::make_unique<Listener<httplib::Server>>();
    out.widen_backlog = [p = s.get()](int b) { return p->widen_backlog(b); };
    out.server = std::move(s);
  }
  return out;
}

}  // namespace

int serve_completions(GenerationEngine& engine, const Tokenizer& tokenizer,
                      const ServeOptions& opts) {
  auto refuse = [&](const std::string& message) {
    engine.stop_followers();
    return UserError("jumbo serve: " + message);
  };
  if (const std::string problem = options_problem(opts); !problem.empty()) throw refuse(problem);
  serve::AdapterTable adapters(engine.shape().adapter_slots);
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  for (const ServedAdapter& a : opts.adapters) {
    adapters.add({a.name, a.path, a.slot, a.lora, now});
  }
  serve::ServedModel model{opts.model_name, engine.shape(), engine.sampled_vocab(), 0,
                           opts.chat_template, &adapters};
  model.max_prompt_bytes = engine.shape().cache_positions * longest_piece_bytes(tokenizer);
  JobQueue queue;
  queue.max_jobs = static_cast<size_t>(opts.max_queue);
  queue.free_slots = static_cast<size_t>(engine.shape().cache_slots);
  serve::ServeMetrics metrics;

  const bool tls = !opts.tls_cert.empty();
  ListeningServer listening = make_server(opts);
  if (!listening.server) {
    throw refuse(fmt::format("--tls-cert {} --tls-key {}: cannot load them (PEM certificate "
                             "and its private key expected)", opts.tls_cert, opts.tls_key));
  }
  std::unique_ptr<httplib::Server>& server = listening.server;
  const std::function<bool(int)>& widen_backlog = listening.widen_backlog;
  httplib::Server& http = *server;
  // Every request waiting to start, every running one, and a few for /health and /metrics
  // have a thread, so a full queue is answered (429) rather than left in the pool's backlog.
  const size_t threads = queue.max_jobs + static_cast<size_t>(engine.shape().cache_slots) + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_keep_alive_timeout(2);
  http.set_payload_max_length(serve::kMaxBodyBytes);
  const auto front = serve::install_http_front(http, tokenizer, model, queue, metrics, opts);

  const int port = opts.port == 0 ? http.bind_to_any_port(opts.host)
                   : http.bind_to_port(opts.host, opts.port) ? opts.port
                                                             : -1;
  if (port < 0 || !widen_backlog(1024)) {
    throw refuse(fmt::format("--host {} --port {}: cannot listen there (in use, or not an "
                             "address of this machine)", opts.host, opts.port));
  }
  serve::log_line(
      fmt::format("jumbo serve: model {}, context {} tokens, {} sequences at once{}{}{}{}\n",
                  model.name, model.shape.cache_positions, model.shape.cache_slots,
                  model.shape.adapter_slots == 0
                      ? ""
                      : fmt::format(", {} of {} adapter slots (LoRA rank <= {})",
                                    opts.adapters.size(), model.shape.adapter_slots,
                                    model.shape.max_lora_rank),
                  model.chat_template ? ", chat template " + model.chat_template->source : "",
                  opts.api_keys.empty() ? "" : fmt::format(", {} API key(s)", opts.api_keys.size()),
                  tls ? ", TLS" : ""),
      stdout);
  serve::log_line(fmt::format("listening on {}://{}:{}\n", tls ? "https" : "http", opts.host,
                              port), stdout);
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
    serve::Leader(engine, tokenizer.eos_id(), queue, metrics, adapters, opts.stop_requested,
                  [&http] { http.stop(); })
        .run();
  } catch (...) {
    // The engine failed: handlers may wait on jobs that will never end, so the listener
    // is not joined; the process is ending (main aborts the other ranks).
    http.stop();
    listener.detach();
    server.release();
    throw;
  }
  // Nothing is queued or running: the handler threads have what they wait for.
  listener.join();
  engine.stop_followers();
  serve::log_line(fmt::format("jumbo serve: stopped after {} requests ({} cancelled)\n",
                              queue.completed.load(), queue.cancelled.load()), stdout);
  return 0;
}

}  // namespace jumbo
