#include "jumbo/data/chat_template.h"

#include <fmt/format.h>

#include <toml++/toml.h>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

constexpr std::string_view kContent = "{content}";

std::string role_format(const toml::table& t, const char* key, const std::string& where) {
  const toml::node* node = t.get(key);
  if (!node) throw UserError(fmt::format("{}: {}: missing (a string with {{content}})", where, key));
  const auto* s = node->as_string();
  if (!s) throw UserError(fmt::format("{}: {}: expected a string", where, key));
  const std::string& f = s->get();
  const size_t at = f.find(kContent);
  if (at == std::string::npos || f.find(kContent, at + 1) != std::string::npos) {
    throw UserError(fmt::format("{}: {}: {:?} must hold {{content}} exactly once", where, key, f));
  }
  return f;
}

std::string fill(const std::string& format, const std::string& content) {
  const size_t at = format.find(kContent);
  return format.substr(0, at) + content + format.substr(at + kContent.size());
}

}  // namespace

// chat_template_hf.cpp: the jinja kind.
std::string render_jinja_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt);
std::string jinja_training_example(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                                   std::string& prompt, std::string& completion);

std::optional<ChatRole> chat_role_of(std::string_view name) {
  if (name == "system" || name == "developer") return ChatRole::system;
  if (name == "user") return ChatRole::user;
  if (name == "assistant") return ChatRole::assistant;
  return std::nullopt;
}

std::string ChatTemplate::training_example(const std::vector<ChatMessage>& messages,
                                           std::string& prompt, std::string& completion) const {
  if (messages.size() < 2 || messages.back().role != ChatRole::assistant) {
    return "expected messages ending with an assistant's reply after at least one other message";
  }
  for (const ChatMessage& m : messages) {
    if (!has_role(m.role)) return fmt::format("the chat template {} has no system role", source);
  }
  if (messages.back().content.empty()) return "the last assistant message is empty";
  if (kind == ChatTemplateKind::jinja) return jinja_training_example(*this, messages, prompt, completion);
  const std::string reply = fill(assistant, messages.back().content);
  if (!reply.starts_with(generation_prompt)) {
    return fmt::format("the chat template {}: its assistant format does not start with its "
                       "generation_prompt, so a reply's tokens cannot be told from the prompt's",
                       source);
  }
  prompt = render({messages.begin(), messages.end() - 1}, true);
  completion = reply.substr(generation_prompt.size());
  return "";
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  if (kind == ChatTemplateKind::jinja) return render_jinja_chat(*this, messages, add_generation_prompt);
  std::string out;
  for (const ChatMessage& m : messages) {
    switch (m.role) {
      case ChatRole::system: out += fill(system.value_or(user), m.content); break;
      case ChatRole::user: out += fill(user, m.content); break;
      case ChatRole::assistant: out += fill(assistant, m.content); break;
    }
  }
  if (add_generation_prompt) out += generation_prompt;
  return out;
}

ChatTemplate parse_chat_template(const std::string& toml_text, const std::string& where) {
  toml::table t;
  try {
    t = toml::parse(toml_text, where);
  } catch (const toml::parse_error& e) {
    throw UserError(fmt::format("{}:{}: {}", where, e.source().begin.line, e.description()));
  }
  for (const auto& [key, value] : t) {
    const std::string_view k = key.str();
    if (k != "system" && k != "user" && k != "assistant" && k != "generation_prompt" && k != "stop") {
      throw UserError(fmt::format("{}: {}: unknown key (expected system, user, assistant, "
                                  "generation_prompt, stop)", where, k));
    }
  }
  ChatTemplate c;
  c.source = where;
  c.text = toml_text;
  if (t.contains("system")) c.system = role_format(t, "system", where);
  c.user = role_format(t, "user", where);
  c.assistant = role_format(t, "assistant", where);
  if (const toml::node* g = t.get("generation_prompt")) {
    if (!g->as_string()) throw UserError(fmt::format("{}: generation_prompt: expected a string", where));
    c.generation_prompt = g->as_string()->get();
  }
  if (const toml::node* s = t.get("stop")) {
    const auto* list = s->as_array();
    if (!list) throw UserError(fmt::format("{}: stop: expected a list of strings", where));
    for (const toml::node& e : *list) {
      if (!e.as_string() || e.as_string()->get().empty()) {
        throw UserError(fmt::format("{}: stop: expected a list of non-empty strings", where));
      }
      c.stop.push_back(e.as_string()->get());
    }
  }
  return c;
}

}  // namespace jumbo
