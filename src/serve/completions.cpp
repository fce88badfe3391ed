#include "completions.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "jumbo/infer/completion_text.h"

namespace jumbo::serve {
namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

const std::vector<std::string>& completion_fields() {
  static const std::vector<std::string> fields = {
      "model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "top_k", "n",
      "best_of", "stop", "seed", "logprobs", "echo", "stream", "stream_options",
      "frequency_penalty", "presence_penalty", "logit_bias", "user", "ignore_eos"};
  return fields;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<int32_t> token_ids(const json& list, int64_t vocab) {
  std::vector<int32_t> ids;
  for (const json& t : list) {
    if (!t.is_number()) bad("prompt", fmt::format("token id {} is not an integer", quote(t)));
    const int64_t id = integer_of(t, "prompt");
    if (id < 0 || id >= vocab) bad("prompt", fmt::format("token id {} outside [0, {})", id, vocab));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// A string, a list of strings, a list of token ids, or a list of such lists. A text prompt
// starts a document (encode_prompt: the tokenizer's prompt prefix first); token ids are taken
// as given.
void read_prompts(const json& body, const ServedModel& model, const Tokenizer& tokenizer,
                  CompletionRequest& r) {
  const json* p = optional(body, "prompt");
  if (!p) bad("prompt", "is required (a string, a list of strings or of token ids)");
  const char* expected =
      "expected a string, a list of strings, a list of token ids or a list of lists of token ids";
  auto text = [&](const json& e) {
    const std::string& s = e.get_ref<const std::string&>();
    if (static_cast<int64_t>(s.size()) > model.max_prompt_bytes) {
      bad("prompt", fmt::format("a text of {} bytes cannot fit the model's context of {} "
                                "tokens (at most {} bytes)", s.size(),
                                model.shape.cache_positions, model.max_prompt_bytes));
    }
    size_t prefix = 0;
    r.prompts.push_back(encode_prompt(tokenizer, s, &prefix));
    r.shown_from.push_back(prefix);  // after the prefix that starts the document
  };
  auto ids = [&](const json& e) {
    r.prompts.push_back(token_ids(e, model.vocab));
    r.shown_from.push_back(0);
  };
  if (p->is_string()) return text(*p);
  if (!p->is_array()) bad("prompt", expected);
  if (p->empty()) bad("prompt", "is an empty list");
  // A list of token ids is one prompt; a list of strings or of lists is many, counted before
  // any is encoded.
  if (std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_number(); })) {
    return ids(*p);
  }
  const bool texts = std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_string(); });
  const bool lists = std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_array(); });
  if (!texts && !lists) bad("prompt", expected);
  if (static_cast<int64_t>(p->size()) > kMaxChoices) {
    bad("prompt", fmt::format("{} prompts, at most {} per request", p->size(), kMaxChoices));
  }
  for (const json& e : *p) texts ? text(e) : ids(e);
}

std::vector<std::string> stops_of(const json& body) {
  const json* s = optional(body, "stop");
  if (!s) return {};
  if (s->is_string()) return {s->get<std::string>()};
  if (!s->is_array() ||
      !std::all_of(s->begin(), s->end(), [](const json& e) { return e.is_string(); })) {
    bad("stop", fmt::format("expected a string or a list of strings, got {}", quote(*s)));
  }
  if (static_cast<int64_t>(s->size()) > kMaxStops) {
    bad("stop", fmt::format("{} strings, at most {}", s->size(), kMaxStops));
  }
  return s->get<std::vector<std::string>>();
}

// {"token id": bias}: OpenAI's keys are the ids as strings, biases -100 .. 100.
std::vector<std::pair<int32_t, float>> logit_bias_of(const json& body, int64_t vocab) {
  const json* b = optional(body, "logit_bias");
  if (!b) return {};
  if (!b->is_object()) bad("logit_bias", fmt::format("expected an object, got {}", quote(*b)));
  if (static_cast<int64_t>(b->size()) > kMaxLogitBias) {
    bad("logit_bias", fmt::format("{} tokens, at most {}", b->size(), kMaxLogitBias));
  }
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, value] : b->items()) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size() || id < 0 || id >= vocab) {
      bad("logit_bias", fmt::format("key {} is not a token id in [0, {})", quote(json(key)), vocab));
    }
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
      bad("logit_bias", fmt::format("the bias of token {} is {}, expected a number in -100 .. 100",
                                    id, quote(value)));
    }
    out.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int64_t CompletionRequest::prompt_tokens() const {
  int64_t total = 0;
  for (const auto& p : prompts) total += static_cast<int64_t>(p.size());
  return total;
}

ApiError model_not_found(const json& given, const ServedModel& model) {
  std::string served = fmt::format("\"{}\"", model.name);
  if (model.adapters) {
    for (const AdapterEntry& e : model.adapters->served()) served += fmt::format(", \"{}\"", e.name);
  }
  return ApiError(404, "model", fmt::format("The model {} does not exist; this server serves {}",
                                            quote(given), served),
                  "invalid_request_error", "model_not_found");
}

void parse_shared_fields(const json& body, const ServedModel& model,
                         const std::vector<std::string>& known, CompletionRequest& r) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      bad(key.size() > 64 ? key.substr(0, 64) + "..." : key,
          fmt::format("unknown field (this endpoint takes: {})", joined(known)));
    }
  }
  const json* m = optional(body, "model");
  if (!m) bad("model", fmt::format("is required: \"{}\"", model.name));
  if (!m->is_string()) bad("model", fmt::format("expected a string, got {}", quote(*m)));
  r.model = m->get<std::string>();
  if (r.model != model.name) {
    r.adapter = model.adapters ? model.adapters->acquire(r.model) : nullptr;
    if (!r.adapter) throw model_not_found(*m, model);
  }
  r.n = integer_in(body, "n", 1, 1, kMaxN);
  r.sampling.temperature = number_in(body, "temperature", 1.0, 0, 2);
  r.sampling.top_p = number_in(body, "top_p", 1.0, 0, 1);
  if (r.sampling.top_p <= 0) bad("top_p", "0 is not in (0, 1]");
  r.sampling.top_k = integer_in(body, "top_k", 0, 0, kNoLimit);
  r.sampling.frequency_penalty = number_in(body, "frequency_penalty", 0, -2, 2);
  r.sampling.presence_penalty = number_in(body, "presence_penalty", 0, -2, 2);
  r.sampling.logit_bias = logit_bias_of(body, model.vocab);
  r.stop = stops_of(body);
  if (const json* s = optional(body, "seed")) {
    if (!s->is_number_integer()) bad("seed", fmt::format("expected an integer, got {}", quote(*s)));
    r.sampling.seed = s->is_number_unsigned() ? s->get<uint64_t>()
                                              : static_cast<uint64_t>(s->get<int64_t>());
    r.seeded = true;
  }
  r.ignore_eos = bool_of(body, "ignore_eos", false);
  r.stream = bool_of(body, "stream", false);
  if (const json* o = optional(body, "stream_options")) {
    if (!r.stream) bad("stream_options", "is only allowed with \"stream\": true");
    if (!o->is_object()) bad("stream_options", fmt::format("expected an object, got {}", quote(*o)));
    for (const auto& [key, value] : o->items()) {
      if (key != "include_usage") {
        bad("stream_options", fmt::format("unknown field {} (takes include_usage)", quote(json(key))));
      }
    }
    r.include_usage = bool_of(*o, "include_usage", false);
  }
  if (const json* u = optional(body, "user"); u && !u->is_string()) {
    bad("user", fmt::format("expected a string, got {}", quote(*u)));
  }
}

void check_request_fits(CompletionRequest& r, const ServedModel& model) {
  if (r.sequences() > kMaxChoices) {
    const bool many_prompts = r.n == 1 && r.best_of == 1;
    bad(many_prompts ? "prompt" : (r.best_of > r.n ? "best_of" : "n"),
        fmt::format("{} prompts x {} {} = {} completions, at most {} per request", r.prompts.size(),
                    r.best_of > r.n ? "best_of" : "n", r.best_of, r.sequences(), kMaxChoices));
  }
  const int64_t context = model.shape.cache_positions;
  if (r.max_tokens >= context) {
    bad("max_tokens", fmt::format("{} does not fit the model's context of {} tokens with a "
                                  "prompt of at least one token", r.max_tokens, context));
  }
  // The engine's own rules (the context, ranges), with their field names.
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const GenerationRequest g = generation_request(r, static_cast<int64_t>(i) * r.best_of);
    const std::string problem = request_problem(g, model.shape, model.vocab);
    if (problem.empty()) continue;
    const std::string field = problem.substr(0, problem.find(':'));
    throw ApiError(400, field, r.prompts.size() == 1
                                   ? problem
                                   : fmt::format("{} (prompt {} of {})", problem, i + 1,
                                                 r.prompts.size()));
  }
}

CompletionRequest parse_completion_request(const std::string& body_text, const ServedModel& model,
                                           const Tokenizer& tokenizer) {
  const json body = parse_body(body_text);
  CompletionRequest r;
  parse_shared_fields(body, model, completion_fields(), r);
  if (const json* s = optional(body, "suffix")) {
    bad("suffix", fmt::format("{}: only null is supported (this model does not insert text)",
                              quote(*s)));
  }
  r.echo = bool_of(body, "echo", false);
  r.max_tokens = integer_in(body, "max_tokens", kDefaultMaxTokens, r.echo ? 0 : 1, kNoLimit);
  r.logprobs = optional(body, "logprobs") != nullptr;
  r.sampling.logprobs = integer_in(body, "logprobs", 0, 0, kMaxLogprobs);
  r.best_of = integer_in(body, "best_of", r.n, 1, kMaxN);
  if (r.best_of < r.n) bad("best_of", fmt::format("{} is less than n = {}", r.best_of, r.n));
  if (r.stream && r.best_of > r.n) {
    bad("best_of", fmt::format("{} > n = {} cannot be streamed: the best are known only at the "
                               "end", r.best_of, r.n));
  }
  read_prompts(body, model, tokenizer, r);
  check_request_fits(r, model);
  return r;
}

GenerationRequest generation_request(const CompletionRequest& r, int64_t sequence) {
  const size_t prompt = static_cast<size_t>(sequence / r.best_of);
  GenerationRequest g;
  g.prompt = r.prompts[prompt];
  g.max_new_tokens = std::max<int64_t>(r.max_tokens, 1);  // max_tokens 0: one, dropped
  g.sampling = r.sampling;
  g.stream = static_cast<uint64_t>(sequence % r.best_of);
  g.stop_at_eos = !r.ignore_eos;
  g.adapter = r.adapter ? r.adapter->slot() : -1;
  // The first echoed token has no logprob: the scores start at the one after it.
  if (r.echo && r.logprobs) g.score_prompt_from = static_cast<int64_t>(r.shown_from[prompt]) + 1;
  return g;
}

ChoiceOptions choice_options(const CompletionRequest& r, int64_t sequence) {
  const size_t prompt = static_cast<size_t>(sequence / r.best_of);
  ChoiceOptions o;
  o.stops = r.stop;
  o.prompt = r.prompts[prompt];
  o.logprobs = r.logprobs;
  o.echo = r.echo;
  o.echo_from = r.shown_from[prompt];
  o.max_tokens = r.max_tokens;
  return o;
}

std::vector<size_t> returned_choices(const CompletionRequest& r,
                                     const std::vector<ChoiceState>& sequences) {
  std::vector<size_t> out;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    std::vector<size_t> candidates(static_cast<size_t>(r.best_of));
    std::iota(candidates.begin(), candidates.end(), p * static_cast<size_t>(r.best_of));
    if (r.best_of > r.n) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
        return sequences[a].mean_logprob() > sequences[b].mean_logprob();
      });
    }
    out.insert(out.end(), candidates.begin(), candidates.begin() + r.n);
  }
  return out;
}

namespace {

json logprobs_json(const std::vector<TokenEntry>& entries) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenEntry& e : entries) {
    tokens.push_back(e.text);
    token_logprobs.push_back(e.logprob ? json(*e.logprob) : json(nullptr));
    if (e.logprob) {
      json alternatives = json::object();
      for (const auto& [text, lp] : e.top) alternatives[text] = lp;
      top.push_back(std::move(alternatives));
    } else {
      top.push_back(nullptr);
    }
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
          {"text_offset", offsets}};
}

}  // namespace

json usage_json(const CompletionRequest& r, const std::vector<ChoiceState>& sequences) {
  int64_t completion_tokens = 0;
  for (const ChoiceState& c : sequences) completion_tokens += c.completion_tokens();
  const int64_t prompt_tokens = r.prompt_tokens();
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json response_json(const ResponseHead& head, const CompletionRequest& r,
                   const std::vector<ChoiceState>& sequences,
                   const std::function<json(const ChoiceState&)>& content) {
  json list = json::array();
  int64_t index = 0;
  for (size_t i : returned_choices(r, sequences)) {
    const ChoiceState& c = sequences[i];
    json choice = content(c);
    choice["index"] = index++;
    choice["finish_reason"] = c.finished() ? json(to_string(c.finish_reason())) : json(nullptr);
    list.push_back(std::move(choice));
  }
  return {{"id", head.id},
          {"object", r.endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
          {"created", head.created},
          {"model", head.model},
          {"choices", std::move(list)},
          {"usage", usage_json(r, sequences)}};
}

json completion_response(const ResponseHead& head, const std::vector<ChoiceState>& sequences,
                         const CompletionRequest& r) {
  return response_json(head, r, sequences, [&](const ChoiceState& c) -> json {
    return {{"text", c.text()},
            {"logprobs", r.logprobs ? logprobs_json(c.entries(0, c.entries())) : json(nullptr)}};
  });
}

json completion_chunk_choice(ChoiceState& choice, int64_t index, bool logprobs) {
  const std::optional<ChoiceState::Delta> d = choice.take_delta();
  if (!d) return nullptr;
  return {{"index", index},
          {"text", d->text},
          {"logprobs", logprobs ? logprobs_json(choice.entries(d->from, d->to)) : json(nullptr)},
          {"finish_reason", d->finishing ? json(to_string(choice.finish_reason())) : json(nullptr)}};
}

namespace {

json chunk_json(const ResponseHead& head, const CompletionRequest& r, json choices) {
  return {{"id", head.id},
          {"object", r.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
          {"created", head.created},
          {"model", head.model},
          {"choices", std::move(choices)}};
}

}  // namespace

std::string stream_event(const ResponseHead& head, const CompletionRequest& r, json choices) {
  json chunk = chunk_json(head, r, std::move(choices));
  if (r.include_usage) chunk["usage"] = nullptr;
  return "data: " + dump(chunk) + "\n\n";
}

std::string usage_event(const ResponseHead& head, const CompletionRequest& r,
                        const std::vector<ChoiceState>& sequences) {
  json chunk = chunk_json(head, r, json::array());
  chunk["usage"] = usage_json(r, sequences);
  return "data: " + dump(chunk) + "\n\n";
}

}  // namespace jumbo::serve
