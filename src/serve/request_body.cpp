#include "request_body.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace jumbo::serve {

json error_json(const ApiError& e) {
  return {{"error", {{"message", e.what()},
                     {"type", e.type},
                     {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                     {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// The deepest nesting of arrays and objects in JSON text (strings skipped), stopping early
// past `limit`. Malformed text is left to the parser.
int nesting_depth(const std::string& text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json parse_body(const std::string& text) {
  if (nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    throw ApiError(400, "", fmt::format("the request body nests arrays or objects more than {} "
                                        "deep", kMaxJsonDepth));
  }
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded()) throw ApiError(400, "", "the request body is not valid JSON");
  if (!body.is_object()) throw ApiError(400, "", "the request body is not a JSON object");
  return body;
}

std::string quote(const json& v) {
  constexpr size_t kShown = 60;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() <= kShown) return dump(v);
    return fmt::format("{}... (a string of {} bytes)", dump(json(s.substr(0, kShown))), s.size());
  }
  if (v.is_array()) return fmt::format("an array of {} items", v.size());
  if (v.is_object()) return fmt::format("an object of {} keys", v.size());
  return dump(v);  // a number, a bool or null: short
}

void bad(const std::string& field, const std::string& message) {
  throw ApiError(400, field, field + ": " + message);
}

const json* optional(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

int64_t integer_of(const json& v, const std::string& name) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 0x1p62) {
      return static_cast<int64_t>(d);
    }
  }
  if (!v.is_number_integer()) bad(name, fmt::format("expected an integer, got {}", quote(v)));
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

double number_in(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = optional(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, fmt::format("expected a number, got {}", quote(*v)));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(name, fmt::format("{} is not in {} .. {}", x, lo, hi));
  return x;
}

bool bool_of(const json& body, const char* name, bool fallback) {
  const json* v = optional(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, fmt::format("expected true or false, got {}", quote(*v)));
  return v->get<bool>();
}

}  // namespace jumbo::serve
