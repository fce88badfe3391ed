#pragma once
// A Jinja interpreter for chat templates as Hugging Face models ship them (tokenizer_config.json's
// `chat_template`): the subset of Jinja2 those templates use, rendered as transformers'
// apply_chat_template renders them (jinja2 with trim_blocks and lstrip_blocks, a single trailing
// newline of the source dropped, `raise_exception(msg)` and `strftime_now(format)` defined).
//
// Supported: text, {{ }}, {% %}, {# #}, whitespace control (- and +); if/elif/else, for (loop.*,
// else, `for x in xs if cond`, unpacking, break/continue), set (names, namespace attributes,
// tuples, block set), macro, generation; literals, lists, dicts, attribute and subscript access,
// slices, calls with keyword arguments, + - * / // % ** ~, comparisons, and/or/not, in, `is`
// tests, `x if c else y`; the common filters, string/dict/list methods and globals (range,
// namespace, dict, raise_exception, strftime_now). Undefined values behave as jinja2's default
// Undefined: printed as "", false, empty when iterated, an error when computed with.
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace jumbo::jinja {

// raise_exception(message) called by a template: what() is the template's message.
struct RaisedException : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A template that parsed but cannot render these values ("'x' is undefined", a type error).
struct RenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
struct Program;
}

class Template {
 public:
  // Throws UserError "WHERE:LINE: ..." naming what was expected where the syntax is wrong.
  Template(std::string_view source, const std::string& where);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // The variables are the object's keys (objects keep their key order, as Python's dicts do).
  // Throws RaisedException or RenderError.
  std::string render(const nlohmann::ordered_json& variables) const;

 private:
  std::shared_ptr<const detail::Program> program_;
};

}  // namespace jumbo::jinja
