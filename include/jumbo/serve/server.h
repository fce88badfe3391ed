#pragma once
// `jumbo serve`: an OpenAI-compatible HTTP front (POST /v1/completions, GET /v1/models,
// GET /health) of one GenerationEngine. HTTP handler threads parse and validate requests and
// hand them to the leader's main thread through a bounded queue; that thread alone drives
// the Scheduler (continuous batching) and so every collective engine step. docs/serve.md.
#include <cstdint>
#include <functional>
#include <string>

#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/engine.h"

namespace jumbo {

struct ServeOptions {
  std::string host = "127.0.0.1";  // --host
  int port = 8000;                 // --port: 0 = any free port (printed)
  int64_t max_queue = 64;          // --max-queue: requests waiting to start; more get 429
  std::string model_name;          // --model-name: what clients put in "model"
  // Asked between engine steps and while idle: true starts a graceful stop (no new
  // requests; those accepted finish). `jumbo serve` passes the SIGTERM/SIGINT record.
  std::function<bool()> stop_requested;
};

// World rank 0 (the engine's leader; the other ranks are in engine.follow()). Binds, prints
// "listening on http://HOST:PORT" on stdout, serves until stop_requested(), finishes the
// accepted requests, stops the followers and returns 0. Throws UserError naming --host or
// --port when it cannot bind (after stopping the followers).
int serve_completions(GenerationEngine& engine, const Tokenizer& tokenizer,
                      const ServeOptions& opts);

}  // namespace jumbo
