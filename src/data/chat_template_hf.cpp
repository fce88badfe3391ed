// Chat templates as Hugging Face models ship them: tokenizer_config.json's Jinja `chat_template`
// (or a .jinja file), rendered by jumbo's Jinja interpreter (jinja.h) as transformers renders it.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "jumbo/config/config.h"
#include "jumbo/data/chat_template.h"
#include "jumbo/data/jinja.h"

namespace jumbo {
namespace {

using ordered_json = nlohmann::ordered_json;

const char* role_name(ChatRole r) {
  switch (r) {
    case ChatRole::system: return "system";
    case ChatRole::user: return "user";
    case ChatRole::assistant: return "assistant";
  }
  return "user";
}

// A special token as tokenizer_config.json writes it: a string, {"content": ...} or null.
std::optional<std::string> special_token(const ordered_json& config, const char* key, const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  throw UserError(fmt::format("{}: {}: expected a string, {{\"content\": STRING}} or null", where, key));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("chat template {}: cannot open the file", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

ChatTemplate make_jinja_chat_template(const std::string& jinja_text, std::optional<std::string> bos_token,
                                      std::optional<std::string> eos_token, const std::string& where) {
  ChatTemplate c;
  c.kind = ChatTemplateKind::jinja;
  c.source = where;
  c.jinja_template = std::make_shared<const jinja::Template>(jinja_text, where);
  c.bos_token = std::move(bos_token);
  c.eos_token = std::move(eos_token);
  // The end-of-turn markers: the eos token, and those of the common template families.
  if (c.eos_token && !c.eos_token->empty()) c.stop.push_back(*c.eos_token);
  for (const char* marker : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"}) {
    if (jinja_text.find(marker) != std::string::npos &&
        std::find(c.stop.begin(), c.stop.end(), marker) == c.stop.end()) {
      c.stop.push_back(marker);
    }
  }
  ordered_json stored = ordered_json::object();
  stored["bos_token"] = c.bos_token ? ordered_json(*c.bos_token) : ordered_json(nullptr);
  stored["chat_template"] = jinja_text;
  stored["eos_token"] = c.eos_token ? ordered_json(*c.eos_token) : ordered_json(nullptr);
  c.text = stored.dump(1, ' ', false, ordered_json::error_handler_t::replace);
  return c;
}

ChatTemplate parse_hf_chat_template(const std::string& json_text, const std::string& where) {
  ordered_json config;
  try {
    config = ordered_json::parse(json_text);
  } catch (const ordered_json::parse_error& e) {
    throw UserError(fmt::format("{}: not JSON: {}", where, e.what()));
  }
  if (!config.is_object()) throw UserError(fmt::format("{}: expected a JSON object (a tokenizer_config.json)", where));
  const auto t = config.find("chat_template");
  if (t == config.end() || t->is_null()) {
    throw UserError(fmt::format("{}: no chat_template (a base model's tokenizer_config.json has none: "
                                "use the instruct model's, or a jumbo TOML template)", where));
  }
  std::string text;
  if (t->is_string()) {
    text = t->get<std::string>();
  } else if (t->is_array()) {
    std::string names;
    for (const ordered_json& e : *t) {
      const bool ok = e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") &&
                      e["template"].is_string();
      if (!ok) throw UserError(fmt::format("{}: chat_template: expected a string or a list of {{\"name\", \"template\"}}", where));
      names += fmt::format("{}{}", names.empty() ? "" : ", ", e["name"].get<std::string>());
      if (e["name"] == "default") text = e["template"].get<std::string>();
    }
    if (text.empty()) throw UserError(fmt::format("{}: chat_template: no template named \"default\" (has {})", where, names));
  } else {
    throw UserError(fmt::format("{}: chat_template: expected a string or a list of {{\"name\", \"template\"}}", where));
  }
  return make_jinja_chat_template(text, special_token(config, "bos_token", where),
                                  special_token(config, "eos_token", where), where);
}

ChatTemplate parse_stored_chat_template(const std::string& text, const std::string& where) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') return parse_hf_chat_template(text, where);
  return parse_chat_template(text, where);
}

ChatTemplate load_chat_template(const std::string& path) {
  const std::string text = read_file(path);
  const std::filesystem::path p(path);
  if (p.extension() == ".jinja" || p.extension() == ".j2") {
    std::optional<std::string> bos, eos;
    const std::filesystem::path beside = p.parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(beside)) {
      ordered_json config;
      try {
        config = ordered_json::parse(read_file(beside.string()));
      } catch (const ordered_json::parse_error& e) {
        throw UserError(fmt::format("{} (beside chat template {}): not JSON: {}", beside.string(), path, e.what()));
      }
      bos = special_token(config, "bos_token", beside.string());
      eos = special_token(config, "eos_token", beside.string());
    }
    return make_jinja_chat_template(text, bos, eos, path);
  }
  if (p.extension() == ".json") return parse_hf_chat_template(text, path);
  return parse_stored_chat_template(text, path);
}

std::string render_jinja_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt) {
  ordered_json vars = ordered_json::object();
  ordered_json list = ordered_json::array();
  for (const ChatMessage& m : messages) {
    list.push_back(ordered_json{{"role", role_name(m.role)}, {"content", m.content}});
  }
  vars["messages"] = std::move(list);
  vars["add_generation_prompt"] = add_generation_prompt;
  if (t.bos_token) vars["bos_token"] = *t.bos_token;
  if (t.eos_token) vars["eos_token"] = *t.eos_token;
  return t.jinja_template->render(vars);
}

std::string jinja_training_example(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                                   std::string& prompt, std::string& completion) {
  std::string whole;
  try {
    prompt = render_jinja_chat(t, {messages.begin(), messages.end() - 1}, true);
    whole = render_jinja_chat(t, messages, false);
  } catch (const jinja::RaisedException& e) {
    return fmt::format("the chat template {} refuses the conversation: {}", t.source, e.what());
  } catch (const jinja::RenderError& e) {
    return fmt::format("the chat template {} failed: {}", t.source, e.what());
  }
  if (!whole.starts_with(prompt)) {
    return fmt::format("the chat template {} renders the conversation without starting with its "
                       "prompt (every message but the last, with the generation prompt), so the "
                       "reply cannot be told from the prompt", t.source);
  }
  completion = whole.substr(prompt.size());
  return "";
}

}  // namespace jumbo
