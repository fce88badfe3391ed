// `jumbo bench serve` (bench/load_generator.h): the server as a child process, C client
// threads per level, streamed completions timed chunk by chunk, the engine alone to compare.
#include "jumbo/bench/load_generator.h"

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <stdexcept>
#include <thread>

#include "jumbo/backend/backend.h"
#include "jumbo/ckpt/resolve.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/bench/bench_generate.h"

namespace jumbo {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string this_binary() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw std::runtime_error("bench serve: cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

// `jumbo serve` as a child: started with fork/exec (it dies with this thread: PDEATHSIG),
// its stdout read for the listening line and then drained; stopped with SIGTERM by PID and
// waited for (SIGKILL after a grace period) by stop() or the destructor, whatever happens.
class ServerProcess {
 public:
  ServerProcess(const std::vector<std::string>& argv, double timeout_s) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("bench serve: pipe failed");
    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw std::runtime_error(fmt::format("bench serve: fork failed: {}", std::strerror(errno)));
    }
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      ::dup2(fds[1], STDOUT_FILENO);  // and its stderr (the access log): kept off the table
      ::dup2(fds[1], STDERR_FILENO);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(126);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
    try {
      port_ = wait_for_port(timeout_s);
    } catch (...) {
      stop();
      throw;
    }
    drain_ = std::thread([this] {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd_, buf, sizeof(buf))) > 0;) {
        tail_.append(buf, static_cast<size_t>(n));
        if (tail_.size() > 8192) tail_.erase(0, tail_.size() - 4096);
      }
    });
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { stop(); }

  int port() const { return port_; }
  // The last line the server printed (after stop()).
  std::string last_line() const {
    const std::string t = tail_.substr(0, tail_.find_last_not_of('\n') + 1);  // npos + 1 = 0
    return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
  }
  // The exit status (0 after a graceful stop), or -signal. Idempotent.
  int stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      pid_t done = 0;
      while ((done = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (done == 0) {
        ::kill(pid_, SIGKILL);
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
      }
      exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      pid_ = -1;
    }
    if (drain_.joinable()) drain_.join();  // the pipe is at EOF once the child is gone
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return exit_;
  }

 private:
  int wait_for_port(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    const std::regex line_re("listening on http://[^:]+:([0-9]+)");
    std::string out;
    for (;;) {
      const double left = seconds_between(Clock::now(), deadline);
      if (left <= 0) {
        throw std::runtime_error(fmt::format(
            "bench serve: no \"listening on\" line from jumbo serve within {:.0f} s", timeout_s));
      }
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
      if (ready < 0 && errno != EINTR) throw std::runtime_error("bench serve: poll failed");
      if (ready <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) {
        const int code = stop();
        throw std::runtime_error(fmt::format(
            "bench serve: jumbo serve exited ({}) before listening; its output: {}", code,
            out.empty() ? "(none)" : out.substr(0, out.find_last_not_of('\n') + 1)));
      }
      out.append(buf, static_cast<size_t>(n));
      std::smatch m;
      if (std::regex_search(out, m, line_re)) return std::stoi(m[1].str());
    }
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  int exit_ = 0;
  std::thread drain_;
  std::string tail_;  // written by drain_ only, read after it is joined
};

struct RequestSpec {
  std::vector<int> prompt;
  int64_t max_tokens = 0;
  uint64_t seed = 0;
};

struct RequestResult {
  bool ok = false;
  std::string error;
  Clock::time_point start, end;
  std::vector<std::pair<Clock::time_point, int64_t>> chunks;  // arrival, tokens (> 0)
  int64_t tokens = 0;
};

// One streamed completion. A chunk's tokens: its logprobs.tokens (we ask for logprobs 0),
// else 1 when it has text. Errors: transport, status, an unparsable event, no [DONE].
RequestResult run_request(int port, const std::string& model, const RequestSpec& spec) {
  RequestResult r;
  json prompts = json::array();  // a list of one list of token ids: one prompt at any length
  prompts.push_back(spec.prompt);
  const std::string body = json{{"model", model},          {"prompt", prompts},
                                {"max_tokens", spec.max_tokens}, {"temperature", 0.8},
                                {"seed", spec.seed},         {"stream", true},
                                {"logprobs", 0},             {"ignore_eos", true}}
                               .dump();
  httplib::Client client("127.0.0.1", port);  // one connection per request (Connection: close)
  client.set_connection_timeout(10);
  client.set_read_timeout(600);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body;
  int status = 0;
  bool done = false;
  std::string pending, failure, error_body;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, n);
      return true;
    }
    // Events that arrive in one read arrive at once: one chunk of their tokens.
    const auto now = Clock::now();
    int64_t arrived = 0;
    pending.append(data, n);
    size_t eol;
    while ((eol = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, eol);
      pending.erase(0, eol + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == ':') continue;  // event separator, SSE comment
      if (line.rfind("data: ", 0) != 0 || done) {
        failure = fmt::format("unexpected stream line \"{}\"", line.substr(0, 80));
        return false;
      }
      const std::string payload = line.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(payload, nullptr, false);
      if (chunk.is_discarded() || !chunk.is_object() || chunk.contains("error") ||
          !chunk.contains("choices") || !chunk["choices"].is_array()) {
        failure = fmt::format("bad event \"{}\"", payload.substr(0, 120));
        return false;
      }
      for (const json& c : chunk["choices"]) {
        const json lp = c.is_object() ? c.value("logprobs", json()) : json();
        const json text = c.is_object() ? c.value("text", json()) : json();
        if (lp.is_object() && lp.contains("tokens") && lp["tokens"].is_array()) {
          arrived += static_cast<int64_t>(lp["tokens"].size());
        } else if (text.is_string() && !text.get<std::string>().empty()) {
          arrived += 1;
        }
      }
    }
    if (arrived > 0) r.chunks.emplace_back(now, arrived);
    r.tokens += arrived;
    return true;
  };
  r.start = Clock::now();
  httplib::Result res(nullptr, httplib::Error::Unknown);
  try {
    res = client.send(req);
  } catch (const std::exception& e) {
    failure = std::string("client: ") + e.what();
  }
  r.end = Clock::now();
  if (!failure.empty()) {
    r.error = failure;
  } else if (!res) {
    r.error = "transport: " + httplib::to_string(res.error());
  } else if (status != 200) {
    const json e = json::parse(error_body, nullptr, false);
    const json message = e.is_object() ? e.value(json::json_pointer("/error/message"), json())
                                       : json();
    r.error = fmt::format("HTTP {}: {}", status, message.is_string() ? message.get<std::string>()
                                                                     : error_body.substr(0, 120));
  } else if (!done) {
    r.error = "the stream ended without data: [DONE]";
  } else {
    r.ok = true;
  }
  return r;
}

LatencySummary summarize(std::vector<double> v) {
  LatencySummary s;
  s.samples = static_cast<int64_t>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto rank = [&](double p) {
    const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
    return v[std::clamp<size_t>(k, 1, v.size()) - 1];
  };
  s.p50 = rank(0.50);
  s.p90 = rank(0.90);
  s.p99 = rank(0.99);
  return s;
}

// `concurrency` client threads take the requests in order, each sent at its arrival (after
// the start) or when a client is free; the first five error messages are kept.
std::vector<RequestResult> run_requests(int port, const std::string& model,
                                        const std::vector<RequestSpec>& specs,
                                        int64_t concurrency, Clock::time_point t0,
                                        const std::vector<Clock::duration>& arrival,
                                        std::vector<std::string>& messages) {
  std::vector<RequestResult> results(specs.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (size_t i; (i = next++) < specs.size();) {
        std::this_thread::sleep_until(t0 + arrival[i]);
        results[i] = run_request(port, model, specs[i]);
        std::lock_guard lock(mu);
        if (!results[i].ok && messages.size() < 5) messages.push_back(results[i].error);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  return results;
}

ServeBenchLevel run_level(int port, const std::string& model, const std::vector<RequestSpec>& specs,
                          int64_t concurrency, const ServeBenchOptions& o,
                          std::vector<std::string>& messages) {
  const size_t n = specs.size();
  std::vector<Clock::duration> arrival(n, Clock::duration{});  // after the level starts
  if (o.rate > 0) {
    std::mt19937_64 rng(o.seed * 7919 + static_cast<uint64_t>(concurrency));
    std::exponential_distribution<double> gap(o.rate);
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      t += gap(rng);
      arrival[i] = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
    }
  }
  const auto t0 = Clock::now();
  const std::vector<RequestResult> results =
      run_requests(port, model, specs, concurrency, t0, arrival, messages);

  ServeBenchLevel l;
  l.concurrency = concurrency;
  l.requests = static_cast<int64_t>(n);
  std::vector<double> ttft, itl;
  auto last = t0;
  for (const RequestResult& r : results) {
    last = std::max(last, r.end);
    if (!r.ok) {
      ++l.errors;
      continue;
    }
    l.output_tokens += r.tokens;
    if (r.chunks.empty()) continue;  // EOS at once: no token, no first-token time
    ttft.push_back(seconds_between(r.start, r.chunks.front().first));
    for (size_t k = 1; k < r.chunks.size(); ++k) {
      const auto& [at, tokens] = r.chunks[k];
      const double gap = seconds_between(r.chunks[k - 1].first, at) / static_cast<double>(tokens);
      for (int64_t j = 0; j < tokens; ++j) itl.push_back(gap);
    }
  }
  l.wall_s = seconds_between(t0, last);
  l.output_tokens_per_s = static_cast<double>(l.output_tokens) / l.wall_s;
  l.requests_per_s = static_cast<double>(n) / l.wall_s;
  l.ttft = summarize(std::move(ttft));
  l.itl = summarize(std::move(itl));
  return l;
}

// B equal requests at once; the tokens that arrive after the last first token, over the time
// from it to the last token. A warm-up round, then the median of the rounds.
double server_decode_rate(int port, const std::string& model, ServeBenchOverhead& ov,
                          int64_t prompt_id_limit, uint64_t seed,
                          std::vector<std::string>& messages) {
  std::vector<int> prompt;
  for (int64_t t = 0; t < ov.prompt_tokens; ++t) {
    prompt.push_back(static_cast<int>((t * 37 + 11) % prompt_id_limit));
  }
  std::vector<double> rates;
  const std::vector<Clock::duration> at_once(static_cast<size_t>(ov.batch), Clock::duration{});
  for (int64_t round = 0; round < ov.rounds + 1; ++round) {
    std::vector<RequestSpec> specs;
    for (int64_t b = 0; b < ov.batch; ++b) {
      specs.push_back({prompt, ov.output_tokens, seed + static_cast<uint64_t>(1000 * round + b)});
    }
    const std::vector<RequestResult> results =
        run_requests(port, model, specs, ov.batch, Clock::now(), at_once, messages);
    bool ok = true;
    Clock::time_point last_first{}, last_token{};
    for (const RequestResult& r : results) {
      if (!r.ok || r.chunks.empty()) {
        ok = false;
        ov.errors += r.ok ? 0 : 1;
        continue;
      }
      last_first = std::max(last_first, r.chunks.front().first);
      last_token = std::max(last_token, r.chunks.back().first);
    }
    if (!ok || round == 0) continue;
    int64_t tokens = 0;
    for (const RequestResult& r : results) {
      for (const auto& [at, k] : r.chunks) tokens += at > last_first ? k : 0;
      ov.ended_early += r.tokens < ov.output_tokens ? 1 : 0;
    }
    const double window = seconds_between(last_first, last_token);
    if (window > 0 && tokens > 0) rates.push_back(static_cast<double>(tokens) / window);
  }
  if (rates.empty()) return 0;
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

json latency_json(const LatencySummary& s) {
  return {{"samples", s.samples}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
}

std::string list_of(const std::vector<int64_t>& v) { return fmt::format("{}", fmt::join(v, ",")); }

std::string milliseconds(const LatencySummary& s, int digits) {
  return fmt::format("{:.{}f}/{:.{}f}/{:.{}f}", 1e3 * s.p50, digits, 1e3 * s.p90, digits,
                     1e3 * s.p99, digits);
}

}  // namespace

int64_t ServeBenchResult::errors() const {
  int64_t n = overhead.errors;
  for (const ServeBenchLevel& l : levels) n += l.errors;
  return n;
}

ServeBenchResult bench_serve(const ServeBenchOptions& o) {
  const ResolvedCheckpoint ck = resolve_checkpoint(o.checkpoint, S3Options{});
  const ModelConfig& model = ck.manifest.model;
  const int64_t longest_prompt = *std::max_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  const int64_t longest_output = *std::max_element(o.output_tokens.begin(), o.output_tokens.end());
  if (longest_prompt + longest_output > model.context) {
    throw UserError(fmt::format("--prompt-tokens {} --output-tokens {}: expected the longest "
                                "prompt plus the longest output within the model's context "
                                "of {}",
                                list_of(o.prompt_tokens), list_of(o.output_tokens), model.context));
  }
  ServeBenchResult r;
  r.precision = to_string(ck.manifest.precision);
  r.vocab = model.vocab;
  r.context = model.context;
  const int64_t id_limit = std::min<int64_t>(100, model.vocab);

  // The request mix: the same for every level.
  std::vector<RequestSpec> specs(static_cast<size_t>(o.requests));
  std::mt19937_64 rng(o.seed);
  for (size_t i = 0; i < specs.size(); ++i) {
    RequestSpec& s = specs[i];
    const int64_t p = o.prompt_tokens[rng() % o.prompt_tokens.size()];
    s.max_tokens = o.output_tokens[rng() % o.output_tokens.size()];
    for (int64_t t = 0; t < p; ++t) s.prompt.push_back(static_cast<int>(rng() % id_limit));
    s.seed = o.seed * 100003 + i;
  }

  const int64_t most_clients = *std::max_element(o.concurrency.begin(), o.concurrency.end());
  const std::vector<std::string> argv = {
      o.server_binary.empty() ? this_binary() : o.server_binary, "serve", "--checkpoint",
      o.checkpoint, "--port", "0", "--max-batch", std::to_string(o.max_batch), "--max-queue",
      std::to_string(std::max<int64_t>(64, most_clients))};
  ServerProcess server(argv, o.start_timeout_s);
  {
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(60);
    const httplib::Result res = client.Get("/v1/models");
    const json models = res && res->status == 200 ? json::parse(res->body, nullptr, false) : json();
    const json id = models.is_object() ? models.value(json::json_pointer("/data/0/id"), json())
                                       : json();
    if (!id.is_string()) throw std::runtime_error("bench serve: GET /v1/models named no model");
    r.model_name = id.get<std::string>();
  }
  const RequestResult warm = run_request(server.port(), r.model_name, specs.front());
  if (!warm.ok) throw std::runtime_error("bench serve: the warm-up request failed: " + warm.error);

  for (int64_t c : o.concurrency) {
    r.levels.push_back(run_level(server.port(), r.model_name, specs, c, o, r.error_messages));
  }
  ServeBenchOverhead& ov = r.overhead;
  ov.batch = o.max_batch;
  ov.prompt_tokens = o.prompt_tokens.front();
  ov.output_tokens = longest_output;
  ov.rounds = 3;
  ov.server_decode_tokens_per_s =
      server_decode_rate(server.port(), r.model_name, ov, id_limit, o.seed, r.error_messages);
  const int exit_code = server.stop();
  if (exit_code != 0) {
    r.error_messages.push_back(fmt::format(
        "jumbo serve did not stop cleanly ({} {}); its last line: {}",
        exit_code > 0 ? "exit status" : "signal", std::abs(exit_code), server.last_line()));
    ov.errors += 1;
  }

  // The engine alone: random weights of the same config, the same batch and lengths.
  GenerateBenchOptions g;
  g.batches = {ov.batch};
  g.prompt_tokens = ov.prompt_tokens;
  g.new_tokens = ov.output_tokens;
  g.repeats = ov.rounds;
  g.precision = ck.manifest.precision;
  auto backend = make_cpu_backend();
  const GenerateBenchResult e = bench_generate(model, g, *backend, mpi_world());
  ov.engine_decode_tokens_per_s = e.rows.front().decode_tokens_per_s;
  const double engine = ov.engine_decode_tokens_per_s;
  ov.ratio = engine > 0 ? ov.server_decode_tokens_per_s / engine : 0;
  return r;
}

std::string describe(const ServeBenchResult& r, const ServeBenchOptions& o) {
  std::string out = fmt::format(
      "bench serve: {} ({}, vocab {}, context {}), max-batch {}, {} requests per level, {}, "
      "prompt tokens {{{}}}, output tokens {{{}}}\n",
      r.model_name, r.precision, r.vocab, r.context, o.max_batch, o.requests,
      o.rate > 0 ? fmt::format("Poisson arrivals at {:g}/s", o.rate) : std::string("closed loop"),
      list_of(o.prompt_tokens), list_of(o.output_tokens));
  out += fmt::format("{:>5} {:>5} {:>6} {:>9} {:>7} {:>24} {:>24}\n", "conc", "reqs", "errors",
                     "out tok/s", "req/s", "TTFT p50/p90/p99 ms", "ITL p50/p90/p99 ms");
  for (const ServeBenchLevel& l : r.levels) {
    out += fmt::format("{:>5} {:>5} {:>6} {:>9.1f} {:>7.2f} {:>24} {:>24}\n", l.concurrency,
                       l.requests, l.errors, l.output_tokens_per_s, l.requests_per_s,
                       milliseconds(l.ttft, 1), milliseconds(l.itl, 2));
  }
  const ServeBenchOverhead& ov = r.overhead;
  out += fmt::format(
      "decode at batch {} (prompt {}, output {} tokens): server {:.1f} tok/s, engine alone "
      "{:.1f} tok/s: server/engine = {:.3f} (the server's overhead: {:.1f}%)\n",
      ov.batch, ov.prompt_tokens, ov.output_tokens, ov.server_decode_tokens_per_s,
      ov.engine_decode_tokens_per_s, ov.ratio, 100 * (1 - ov.ratio));
  if (ov.ended_early > 0) {
    out += fmt::format("  ({} of the {} timed server requests ended early at EOS: the batch was "
                       "not full to the end)\n", ov.ended_early, ov.batch * ov.rounds);
  }
  for (const std::string& m : r.error_messages) out += "error: " + m + "\n";
  return out;
}

std::string to_json_line(const ServeBenchResult& r, const ServeBenchOptions& o) {
  json levels = json::array();
  for (const ServeBenchLevel& l : r.levels) {
    levels.push_back({{"concurrency", l.concurrency}, {"requests", l.requests},
                      {"errors", l.errors}, {"output_tokens", l.output_tokens},
                      {"wall_s", l.wall_s}, {"output_tokens_per_s", l.output_tokens_per_s},
                      {"requests_per_s", l.requests_per_s}, {"ttft_s", latency_json(l.ttft)},
                      {"itl_s", latency_json(l.itl)}});
  }
  const ServeBenchOverhead& ov = r.overhead;
  return json{{"bench", "serve"}, {"model", r.model_name}, {"precision", r.precision},
              {"max_batch", o.max_batch}, {"rate", o.rate > 0 ? json(o.rate) : json(nullptr)},
              {"levels", levels},
              {"overhead", {{"batch", ov.batch}, {"prompt_tokens", ov.prompt_tokens},
                            {"output_tokens", ov.output_tokens}, {"rounds", ov.rounds},
                            {"server_decode_tokens_per_s", ov.server_decode_tokens_per_s},
                            {"engine_decode_tokens_per_s", ov.engine_decode_tokens_per_s},
                            {"ratio", ov.ratio}, {"ended_early", ov.ended_early},
                            {"errors", ov.errors}}},
              {"errors", r.errors()}}
      .dump();
}

}  // namespace jumbo
