// jumbo serve: an OpenAI-compatible completions server over a checkpoint (docs/serve.md).
// World rank 0 serves HTTP and drives the engine; under mpirun the other ranks follow its
// steps. SIGTERM or SIGINT: stop listening, finish the accepted requests, exit 0.
#include <fmt/format.h>

#include "inference_flags.h"
#include "jumbo/serve/server.h"
#include "jumbo/train/stop_signal.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

struct Args {
  InferenceOptions inference;
  ServeOptions serve;
};

int run_serve(Args a) {
  // Before the session: a signal during loading is kept, and the followers (which mpirun
  // signals too) must not die while the leader finishes its requests.
  install_stop_signal_handlers();
  InferenceSession s = open_inference_session(a.inference, "serve");
  GenerationEngine& engine = *s.engine;
  if (!engine.leader()) {
    engine.follow();
    return 0;
  }
  if (a.serve.model_name.empty()) a.serve.model_name = s.model_name;
  a.serve.stop_requested = [] { return stop_signal_received() != 0; };
  return serve_completions(engine, *s.tokenizer, a.serve);
}

}  // namespace

void add_serve_verb(CLI::App& app, VerbRunner& run) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "an OpenAI-compatible completions server (POST /v1/completions, streaming; "
               "continuous batching; any tp x pp layout under mpirun)");
  add_inference_flags(*cmd, a->inference);
  cmd->add_option("--host", a->serve.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", a->serve.port, "port to listen on (0 = any free port, printed)")
      ->capture_default_str();
  cmd->add_option("--max-queue", a->serve.max_queue,
                  "requests waiting to start; more are refused with 429")->capture_default_str();
  cmd->add_option("--model-name", a->serve.model_name,
                  "the name clients pass as \"model\" (default: MODEL@step_NNNNNNNN)");
  cmd->callback([&run, a] { run = [a] { return run_serve(*a); }; });
}

}  // namespace jumbo::cli
