#pragma once
// A request body as untrusted input: parsed with a bound on nesting (a value nested
// 100000 deep would overflow the stack of whatever walks it), read field by field with one
// line of error naming the field, and quoted back in errors at a bounded length.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>

namespace jumbo::serve {

using json = nlohmann::json;

inline constexpr int kMaxJsonDepth = 32;  // OpenAI's bodies nest 4 deep

// What a client gets back as {"error": {...}} with this HTTP status. `param` names the
// field at fault ("" = null: the body as a whole, or no field); `code` is OpenAI's
// machine-readable one ("" = null).
struct ApiError : std::runtime_error {
  ApiError(int status, std::string param, const std::string& message,
           std::string type = "invalid_request_error", std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)),
        type(std::move(type)), code(std::move(code)) {}
  int status;
  std::string param;
  std::string type;
  std::string code;
};

json error_json(const ApiError& e);
// JSON text; invalid UTF-8 (a completion cut inside a character) becomes U+FFFD.
std::string dump(const json& j);

// A JSON object, or ApiError 400: not JSON, nested deeper than kMaxJsonDepth, not an object.
json parse_body(const std::string& text);

// A value as an error message shows it: short values whole, long strings, arrays and
// objects by their beginning and size (never more than ~100 bytes).
std::string quote(const json& v);

[[noreturn]] void bad(const std::string& field, const std::string& message);

// The field's value; nullptr when absent or null (null means the default, as in OpenAI).
const json* optional(const json& body, const char* name);
// An integer in [lo, hi]; a float with an integral value (5.0) counts as one.
int64_t integer_in(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi);
int64_t integer_of(const json& v, const std::string& name);
// A number in [lo, hi].
double number_in(const json& body, const char* name, double fallback, double lo, double hi);
bool bool_of(const json& body, const char* name, bool fallback);

}  // namespace jumbo::serve
