#pragma once
// `jumbo serve`: an OpenAI-compatible HTTP front (completions, chat completions, models,
// tokenize, health, metrics) of one GenerationEngine. HTTP handler threads parse and validate
// requests and hand them to the leader's main thread through a bounded queue; that thread
// alone drives the Scheduler (continuous batching) and so every collective engine step.
// docs/serve.md.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/data/chat_template.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/engine.h"

namespace jumbo {

// "" or why `name` cannot name an adapter: 1-128 characters of letters, digits and ._:@-
// (no /: it is a path segment of /v1/models/{id} and /v1/adapters/{name}).
std::string adapter_name_problem(const std::string& name);

// An adapter the engine holds from the start (--adapter NAME=PATH), in its slot.
struct ServedAdapter {
  std::string name, path;
  int32_t slot = -1;
  LoraShape lora;
};

struct ServeOptions {
  std::string host = "127.0.0.1";  // --host
  int port = 8000;                 // --port: 0 = any free port (printed)
  int64_t max_queue = 64;          // --max-queue: requests waiting to start; more get 429
  std::string model_name;          // --model-name: what clients put in "model"
  // --api-key / --api-key-file: when any, every route but /health needs
  // "Authorization: Bearer KEY" with one of them.
  std::vector<std::string> api_keys;
  std::optional<ChatTemplate> chat_template;  // --chat-template, else the checkpoint's
  std::string tls_cert, tls_key;              // --tls-cert, --tls-key: HTTPS when both
  std::vector<std::string> cors_origins;      // --cors-origin: "*" or origins; none = no CORS
  std::vector<ServedAdapter> adapters;        // loaded in the engine before serving
  // Asked between engine steps and while idle: true starts a graceful stop (no new
  // requests; those accepted finish). `jumbo serve` passes the SIGTERM/SIGINT record.
  std::function<bool()> stop_requested;
};

// World rank 0 (the engine's leader; the other ranks are in engine.follow()). Binds, prints
// "listening on http(s)://HOST:PORT" on stdout, serves until stop_requested(), finishes the
// accepted requests, stops the followers and returns 0. Throws UserError naming the flag
// when it cannot bind or load the TLS files (after stopping the followers).
int serve_completions(GenerationEngine& engine, const Tokenizer& tokenizer,
                      const ServeOptions& opts);

}  // namespace jumbo
