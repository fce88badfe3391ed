#pragma once
// A chat template: how a conversation becomes the text a model was trained on. The same
// template formats fine-tuning conversations and, in `jumbo serve`, the messages of
// /v1/chat/completions, so a served model sees what it learned from. A TOML file:
//
//   system = "<|system|>\n{content}\n"         # optional: without it, no system messages
//   user = "<|user|>\n{content}\n"
//   assistant = "<|assistant|>\n{content}<|end|>\n"
//   generation_prompt = "<|assistant|>\n"       # what starts the reply to be generated
//   stop = ["<|end|>"]                          # where a generated reply ends
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jumbo {

enum class ChatRole { system, user, assistant };

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
};

// OpenAI's role names: "system" (and "developer", its newer name), "user", "assistant".
std::optional<ChatRole> chat_role_of(std::string_view name);

struct ChatTemplate {
  std::optional<std::string> system;
  std::string user, assistant;
  std::string generation_prompt;
  std::vector<std::string> stop;
  std::string source;  // the file, for messages
  std::string text;    // the TOML as read (stored in checkpoints)

  bool has_role(ChatRole role) const { return role != ChatRole::system || system.has_value(); }
  // The conversation's text, then generation_prompt when `add_generation_prompt`.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // A conversation as a fine-tuning example: the prompt is what a chat request of every
  // message but the last renders (with the generation prompt), the completion the last
  // message, an assistant's, as the template writes it after that generation prompt (its
  // content, then the end marker the model must learn to emit). "" or why it cannot be one.
  std::string training_example(const std::vector<ChatMessage>& messages, std::string& prompt,
                               std::string& completion) const;
};

// Throws UserError naming `where` and the key: not TOML, a missing or non-string key, a role
// format without exactly one "{content}".
ChatTemplate parse_chat_template(const std::string& toml_text, const std::string& where);
ChatTemplate load_chat_template(const std::string& path);

}  // namespace jumbo
