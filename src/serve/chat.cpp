#include "chat.h"

#include <fmt/format.h>

#include "jumbo/data/jinja.h"
#include "jumbo/infer/completion_text.h"

namespace jumbo::serve {
namespace {

const std::vector<std::string>& chat_fields() {
  static const std::vector<std::string> fields = {
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
      "top_k", "n", "stop", "seed", "logprobs", "top_logprobs", "stream", "stream_options",
      "frequency_penalty", "presence_penalty", "logit_bias", "user", "ignore_eos"};
  return fields;
}

ChatRole role_of(const json& message, size_t i) {
  const std::string field = fmt::format("messages[{}].role", i);
  const json* r = optional(message, "role");
  if (!r || !r->is_string()) bad(field, "expected \"system\", \"user\" or \"assistant\"");
  if (const auto role = chat_role_of(r->get_ref<const std::string&>())) return *role;
  bad(field, fmt::format("{} is not served (expected system, user or assistant)", quote(*r)));
}

// A string, or OpenAI's list of content parts of which only text parts are served.
std::string content_of(const json& message, size_t i) {
  const std::string field = fmt::format("messages[{}].content", i);
  const json* c = optional(message, "content");
  if (!c) bad(field, "is required (a string or a list of text parts)");
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad(field, fmt::format("expected a string or a list of parts, got {}", quote(*c)));
  std::string text;
  for (size_t k = 0; k < c->size(); ++k) {
    const json& part = (*c)[k];
    const json* type = part.is_object() ? optional(part, "type") : nullptr;
    const json* t = part.is_object() ? optional(part, "text") : nullptr;
    if (!type || *type != "text" || !t || !t->is_string()) {
      bad(fmt::format("{}[{}]", field, k), "expected {\"type\": \"text\", \"text\": STRING} "
                                           "(only text parts are served)");
    }
    text += t->get<std::string>();
  }
  return text;
}

std::vector<ChatMessage> messages_of(const json& body, const ChatTemplate& tmpl) {
  const json* m = optional(body, "messages");
  if (!m || !m->is_array() || m->empty()) {
    bad("messages", "is required: a non-empty list of {\"role\", \"content\"}");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& message = (*m)[i];
    if (!message.is_object()) bad(fmt::format("messages[{}]", i), fmt::format("expected an object, got {}", quote(message)));
    for (const auto& [key, value] : message.items()) {
      if (key != "role" && key != "content" && key != "name") {
        bad(fmt::format("messages[{}].{}", i, key.substr(0, 64)), "unknown field (takes role, content, name)");
      }
    }
    ChatMessage msg{role_of(message, i), content_of(message, i)};
    if (!tmpl.has_role(msg.role)) {
      bad(fmt::format("messages[{}].role", i), fmt::format("this model's chat template ({}) has no "
                                                           "system role", tmpl.source));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

json chat_logprobs_json(const std::vector<TokenEntry>& entries) {
  json content = json::array();
  for (const TokenEntry& e : entries) {
    json top = json::array();
    for (const auto& [text, lp] : e.top) {
      top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytes_of(text)}});
    }
    content.push_back({{"token", e.text},
                       {"logprob", e.logprob.value_or(0.0f)},
                       {"bytes", bytes_of(e.text)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

}  // namespace

std::string chat_prompt_text(const json& body, const ServedModel& model) {
  if (!model.chat_template) {
    bad("messages", fmt::format("model \"{}\" has no chat template (a base model): use "
                                "/v1/completions, or serve it with --chat-template FILE",
                                model.name));
  }
  const ChatTemplate& tmpl = *model.chat_template;
  std::string text;
  try {
    text = tmpl.render(messages_of(body, tmpl), true);
  } catch (const jinja::RaisedException& e) {
    bad("messages", e.what());  // the template refuses the conversation, in its own words
  } catch (const jinja::RenderError& e) {
    bad("messages", fmt::format("this model's chat template ({}) cannot render the conversation: {}",
                                tmpl.source, e.what()));
  }
  if (static_cast<int64_t>(text.size()) > model.max_prompt_bytes) {
    bad("messages", fmt::format("the conversation's {} bytes cannot fit the model's context of {} "
                                "tokens (at most {} bytes)", text.size(),
                                model.shape.cache_positions, model.max_prompt_bytes));
  }
  return text;
}

CompletionRequest parse_chat_request(const std::string& body_text, const ServedModel& model,
                                     const Tokenizer& tokenizer) {
  const json body = parse_body(body_text);
  CompletionRequest r;
  r.endpoint = Endpoint::chat;
  parse_shared_fields(body, model, chat_fields(), r);
  const std::string text = chat_prompt_text(body, model);
  const int64_t limit = 1 << 30;
  const char* max_field = optional(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.max_tokens = integer_in(body, max_field, kDefaultMaxTokens, 1, limit);
  r.logprobs = bool_of(body, "logprobs", false);
  r.sampling.logprobs = integer_in(body, "top_logprobs", 0, 0, kMaxTopLogprobs);
  if (r.sampling.logprobs > 0 && !r.logprobs) bad("top_logprobs", "needs \"logprobs\": true");
  r.best_of = r.n;
  size_t prefix = 0;
  r.prompts.push_back(encode_prompt(tokenizer, text, &prefix));
  r.shown_from.push_back(prefix);
  const std::vector<std::string>& template_stops = model.chat_template->stop;
  r.stop.insert(r.stop.begin(), template_stops.begin(), template_stops.end());
  check_request_fits(r, model);
  return r;
}

json chat_response(const ResponseHead& head, const std::vector<ChoiceState>& sequences,
                   const CompletionRequest& r) {
  return response_json(head, r, sequences, [&](const ChoiceState& c) -> json {
    return {{"message", {{"role", "assistant"}, {"content", c.text()}}},
            {"logprobs", r.logprobs ? chat_logprobs_json(c.entries(0, c.entries())) : json(nullptr)}};
  });
}

json chat_chunk_choice(ChoiceState& choice, int64_t index, bool logprobs, bool first) {
  const std::optional<ChoiceState::Delta> d = choice.take_delta();
  if (!d && !first) return nullptr;
  json delta = json::object();
  if (first) {
    delta["role"] = "assistant";
    delta["content"] = d ? d->text : std::string();
  } else if (!d->text.empty()) {
    delta["content"] = d->text;
  }
  const bool entries = d && d->to > d->from;
  return {{"index", index},
          {"delta", std::move(delta)},
          {"logprobs", logprobs && entries ? chat_logprobs_json(choice.entries(d->from, d->to))
                                           : json(nullptr)},
          {"finish_reason", d && d->finishing ? json(to_string(choice.finish_reason()))
                                              : json(nullptr)}};
}

}  // namespace jumbo::serve
