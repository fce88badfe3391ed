// jumbo serve: an OpenAI-compatible completions server over a checkpoint (docs/serve.md).
// World rank 0 serves HTTP and drives the engine; under mpirun the other ranks follow its
// steps. SIGTERM or SIGINT: stop listening, finish the accepted requests, exit 0.
#include <fmt/format.h>

#include <csignal>
#include <fstream>

#include "inference_flags.h"
#include "jumbo/serve/server.h"
#include "jumbo/runtime/stop_signal.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

struct Args {
  InferenceOptions inference;
  ServeOptions serve;
  std::string api_key_file;
  std::string chat_template;
  std::vector<std::string> adapters;  // NAME=PATH
};

// --adapter NAME=PATH, each name once and not the base's.
std::vector<AdapterSpec> adapter_specs(const std::vector<std::string>& flags) {
  std::vector<AdapterSpec> out;
  for (const std::string& f : flags) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq + 1 == f.size()) {
      throw UserError(fmt::format("jumbo serve: --adapter {}: expected NAME=PATH (a name for "
                                  "\"model\" and a LoRA checkpoint)", f));
    }
    AdapterSpec spec{f.substr(0, eq), f.substr(eq + 1)};
    if (const std::string problem = adapter_name_problem(spec.name); !problem.empty()) {
      throw UserError(fmt::format("jumbo serve: --adapter {}: the name {}", f, problem));
    }
    for (const AdapterSpec& other : out) {
      if (other.name == spec.name) {
        throw UserError(fmt::format("jumbo serve: --adapter {}: the name {} is given twice", f,
                                    spec.name));
      }
    }
    out.push_back(std::move(spec));
  }
  return out;
}

// One key a line; blank lines and lines starting with # are skipped.
std::vector<std::string> read_api_keys(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError(fmt::format("jumbo serve: --api-key-file {}: cannot open the file", path));
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    keys.push_back(line);
  }
  if (keys.empty()) throw UserError(fmt::format("jumbo serve: --api-key-file {}: no keys in the file", path));
  return keys;
}

int run_serve(Args a) {
  // Before the session: a signal during loading is kept, and the followers (which mpirun
  // signals too) must not die while the leader finishes its requests.
  install_stop_signal_handlers();
  // A log collector's pipe that goes away must not kill a server (writes then fail, and the
  // logs ignore that); httplib ignores SIGPIPE too, but only once its server exists.
  std::signal(SIGPIPE, SIG_IGN);
  // The user's files first, before minutes of loading: a typo fails at once.
  if (!a.api_key_file.empty()) {
    for (std::string& k : read_api_keys(a.api_key_file)) a.serve.api_keys.push_back(std::move(k));
  }
  for (const std::string& k : a.serve.api_keys) {
    if (k.empty()) throw UserError("jumbo serve: --api-key: an empty key");
  }
  if (!a.chat_template.empty()) a.serve.chat_template = load_chat_template(a.chat_template);
  a.inference.adapters = adapter_specs(a.adapters);
  InferenceSession s = open_inference_session(a.inference, "serve");
  GenerationEngine& engine = *s.engine;
  if (!engine.leader()) {
    engine.follow();
    return 0;
  }
  if (a.serve.model_name.empty()) a.serve.model_name = s.model_name;
  for (const LoadedAdapter& l : s.adapters) {
    if (l.spec.name == a.serve.model_name) {
      engine.stop_followers();
      throw UserError(fmt::format("jumbo serve: --adapter {}={}: the name is the base model's "
                                  "(--model-name)", l.spec.name, l.spec.path));
    }
    a.serve.adapters.push_back({l.spec.name, l.spec.path, l.slot, l.lora});
  }
  const std::string& stored = s.checkpoint.manifest.chat_template;
  if (!a.serve.chat_template && !stored.empty()) {
    try {
      a.serve.chat_template =
          parse_stored_chat_template(stored, s.checkpoint.dir + " (data.chat_template)");
    } catch (const UserError&) {
      engine.stop_followers();
      throw;
    }
  }
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
  cmd->add_option("--api-key", a->serve.api_keys,
                  "require \"Authorization: Bearer KEY\" on every route but /health (repeatable)");
  cmd->add_option("--api-key-file", a->api_key_file, "API keys, one a line (# comments)");
  cmd->add_option("--chat-template", a->chat_template,
                  "a chat template for /v1/chat/completions: jumbo's TOML, a Hugging Face "
                  "tokenizer_config.json or a .jinja file (default: the checkpoint's "
                  "data.chat_template)");
  cmd->add_option("--tls-cert", a->serve.tls_cert, "PEM certificate: serve HTTPS (with --tls-key)");
  cmd->add_option("--tls-key", a->serve.tls_key, "PEM private key of --tls-cert");
  cmd->add_option("--adapter", a->adapters,
                  "NAME=PATH: serve a LoRA checkpoint of this base as model NAME (repeatable)");
  cmd->add_option("--max-adapters", a->inference.max_adapters,
                  "adapter slots, for POST /v1/adapters while serving (default: as many as "
                  "--adapter gives)");
  cmd->add_option("--max-lora-rank", a->inference.max_lora_rank,
                  "the largest LoRA rank a slot holds (default: the largest --adapter's, else 16)");
  cmd->add_option("--cors-origin", a->serve.cors_origins,
                  "allow browsers from this origin (repeatable; * = any); default: no CORS");
  cmd->callback([&run, a] { run = [a] { return run_serve(*a); }; });
}

}  // namespace jumbo::cli
