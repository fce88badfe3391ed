// The HTTP side of `jumbo serve`: routes, API keys, CORS, the access log and the error bodies
// of what httplib refuses itself. Requests become Jobs for the leader (leader.cpp); each
// handler waits on its job and writes JSON or server-sent events.
#include "http_front.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <random>

#include "adapter_routes.h"
#include "chat.h"
#include "completions.h"
#include "jumbo/config/config.h"
#include "jumbo/infer/completion_text.h"
#include "leader.h"
#include "metrics.h"

namespace jumbo::serve {
namespace {

// The access log line's facts, gathered on the handler's thread; httplib's logger runs on
// the same thread once the response is written (a stream's too).
struct AccessRecord {
  std::string route;  // "" = no route matched
  std::string id;
  int64_t prompt_tokens = -1, completion_tokens = -1;
  Clock::time_point start;
};
thread_local AccessRecord t_access;

// The routes and their methods, for 405 and the "no route" message.
const std::map<std::string, std::string>& routes() {
  static const std::map<std::string, std::string> r = {
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/models", "GET"},
      {"/tokenize", "POST"},       {"/detokenize", "POST"},          {"/health", "GET"},
      {"/metrics", "GET"},         {"/v1/adapters", "POST"}};
  return r;
}

std::string route_of(const std::string& path) {
  if (routes().contains(path)) return path;
  if (path.starts_with("/v1/models/")) return "/v1/models/{id}";
  if (path.starts_with("/v1/adapters/")) return "/v1/adapters/{name}";
  return "";
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(serve::dump(serve::error_json(e)), "application/json");
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 gen(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, gen(), static_cast<uint32_t>(gen()));
}

// Compares every byte of every key, so the time taken does not tell how much of one matched.
bool key_accepted(const std::string& given, const std::vector<std::string>& keys) {
  bool accepted = false;
  for (const std::string& key : keys) {
    unsigned diff = given.size() == key.size() ? 0u : 1u;
    for (size_t i = 0; i < given.size(); ++i) {
      diff |= static_cast<unsigned char>(given[i]) ^
              static_cast<unsigned char>(key.empty() ? 0 : key[i % key.size()]);
    }
    accepted |= diff == 0;
  }
  return accepted;
}

// Writes the job's chunks as they arrive, in one call of the content provider: httplib stops
// calling a provider once the server stops listening, and a stream accepted before a stop
// must still end with [DONE]. A failed write (the client went away) cancels the job.
bool write_stream(Job& job, JobQueue& queue, httplib::DataSink& sink) {
  const serve::CompletionRequest& r = job.request;
  const bool chat = r.endpoint == serve::Endpoint::chat;
  std::vector<bool> first(job.choices.size(), true);
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
        const int64_t index = static_cast<int64_t>(c);
        json choice = chat ? serve::chat_chunk_choice(job.choices[c], index, r.logprobs, first[c])
                           : serve::completion_chunk_choice(job.choices[c], index, r.logprobs);
        if (choice.is_null()) continue;
        first[c] = false;
        out += serve::stream_event(job.head, r, json::array({std::move(choice)}));
      }
      done = job.done();
      if (done && r.include_usage && !job.cancelled) {
        out += serve::usage_event(job.head, r, job.choices);
      }
      if (done) {
        t_access.completion_tokens = serve::usage_json(r, job.choices)["completion_tokens"];
      }
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

class HttpFront {
 public:
  HttpFront(const Tokenizer& tokenizer, const serve::ServedModel& model, JobQueue& queue,
            serve::ServeMetrics& metrics, const ServeOptions& opts)
      : tokenizer_(tokenizer), model_(model), queue_(queue), metrics_(metrics), opts_(opts),
        created_(static_cast<int64_t>(std::time(nullptr))) {}

  void install(httplib::Server& http) {
    http.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, serve::Endpoint::completions);
    }));
    http.Post("/v1/chat/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, serve::Endpoint::chat);
    }));
    http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(serve::dump(serve::models_list_json(model_, created_)), "application/json");
    }));
    http.Get(R"(/v1/models/(.+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(serve::dump(serve::model_json_of(model_, created_, req.matches[1])),
                      "application/json");
    }));
    http.Post("/v1/adapters", guarded([this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(serve::dump(serve::post_adapter(req.body, model_, queue_)), "application/json");
    }));
    http.Delete(R"(/v1/adapters/(.+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(serve::dump(serve::delete_adapter(req.matches[1], model_, queue_)),
                      "application/json");
    }));
    http.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
      tokenize(req, res);
    }));
    http.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
      detokenize(req, res);
    }));
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      begin_access("/health");
      res.set_content(serve::dump(health_json()), "application/json");
    });
    http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
    }));
    http.Options(".*", [this](const httplib::Request& req, httplib::Response& res) {
      begin_access("OPTIONS");
      if (!cors_origin(req).empty()) {
        res.status = 204;
        return;
      }
      send_error(res, ApiError(405, "", opts_.cors_origins.empty()
          ? "OPTIONS: CORS is off (jumbo serve --cors-origin ORIGIN allows browsers)"
          : fmt::format("OPTIONS: origin {} is not allowed (--cors-origin)",
                        serve::quote(json(req.get_header_value("Origin"))))));
    });
    http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      add_cors_headers(req, res);
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      explain_refusal(req, res);
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
      serve::log_line(fmt::format("jumbo serve: internal error in a request: {}\n", what));
      send_error(res, ApiError(500, "", "internal error: " + what, "server_error"));
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      log_access(req, res);
    });
  }

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  void begin_access(const std::string& route) {
    t_access = AccessRecord{route, "", -1, -1, Clock::now()};
  }

  // Every route but /health: the access record, the API key, and ApiError as its JSON.
  Handler guarded(Handler handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      begin_access(route_of(req.path));
      try {
        if (!opts_.api_keys.empty()) check_key(req);
        handler(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  }

  void check_key(const httplib::Request& req) const {
    const std::string header = req.get_header_value("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (header.empty()) {
      throw ApiError(401, "", "no API key: send the header \"Authorization: Bearer KEY\"",
                     "invalid_request_error", "invalid_api_key");
    }
    if (!header.starts_with(kBearer) ||
        !key_accepted(header.substr(kBearer.size()), opts_.api_keys)) {
      throw ApiError(401, "", "incorrect API key provided", "invalid_request_error",
                     "invalid_api_key");
    }
  }

  std::string cors_origin(const httplib::Request& req) const {
    if (opts_.cors_origins.empty() || !req.has_header("Origin")) return "";
    const std::string origin = req.get_header_value("Origin");
    for (const std::string& allowed : opts_.cors_origins) {
      if (allowed == "*" || allowed == origin) return allowed == "*" ? "*" : origin;
    }
    return "";
  }

  void add_cors_headers(const httplib::Request& req, httplib::Response& res) const {
    const std::string origin = cors_origin(req);
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    if (origin != "*") res.set_header("Vary", "Origin");
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
    }
  }

  json health_json() const {
    json health;
    {
      std::lock_guard lock(queue_.mu);
      health = {{"status", queue_.closing ? "stopping" : "ok"},
                {"model", model_.name},
                {"queued", queue_.jobs.size()}};
    }
    health["running"] = queue_.running.load();
    health["waiting"] = queue_.waiting.load();
    health["completed"] = queue_.completed.load();
    health["cancelled"] = queue_.cancelled.load();
    return health;
  }

  void generate(const httplib::Request& req, httplib::Response& res, serve::Endpoint endpoint) {
    auto job = std::make_shared<Job>();
    const bool chat = endpoint == serve::Endpoint::chat;
    job->request = chat ? serve::parse_chat_request(req.body, model_, tokenizer_)
                        : serve::parse_completion_request(req.body, model_, tokenizer_);
    if (!job->request.seeded) job->request.sampling.seed = next_seed_++;
    job->head = {random_id(chat ? "chatcmpl-" : "cmpl-"), static_cast<int64_t>(std::time(nullptr)),
                 job->request.model};
    t_access.id = job->head.id;
    t_access.prompt_tokens = job->request.prompt_tokens();
    for (int64_t c = 0; c < job->request.sequences(); ++c) {
      job->choices.emplace_back(tokenizer_, serve::choice_options(job->request, c));
    }
    {
      std::lock_guard lock(queue_.mu);
      if (queue_.closing) throw ApiError(503, "", "the server is stopping", "server_error");
      if (queue_.full()) {
        throw ApiError(429, "", fmt::format("the queue is full ({} requests waiting, --max-queue); "
                                            "retry later", queue_.max_jobs), "server_error");
      }
      queue_.jobs.push_back(job);
    }
    queue_.wake.notify_one();
    if (job->request.stream) {
      res.set_header("Cache-Control", "no-cache");
      JobQueue& queue = queue_;
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
    const json body = chat ? serve::chat_response(job->head, job->choices, job->request)
                           : serve::completion_response(job->head, job->choices, job->request);
    t_access.completion_tokens = body["usage"]["completion_tokens"];
    res.set_content(serve::dump(body), "application/json");
  }

  // vLLM's shapes: {"prompt"} or {"messages"} -> {"tokens", "count", "max_model_len"}.
  void tokenize(const httplib::Request& req, httplib::Response& res) const {
    const json body = serve::parse_body(req.body);
    check_optional_model(body);
    std::vector<int32_t> tokens;
    const bool special = serve::bool_of(body, "add_special_tokens", true);
    std::string text;
    if (serve::optional(body, "messages")) {
      text = serve::chat_prompt_text(body, model_);
    } else {
      const json* p = serve::optional(body, "prompt");
      if (!p || !p->is_string()) serve::bad("prompt", "expected a string (or give \"messages\")");
      text = p->get<std::string>();
      if (static_cast<int64_t>(text.size()) > model_.max_prompt_bytes) {
        serve::bad("prompt", fmt::format("a text of {} bytes, over the {} that could fit the "
                                         "context", text.size(), model_.max_prompt_bytes));
      }
    }
    tokens = special ? encode_prompt(tokenizer_, text) : tokenizer_.encode(text);
    res.set_content(serve::dump({{"tokens", tokens},
                                 {"count", tokens.size()},
                                 {"max_model_len", model_.shape.cache_positions}}),
                    "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) const {
    const json body = serve::parse_body(req.body);
    check_optional_model(body);
    const json* t = serve::optional(body, "tokens");
    if (!t || !t->is_array()) serve::bad("tokens", "expected a list of token ids");
    std::vector<int32_t> ids;
    for (const json& v : *t) {
      const int64_t id = serve::integer_of(v, "tokens");
      if (id < 0 || id >= model_.vocab) {
        serve::bad("tokens", fmt::format("token id {} outside [0, {})", id, model_.vocab));
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    res.set_content(serve::dump({{"prompt", tokenizer_.decode(ids)}}), "application/json");
  }

  void check_optional_model(const json& body) const {
    const json* m = serve::optional(body, "model");
    if (m && (!m->is_string() || m->get_ref<const std::string&>() != model_.name)) {
      throw ApiError(404, "model", fmt::format("The model {} does not exist; this server serves "
                                               "\"{}\"", serve::quote(*m), model_.name),
                     "invalid_request_error", "model_not_found");
    }
  }

  // httplib answered before any route ran (or no route matched): say what happened.
  static void explain_refusal(const httplib::Request& req, httplib::Response& res) {
    const auto method_served = [&] {
      static const char* kMethods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"};
      return std::any_of(std::begin(kMethods), std::end(kMethods),
                         [&](const char* m) { return req.method == m; });
    };
    // The path may not be parsed yet (an unknown method stops httplib at the request line):
    // the target's path then.
    const std::string path = !req.path.empty() ? req.path : req.target.substr(0, req.target.find('?'));
    const std::string route = route_of(path);
    std::string message;
    switch (res.status) {
      case 413:
        // httplib parses a form body into parameters and caps it at 8 KiB (fixed when it was
        // built); curl -d sends that content type by default.
        if (req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded")) {
          message = "a body sent as application/x-www-form-urlencoded is limited to 8192 bytes: "
                    "send the JSON with \"Content-Type: application/json\"";
          break;
        }
        message = fmt::format("the request body ({} bytes) is over the limit of {} bytes (16 MiB)",
                              req.get_header_value("Content-Length"), kMaxBodyBytes);
        break;
      case 414:
        message = fmt::format("the request line is over {} bytes: the URI is too long",
                              CPPHTTPLIB_REQUEST_URI_MAX_LENGTH);
        break;
      case 400:
        if (req.method.empty()) {
          message = "the request line is not an HTTP request line";
        } else if (!method_served()) {
          message = fmt::format("method {} is not served", req.method.substr(0, 32));
          if (!route.empty()) res.status = 405;
        } else if (req.has_header("REMOTE_ADDR")) {
          // httplib sets it once the headers are read: the body was what failed.
          message = "the request body could not be read (send it with Content-Length, or "
                    "chunked)";
        } else {
          res.status = 431;
          message = fmt::format("a request header line is over {} bytes, or malformed",
                                CPPHTTPLIB_HEADER_MAX_LENGTH);
        }
        break;
      case 404:
        if (!route.empty()) {
          const std::string allowed = route == "/v1/models/{id}"       ? "GET"
                                      : route == "/v1/adapters/{name}" ? "DELETE"
                                                                       : routes().at(route);
          res.status = 405;
          res.set_header("Allow", allowed);
          message = fmt::format("{} {}: method not allowed (use {})", req.method.substr(0, 32),
                                serve::quote(json(path)), allowed);
        } else {
          message = fmt::format("no route {} {} (jumbo serves POST /v1/completions, POST "
                                "/v1/chat/completions, GET /v1/models, POST /v1/adapters, "
                                "DELETE /v1/adapters/NAME, POST /tokenize, POST /detokenize, GET "
                                "/health, GET /metrics)",
                                req.method.substr(0, 32), serve::quote(json(path)));
        }
        break;
      default:
        message = fmt::format("the request was refused with HTTP status {}", res.status);
    }
    send_error(res, ApiError(res.status, "", message));
  }

  void log_access(const httplib::Request& req, const httplib::Response& res) {
    const AccessRecord& a = t_access;
    const bool ours = a.start != Clock::time_point{};
    std::string route = ours ? a.route : route_of(!req.path.empty() ? req.path : req.target.substr(0, req.target.find('?')));
    if (route.empty()) route = "other";
    metrics_.count_request(route, res.status);
    const std::string seconds =
        ours ? fmt::format("{:.3f}", std::chrono::duration<double>(Clock::now() - a.start).count())
             : "-";
    auto count = [](int64_t n) { return n < 0 ? std::string("-") : std::to_string(n); };
    // No prompt text, no key: the method, the route (not the raw path), counts and time.
    serve::log_line(fmt::format("jumbo serve: access id={} method={} route={} status={} "
                                "prompt_tokens={} completion_tokens={} seconds={}\n",
                                a.id.empty() ? "-" : a.id, req.method.substr(0, 16), route,
                                res.status, count(a.prompt_tokens), count(a.completion_tokens),
                                seconds));
    t_access = AccessRecord{};
  }

  const Tokenizer& tokenizer_;
  const serve::ServedModel& model_;
  JobQueue& queue_;
  serve::ServeMetrics& metrics_;
  const ServeOptions& opts_;
  int64_t created_;
  std::atomic<uint64_t> next_seed_{std::random_device{}()};
};

void HttpFrontDeleter::operator()(HttpFront* front) const { delete front; }

std::unique_ptr<HttpFront, HttpFrontDeleter> install_http_front(
    httplib::Server& http, const Tokenizer& tokenizer, const ServedModel& model, JobQueue& queue,
    ServeMetrics& metrics, const ServeOptions& opts) {
  std::unique_ptr<HttpFront, HttpFrontDeleter> front(
      new HttpFront(tokenizer, model, queue, metrics, opts));
  front->install(http);
  return front;
}

}  // namespace jumbo::serve
