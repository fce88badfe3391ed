// `jumbo data render-chat`: conversations through a chat template (jumbo's TOML, a
// tokenizer_config.json's Jinja chat_template, or a .jinja file), one JSON line each, to check
// the formatting a model will be fine-tuned on and served with.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/data/chat_template.h"
#include "jumbo/data/jinja.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

struct RenderChatArgs {
  std::string chat_template;
  std::string input;
  bool add_generation_prompt = false;
};

std::vector<ChatMessage> messages_of_line(const std::string& line, const std::string& where) {
  nlohmann::json obj;
  try {
    obj = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError(fmt::format("{}: not JSON: {}", where, e.what()));
  }
  const auto m = obj.is_object() ? obj.find("messages") : obj.end();
  if (!obj.is_object() || m == obj.end() || !m->is_array()) {
    throw UserError(fmt::format("{}: expected {{\"messages\": [{{\"role\", \"content\"}}, ...]}}", where));
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const nlohmann::json& msg = (*m)[i];
    const auto role = msg.is_object() && msg.contains("role") && msg["role"].is_string()
                          ? chat_role_of(msg["role"].get<std::string>())
                          : std::nullopt;
    if (!role) {
      throw UserError(fmt::format("{}: messages[{}].role: expected \"system\", \"developer\", \"user\" "
                                  "or \"assistant\"", where, i));
    }
    if (!msg.contains("content") || !msg["content"].is_string()) {
      throw UserError(fmt::format("{}: messages[{}].content: expected a string", where, i));
    }
    out.push_back({*role, msg["content"].get<std::string>()});
  }
  return out;
}

int run_render_chat(const RenderChatArgs& a) {
  const ChatTemplate tmpl = load_chat_template(a.chat_template);
  std::ifstream file;
  if (a.input != "-") {
    file.open(a.input);
    if (!file) throw UserError(fmt::format("jumbo data render-chat --input {}: cannot open the file", a.input));
  }
  std::istream& in = a.input == "-" ? std::cin : file;
  std::string line;
  int64_t n = 0, refused = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<ChatMessage> messages = messages_of_line(line, fmt::format("{}:{}", a.input, n));
    nlohmann::json out;
    try {
      out["text"] = tmpl.render(messages, a.add_generation_prompt);
    } catch (const jinja::RaisedException& e) {
      out["error"] = e.what();  // the template's own message (raise_exception)
      ++refused;
    } catch (const jinja::RenderError& e) {
      out["error"] = fmt::format("the chat template {} failed: {}", tmpl.source, e.what());
      ++refused;
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  if (refused > 0) {
    fmt::print(stderr, "jumbo data render-chat: the chat template {} refused {} of the conversations "
                       "(their lines: {{\"error\": ...}})\n", tmpl.source, refused);
    return 1;
  }
  return 0;
}

}  // namespace

void add_chat_template_verbs(CLI::App& data, VerbRunner& run) {
  auto a = std::make_shared<RenderChatArgs>();
  CLI::App* cmd = data.add_subcommand(
      "render-chat", "conversations ({\"messages\": [...]} lines) through a chat template: one "
                     "{\"text\": ...} line each ({\"error\": ...} where the template refuses one)");
  cmd->add_option("--chat-template", a->chat_template,
                  "jumbo's TOML, a Hugging Face tokenizer_config.json, or a .jinja file (bos/eos "
                  "from a tokenizer_config.json beside it)")
      ->required();
  cmd->add_option("-i,--input", a->input, ".jsonl of {\"messages\": [{\"role\", \"content\"}, ...]} "
                                          "(- = standard input)")
      ->required();
  cmd->add_flag("--add-generation-prompt", a->add_generation_prompt,
                "end each with what starts the assistant's reply (as a chat request renders)");
  cmd->callback([&run, a] { run = [a] { return run_render_chat(*a); }; });
}

}  // namespace jumbo::cli
