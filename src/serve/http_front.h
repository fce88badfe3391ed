#pragma once
// The HTTP front of `jumbo serve` (llama.cpp's server splits the same way: HTTP, queue, task,
// context): the OpenAI routes and the server's own (/tokenize, /health, /metrics), API keys,
// CORS, the access log, and the error bodies of what httplib refuses. A request becomes a Job
// in the JobQueue (leader.h) that the leader alone steps; its handler waits on it.
#include <httplib.h>

#include <cstddef>
#include <memory>

#include "completions.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/serve/server.h"
#include "leader.h"
#include "metrics.h"

namespace jumbo::serve {

// The largest request body httplib accepts (a longer one is answered 413).
inline constexpr size_t kMaxBodyBytes = size_t{16} << 20;

class HttpFront;
struct HttpFrontDeleter {
  void operator()(HttpFront* front) const;
};

// Installs every route on `http`. The returned front holds what the handlers share (the
// model's description, the access log's lock) and must outlive the server's listening.
std::unique_ptr<HttpFront, HttpFrontDeleter> install_http_front(
    httplib::Server& http, const Tokenizer& tokenizer, const ServedModel& model, JobQueue& queue,
    ServeMetrics& metrics, const ServeOptions& opts);

}  // namespace jumbo::serve
