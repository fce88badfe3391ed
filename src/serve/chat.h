#pragma once
// OpenAI's chat completions API as data: a /v1/chat/completions body becomes one prompt
// through the model's chat template (data/chat_template.h), with the template's stop strings;
// the rest is the completions machinery (completions.h). Responses in the chat shapes.
#include <string>
#include <vector>

#include "completions.h"

namespace jumbo::serve {

// Throws ApiError as parse_completion_request does; 400 naming `messages` when the model has
// no chat template.
CompletionRequest parse_chat_request(const std::string& body, const ServedModel& model,
                                     const Tokenizer& tokenizer);

// The text a body's "messages" become through the model's template (generation prompt
// added), for /v1/chat/completions and /tokenize. 400 naming `messages` without a template,
// and when a Jinja template refuses the conversation (its raise_exception's message) or fails.
std::string chat_prompt_text(const json& body, const ServedModel& model);

json chat_response(const ResponseHead& head, const std::vector<ChoiceState>& sequences,
                   const CompletionRequest& request);
// The choice's part of a chat stream chunk ({"index", "delta", "logprobs", "finish_reason"}),
// or null when it has nothing new. `first`: the choice's first chunk, which names the role.
json chat_chunk_choice(ChoiceState& choice, int64_t index, bool logprobs, bool first);

}  // namespace jumbo::serve
