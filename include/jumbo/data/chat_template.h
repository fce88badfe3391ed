#pragma once
// A chat template: how a conversation becomes the text a model was trained on. The same
// template formats fine-tuning conversations and, in `jumbo serve`, the messages of
// /v1/chat/completions, so a served model sees what it learned from. Two kinds:
//
// jumbo's TOML file:
//   system = "<|system|>\n{content}\n"         # optional: without it, no system messages
//   user = "<|user|>\n{content}\n"
//   assistant = "<|assistant|>\n{content}<|end|>\n"
//   generation_prompt = "<|assistant|>\n"       # what starts the reply to be generated
//   stop = ["<|end|>"]                          # where a generated reply ends
//
// a Hugging Face model's Jinja template (jinja.h): its tokenizer_config.json (`chat_template`,
// a string or a list of {name, template} of which "default" is taken; `bos_token`,
// `eos_token`), or a .jinja file (bos/eos from a tokenizer_config.json beside it, if any).
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jumbo {

namespace jinja {
class Template;
}

enum class ChatTemplateKind { jumbo_toml, jinja };

enum class ChatRole { system, user, assistant };

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
};

// OpenAI's role names: "system" (and "developer", its newer name), "user", "assistant".
std::optional<ChatRole> chat_role_of(std::string_view name);

struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::jumbo_toml;
  // jumbo_toml:
  std::optional<std::string> system;
  std::string user, assistant;
  std::string generation_prompt;
  std::vector<std::string> stop;  // both kinds: for jinja, the end-of-turn markers (below)
  // jinja: the template, and the special tokens it is rendered with (absent: undefined).
  std::shared_ptr<const jinja::Template> jinja_template;
  std::optional<std::string> bos_token, eos_token;

  std::string source;  // the file, for messages
  // What checkpoints and datasets store, parse_stored_chat_template's input: the TOML as read,
  // or for jinja a JSON object {"bos_token", "chat_template", "eos_token"} holding the
  // template's text as read.
  std::string text;

  bool has_role(ChatRole role) const {
    return kind == ChatTemplateKind::jinja || role != ChatRole::system || system.has_value();
  }
  // The conversation's text, then generation_prompt when `add_generation_prompt`. For jinja the
  // template renders {messages: [{role, content}], add_generation_prompt, bos_token, eos_token}
  // and may throw jinja::RaisedException (its raise_exception) or jinja::RenderError.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // A conversation as a fine-tuning example: the prompt is what a chat request of every
  // message but the last renders (with the generation prompt), the completion the last
  // message, an assistant's, as the template writes it after that generation prompt (its
  // content, then the end marker the model must learn to emit); for jinja, the whole
  // conversation rendered without the generation prompt, less that prompt (which must be its
  // prefix). "" or why it cannot be one.
  std::string training_example(const std::vector<ChatMessage>& messages, std::string& prompt,
                               std::string& completion) const;
};

// Throws UserError naming `where` and the key: not TOML, a missing or non-string key, a role
// format without exactly one "{content}".
ChatTemplate parse_chat_template(const std::string& toml_text, const std::string& where);
// A tokenizer_config.json's text (or any JSON object with `chat_template`): a jinja template.
// Throws UserError naming `where`: not JSON, no usable chat_template, a Jinja syntax error.
ChatTemplate parse_hf_chat_template(const std::string& json_text, const std::string& where);
// A .jinja file's text with the special tokens of a tokenizer_config.json (or none).
ChatTemplate make_jinja_chat_template(const std::string& jinja_text, std::optional<std::string> bos_token,
                                      std::optional<std::string> eos_token, const std::string& where);
// A template's stored `text`, either kind: JSON (starts with "{") is jinja, else TOML.
ChatTemplate parse_stored_chat_template(const std::string& text, const std::string& where);
// jumbo's TOML, a tokenizer_config.json (any .json) or a .jinja file.
ChatTemplate load_chat_template(const std::string& path);

}  // namespace jumbo
