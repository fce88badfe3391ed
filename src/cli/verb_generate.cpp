// jumbo generate: complete prompts from a checkpoint, on one rank or under mpirun in any
// tp x pp layout. Greedy by default; sampling with --temperature, --top-k, --top-p, --seed.
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "inference_flags.h"
#include "jumbo/infer/completion_text.h"
#include "jumbo/infer/scheduler.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

struct Args {
  InferenceOptions inference;
  std::vector<std::string> prompts;
  std::string prompts_file;
  int64_t max_new_tokens = 64;
  double temperature = 0, top_p = 1;
  int64_t top_k = 0;
  uint64_t seed = 0;
  double frequency_penalty = 0, presence_penalty = 0;
  std::vector<std::string> stop;
  bool json = false;
};

// {"prompt": "..."} per line.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError(fmt::format("--prompts {}: cannot open the file", path));
  std::vector<std::string> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      throw UserError(fmt::format("{}:{}: expected a JSON object with a string \"prompt\"", path, n));
    }
    out.push_back(j["prompt"].get<std::string>());
  }
  if (out.empty()) throw UserError(fmt::format("--prompts {}: no prompts in the file", path));
  return out;
}

int run_generate(const Args& a) {
  if (a.prompts.empty() == a.prompts_file.empty()) {
    throw UserError("jumbo generate: give --prompt TEXT or --prompts FILE.jsonl (one of them)");
  }
  InferenceSession s = open_inference_session(a.inference, "generate");
  GenerationEngine& engine = *s.engine;
  if (!engine.leader()) {
    engine.follow();
    return 0;
  }
  const Tokenizer& tok = *s.tokenizer;
  const std::vector<std::string> prompts = a.prompts_file.empty() ? a.prompts : read_prompts(a.prompts_file);
  std::vector<GenerationRequest> requests;
  std::vector<CompletionText> texts;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = encode_prompt(tok, prompts[i]);
    r.max_new_tokens = a.max_new_tokens;
    r.adapter = s.adapters.empty() ? -1 : s.adapters.front().slot;
    r.sampling = {a.temperature, a.top_k, a.top_p, a.seed, 0, a.frequency_penalty,
                  a.presence_penalty, {}};
    const std::string problem = request_problem(r, engine.shape(), engine.sampled_vocab());
    if (!problem.empty()) {
      engine.stop_followers();
      throw UserError(fmt::format("jumbo generate: prompt {}: {}", i + 1, problem));
    }
    texts.emplace_back(tok, a.stop, r.prompt);
    requests.push_back(std::move(r));
  }
  const std::vector<Generated> out = generate_all(
      engine, tok.eos_id(), requests,
      [&texts](size_t i, const std::vector<int32_t>& ids) { return texts[i].add(ids.back()); });
  engine.stop_followers();
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string& text = texts[i].text();
    if (a.json) {
      nlohmann::json j = {{"index", i},
                          {"prompt", prompts[i]},
                          {"text", text},
                          {"tokens", out[i].tokens},
                          {"finish_reason", to_string(out[i].finish)}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("=== {} ({} tokens, {})\n{}{}\n", i + 1, out[i].tokens.size(),
                 to_string(out[i].finish), prompts[i], text);
    }
  }
  return 0;
}

}  // namespace

void add_generate_verb(CLI::App& app, VerbRunner& run) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "complete prompts from a checkpoint (KV cache, continuous batching; any "
                  "tp x pp layout under mpirun)");
  add_inference_flags(*cmd, a->inference);
  cmd->add_option_function<std::string>(
      "--adapter", [a](const std::string& path) { a->inference.adapters = {{path, path}}; },
      "a LoRA checkpoint of this base: generate with its adapters");
  cmd->add_option("--prompt", a->prompts, "a prompt (repeatable)");
  cmd->add_option("--prompts", a->prompts_file, "a JSONL file of {\"prompt\": TEXT} lines");
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate per prompt")
      ->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "sample from the k most likely tokens (0 = all)")
      ->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "sample from the smallest set holding this probability")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "the same seed gives the same text on any layout")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", a->frequency_penalty,
                  "lower a token's logit by this times its count in the completion so far "
                  "(-2 .. 2, as OpenAI's)")->capture_default_str()->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--presence-penalty", a->presence_penalty,
                  "lower the logit of a token already in the completion by this (-2 .. 2)")
      ->capture_default_str()->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--stop", a->stop, "end a completion at this text (repeatable; not included)");
  cmd->add_flag("--json", a->json,
                "one JSON line per prompt: index, prompt, text, tokens, finish_reason");
  cmd->callback([&run, a] { run = [a] { return run_generate(*a); }; });
}

}  // namespace jumbo::cli
