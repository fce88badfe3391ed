#include "openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

namespace jumbo::serve {
namespace {

const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields = {"model", "prompt", "max_tokens", "temperature",
                                               "top_p", "top_k", "n", "stop", "seed",
                                               "logprobs", "stream", "echo", "user"};
  return fields;
}

[[noreturn]] void bad(const std::string& field, const std::string& message) {
  throw ApiError(400, field, field + ": " + message);
}

// The field's value; nullptr when absent or null (null means the default, as in OpenAI).
const json* optional(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// An integer (not a float, not a bool); a huge unsigned value saturates.
int64_t integer_of(const json& v, const char* name) {
  if (!v.is_number_integer()) bad(name, fmt::format("expected an integer, got {}", v.dump()));
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(u);
  }
  return v.get<int64_t>();
}

int64_t integer_in(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = optional(body, name);
  if (!v) return fallback;
  const int64_t x = integer_of(*v, name);
  if (x < lo || x > hi) {
    bad(name, hi == std::numeric_limits<int64_t>::max()
                  ? fmt::format("{} is not >= {}", x, lo)
                  : fmt::format("{} is not in {} .. {}", x, lo, hi));
  }
  return x;
}

double number_of(const json& body, const char* name, double fallback) {
  const json* v = optional(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, fmt::format("expected a number, got {}", v->dump()));
  return v->get<double>();
}

bool bool_of(const json& body, const char* name, bool fallback) {
  const json* v = optional(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, fmt::format("expected true or false, got {}", v->dump()));
  return v->get<bool>();
}

std::vector<int32_t> token_ids(const json& list, int64_t vocab) {
  std::vector<int32_t> ids;
  for (const json& t : list) {
    if (!t.is_number_integer()) bad("prompt", fmt::format("token id {} is not an integer", t.dump()));
    const int64_t id = integer_of(t, "prompt");
    if (id < 0 || id >= vocab) bad("prompt", fmt::format("token id {} outside [0, {})", id, vocab));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// A string, a list of strings, a list of token ids, or a list of such lists. A text prompt
// starts a document (encode_prompt: EOS first); token ids are taken as given.
std::vector<std::vector<int32_t>> prompts_of(const json& body, const Tokenizer& tokenizer,
                                             int64_t vocab) {
  const json* p = optional(body, "prompt");
  if (!p) bad("prompt", "is required (a string, a list of strings or of token ids)");
  if (p->is_string()) return {encode_prompt(tokenizer, p->get<std::string>())};
  const char* expected =
      "expected a string, a list of strings, a list of token ids or a list of lists of token ids";
  if (!p->is_array()) bad("prompt", expected);
  if (p->empty()) bad("prompt", "is an empty list");
  std::vector<std::vector<int32_t>> out;
  if (std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_string(); })) {
    for (const json& e : *p) out.push_back(encode_prompt(tokenizer, e.get<std::string>()));
  } else if (std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_number(); })) {
    out.push_back(token_ids(*p, vocab));
  } else if (std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_array(); })) {
    for (const json& e : *p) out.push_back(token_ids(e, vocab));
  } else {
    bad("prompt", expected);
  }
  return out;
}

std::vector<std::string> stops_of(const json& body) {
  const json* s = optional(body, "stop");
  if (!s) return {};
  if (s->is_string()) return {s->get<std::string>()};
  if (!s->is_array() ||
      !std::all_of(s->begin(), s->end(), [](const json& e) { return e.is_string(); })) {
    bad("stop", "expected a string or a list of strings");
  }
  if (static_cast<int64_t>(s->size()) > kMaxStops) {
    bad("stop", fmt::format("{} strings, at most {}", s->size(), kMaxStops));
  }
  return s->get<std::vector<std::string>>();
}

// How a token reads in logprobs: its piece with "▁" as a space ("▁of▁the" -> " of the");
// byte pieces stay as stored ("<0x0A>"), so every key is a distinct token.
std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  std::string piece = tokenizer.piece(id);
  static const std::string kSpaceMark = "\xE2\x96\x81";
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      out += ' ';
      i += kSpaceMark.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body_text, const ServedModel& model,
                                           const Tokenizer& tokenizer) {
  json body = json::parse(body_text, nullptr, false);
  if (body.is_discarded()) {
    throw ApiError(400, "", "the request body is not valid JSON");
  }
  if (!body.is_object()) throw ApiError(400, "", "the request body is not a JSON object");
  for (const auto& [key, value] : body.items()) {
    if (!known_fields().contains(key)) {
      bad(key, "unknown field (jumbo serves: model, prompt, max_tokens, temperature, top_p, "
               "top_k, n, stop, seed, logprobs, stream, echo, user)");
    }
  }
  const json* m = optional(body, "model");
  if (!m) bad("model", fmt::format("is required: \"{}\"", model.name));
  if (!m->is_string() || m->get<std::string>() != model.name) {
    bad("model", fmt::format("{} is not served here; this server serves \"{}\"", m->dump(),
                             model.name));
  }
  CompletionRequest r;
  r.prompts = prompts_of(body, tokenizer, model.vocab);
  r.n = integer_in(body, "n", 1, 1, kMaxN);
  if (r.choices() > kMaxChoices) {
    bad("n", fmt::format("{} prompts x n {} = {} completions, at most {} per request",
                         r.prompts.size(), r.n, r.choices(), kMaxChoices));
  }
  const int64_t context = model.shape.cache_positions;
  r.max_tokens = integer_in(body, "max_tokens", kDefaultMaxTokens, 1,
                            std::numeric_limits<int64_t>::max());
  if (r.max_tokens >= context) {
    bad("max_tokens", fmt::format("{} does not fit the model's context of {} tokens with a "
                                  "prompt of at least one token", r.max_tokens, context));
  }
  r.sampling.temperature = number_of(body, "temperature", 1.0);
  if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2)) {
    bad("temperature", fmt::format("{} is not in 0 .. 2", r.sampling.temperature));
  }
  r.sampling.top_p = number_of(body, "top_p", 1.0);
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) {
    bad("top_p", fmt::format("{} is not in (0, 1]", r.sampling.top_p));
  }
  r.sampling.top_k = integer_in(body, "top_k", 0, 0, std::numeric_limits<int64_t>::max());
  r.stop = stops_of(body);
  if (const json* s = optional(body, "seed")) {
    if (!s->is_number_integer()) bad("seed", fmt::format("expected an integer, got {}", s->dump()));
    r.sampling.seed = s->is_number_unsigned() ? s->get<uint64_t>()
                                              : static_cast<uint64_t>(s->get<int64_t>());
    r.seeded = true;
  }
  r.logprobs = optional(body, "logprobs") != nullptr;
  r.sampling.logprobs = integer_in(body, "logprobs", 0, 0, kMaxLogprobs);
  r.stream = bool_of(body, "stream", false);
  if (bool_of(body, "echo", false)) bad("echo", "only false is supported");
  if (const json* u = optional(body, "user"); u && !u->is_string()) {
    bad("user", "expected a string");
  }
  // The engine's own rules (the context, ranges), with their field names.
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    GenerationRequest g = generation_request(r, static_cast<int64_t>(i * r.n));
    const std::string problem = request_problem(g, model.shape, model.vocab);
    if (problem.empty()) continue;
    const std::string field = problem.substr(0, problem.find(':'));
    throw ApiError(400, field, r.prompts.size() == 1
                                   ? problem
                                   : fmt::format("{} (prompt {} of {})", problem, i + 1,
                                                 r.prompts.size()));
  }
  return r;
}

GenerationRequest generation_request(const CompletionRequest& r, int64_t choice) {
  GenerationRequest g;
  g.prompt = r.prompts[static_cast<size_t>(choice / r.n)];
  g.max_new_tokens = r.max_tokens;
  g.sampling = r.sampling;
  g.stream = static_cast<uint64_t>(choice % r.n);
  return g;
}

ChoiceState::ChoiceState(const Tokenizer& tokenizer, const std::vector<std::string>& stops,
                         bool logprobs)
    : tokenizer_(tokenizer), text_(tokenizer, stops), logprobs_(logprobs) {}

bool ChoiceState::add(const TokenEvent& e) {
  if (e.eos) {
    finish_ = FinishReason::stop;
    return false;
  }
  ++tokens_;
  if (logprobs_) {
    log_.push_back({e.pick.token, e.pick.logprob, e.pick.top, utf8_chars(text_.text())});
  }
  if (text_.add(e.pick.token)) {
    finish_ = FinishReason::stop;
    return false;
  }
  finish_ = e.finished;
  return true;
}

json ChoiceState::logprobs_json(size_t from, size_t to) const {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (size_t i = from; i < to; ++i) {
    const TokenLog& t = log_[i];
    tokens.push_back(token_text(tokenizer_, t.token));
    token_logprobs.push_back(t.logprob);
    json alternatives = json::object();
    for (const auto& [id, lp] : t.top) alternatives[token_text(tokenizer_, id)] = lp;
    top.push_back(std::move(alternatives));
    offsets.push_back(t.text_offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
          {"text_offset", offsets}};
}

json ChoiceState::to_json(int64_t index) const {
  return {{"index", index},
          {"text", text_.text()},
          {"logprobs", logprobs_ ? logprobs_json(0, log_.size()) : json(nullptr)},
          {"finish_reason", finished() ? json(to_string(finish_)) : json(nullptr)}};
}

json ChoiceState::take_chunk(int64_t index) {
  // SentencePiece decodes the first bytes of a character still arriving as U+FFFD, which
  // CompletionText takes for a whole character; the next token may turn it into another
  // one, so a text ending in U+FFFD is not sent before it ends or grows past it.
  static const std::string kReplacement = "\xEF\xBF\xBD";
  const std::string& text = text_.text();
  const bool unsettled = !finished() && text.size() >= kReplacement.size() &&
                         text.compare(text.size() - kReplacement.size(), kReplacement.size(),
                                      kReplacement) == 0;
  const std::string delta = unsettled ? std::string() : text_.take_delta(finished());
  const bool new_tokens = logprobs_ && log_sent_ < log_.size();
  const bool finishing = finished() && !finish_sent_;
  if (delta.empty() && !new_tokens && !finishing) return nullptr;
  json choice = {{"index", index},
                 {"text", delta},
                 {"logprobs", logprobs_ ? logprobs_json(log_sent_, log_.size()) : json(nullptr)},
                 {"finish_reason", finishing ? json(to_string(finish_)) : json(nullptr)}};
  log_sent_ = log_.size();
  finish_sent_ = finished();
  return choice;
}

json completion_response(const ResponseHead& head, const std::vector<ChoiceState>& choices,
                         const CompletionRequest& request) {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const auto& p : request.prompts) prompt_tokens += static_cast<int64_t>(p.size());
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    list.push_back(choices[i].to_json(static_cast<int64_t>(i)));
    completion_tokens += choices[i].completion_tokens();
  }
  return {{"id", head.id},
          {"object", "text_completion"},
          {"created", head.created},
          {"model", head.model},
          {"choices", list},
          {"usage", {{"prompt_tokens", prompt_tokens},
                     {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}}}};
}

std::string stream_event(const ResponseHead& head, const json& choice) {
  const json chunk = {{"id", head.id},
                      {"object", "text_completion"},
                      {"created", head.created},
                      {"model", head.model},
                      {"choices", json::array({choice})}};
  return "data: " + dump(chunk) + "\n\n";
}

json error_json(const ApiError& e) {
  return {{"error", {{"message", e.what()},
                     {"type", e.type},
                     {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                     {"code", nullptr}}}};
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace jumbo::serve
