// Jinja operators, subscripts, slices and attributes (with the string, dict and list methods
// chat templates call: strip, split, startswith, items, get, ...), as Python computes them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "jinja_internal.h"

namespace jumbo::jinja::detail {
namespace {

using K = Value::Kind;

[[noreturn]] void undefined_error(const Value& v) {
  fail(v.s.empty() ? "a value is undefined" : fmt::format("'{}' is undefined", v.s));
}

int64_t as_int(const Value& v, const char* what) {
  if (v.is(K::integer)) return v.i;
  if (v.is(K::boolean)) return v.b;
  fail(fmt::format("{} must be an integer, got {}", what, type_name(v)));
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

std::string repeat(const std::string& s, int64_t n) {
  std::string out;
  for (int64_t k = 0; k < n; ++k) out += s;
  return out;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Value binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(str(a) + str(b));
  if (a.is(K::undefined)) undefined_error(a);
  if (b.is(K::undefined)) undefined_error(b);
  if (op == "+") {
    if (a.is(K::string) && b.is(K::string)) return Value::string(a.s + b.s);
    if (a.is(K::list) && b.is(K::list)) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l));
    }
  }
  if (op == "*") {
    if (a.is(K::string) && (b.is(K::integer) || b.is(K::boolean))) return Value::string(repeat(a.s, as_int(b, "")));
    if (b.is(K::string) && (a.is(K::integer) || a.is(K::boolean))) return Value::string(repeat(b.s, as_int(a, "")));
  }
  if (!a.is_number() || !b.is_number()) {
    fail(fmt::format("unsupported operand types for {}: {} and {}", op, type_name(a), type_name(b)));
  }
  const bool ints = !a.is(K::floating) && !b.is(K::floating);
  if (ints && op != "/") {
    const int64_t x = as_int(a, ""), y = as_int(b, "");
    if (op == "+") return Value::integer(x + y);
    if (op == "-") return Value::integer(x - y);
    if (op == "*") return Value::integer(x * y);
    if ((op == "//" || op == "%") && y == 0) fail("integer division or modulo by zero");
    if (op == "//") return Value::integer(floor_div(x, y));
    if (op == "%") return Value::integer(x - floor_div(x, y) * y);
    if (op == "**") {
      if (y < 0) return Value::floating(std::pow(double(x), double(y)));
      int64_t r = 1;
      for (int64_t k = 0; k < y; ++k) r *= x;
      return Value::integer(r);
    }
  }
  const double x = a.number(), y = b.number();
  if (op == "+") return Value::floating(x + y);
  if (op == "-") return Value::floating(x - y);
  if (op == "*") return Value::floating(x * y);
  if (op == "**") return Value::floating(std::pow(x, y));
  if (y == 0) fail("division by zero");
  if (op == "/") return Value::floating(x / y);
  if (op == "//") return Value::floating(std::floor(x / y));
  if (op == "%") return Value::floating(x - std::floor(x / y) * y);
  fail(fmt::format("unknown operator {}", op));
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  int c;
  if (a.is_number() && b.is_number()) c = a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  else if (a.is(K::string) && b.is(K::string)) c = a.s.compare(b.s);
  else fail(fmt::format("'{}' not supported between {} and {}", op, type_name(a), type_name(b)));
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case K::string:
      if (!item.is(K::string)) fail(fmt::format("'in <string>' requires a string, not {}", type_name(item)));
      return container.s.find(item.s) != std::string::npos;
    case K::list:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& v) { return equal(v, item); });
    case K::dict: return item.is(K::string) && container.find(item.s) != nullptr;
    case K::undefined: undefined_error(container);
    default: fail(fmt::format("'in' needs a string, list or dict, got {}", type_name(container)));
  }
}

Value subscript(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case K::undefined: undefined_error(obj);
    case K::dict:
      if (key.is(K::string)) {
        if (const Value* v = obj.find(key.s)) return *v;
        return attribute(obj, key.s);  // jinja2: then the attribute (a dict's methods)
      }
      return Value::undefined(str(key));
    case K::list: case K::string: {
      if (!key.is(K::integer) && !key.is(K::boolean)) {
        if (key.is(K::string)) return attribute(obj, key.s);
        return Value::undefined(str(key));
      }
      std::vector<std::string> cps;
      if (obj.is(K::string)) cps = code_points(obj.s);
      const int64_t n = obj.is(K::list) ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(cps.size());
      int64_t k = as_int(key, "an index");
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined(fmt::format("index {}", as_int(key, "")));
      return obj.is(K::list) ? (*obj.list)[k] : Value::string(cps[k]);
    }
    default: return Value::undefined(str(key));
  }
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is(K::undefined)) undefined_error(obj);
  std::vector<Value> items;
  if (obj.is(K::list)) items = *obj.list;
  else if (obj.is(K::string)) items = iterate(obj);
  else fail(fmt::format("cannot slice {}", type_name(obj)));
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t st = step.is(K::none) ? 1 : as_int(step, "a slice step");
  if (st == 0) fail("slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t fallback) {
    if (v.is(K::none)) return fallback;
    int64_t k = as_int(v, "a slice index");
    if (k < 0) k += n;
    if (st > 0) return std::clamp<int64_t>(k, 0, n);
    return std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t a = bound(start, st > 0 ? 0 : n - 1), b = bound(stop, st > 0 ? n : -1);
  List out;
  for (int64_t k = a; st > 0 ? k < b : k > b; k += st) out.push_back(items[k]);
  if (obj.is(K::list)) return Value::make_list(std::move(out));
  std::string s;
  for (const Value& v : out) s += v.s;
  return Value::string(std::move(s));
}

namespace {

Value arg(Args& a, size_t k, const char* name, const Value& fallback) {
  for (const auto& [key, v] : a.named) {
    if (key == name) return v;
  }
  return k < a.positional.size() ? a.positional[k] : fallback;
}

std::string string_arg(Args& a, size_t k, const char* method) {
  const Value& v = arg(a, k, "", Value::undefined());
  if (!v.is(K::string)) fail(fmt::format("{}() expects a string argument, got {}", method, type_name(v)));
  return v.s;
}

bool affix(const std::string& s, const Value& what, bool prefix) {
  auto one = [&](const Value& p) {
    if (!p.is(K::string)) fail(fmt::format("{}with() takes a string, got {}", prefix ? "starts" : "ends", type_name(p)));
    return prefix ? s.starts_with(p.s) : s.ends_with(p.s);
  };
  if (what.is(K::list)) return std::any_of(what.list->begin(), what.list->end(), one);
  return one(what);
}

Value split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is(K::none) || sep.is(K::undefined)) {  // runs of whitespace, none at the ends
    const std::vector<std::string> cps = code_points(s);
    std::string cur;
    bool in_word = false;
    int64_t splits = 0;
    for (size_t k = 0; k < cps.size(); ++k) {
      const bool space = strip(cps[k], nullptr, true, true).empty();
      if (space && in_word && (maxsplit < 0 || splits < maxsplit)) {
        out.push_back(Value::string(cur));
        cur.clear();
        in_word = false;
        ++splits;
      } else if (!space || in_word) {
        if (!in_word && maxsplit >= 0 && splits >= maxsplit) {
          std::string rest;
          for (size_t q = k; q < cps.size(); ++q) rest += cps[q];
          out.push_back(Value::string(strip(rest, nullptr, false, true)));
          return Value::make_list(std::move(out));
        }
        cur += cps[k];
        in_word = true;
      }
    }
    if (in_word) out.push_back(Value::string(cur));
    return Value::make_list(std::move(out));
  }
  if (!sep.is(K::string) || sep.s.empty()) fail("split() needs a non-empty string separator");
  size_t from = 0;
  int64_t splits = 0;
  for (size_t at = s.find(sep.s); at != std::string::npos && (maxsplit < 0 || splits < maxsplit);
       at = s.find(sep.s, from)) {
    out.push_back(Value::string(s.substr(from, at - from)));
    from = at + sep.s.size();
    ++splits;
  }
  out.push_back(Value::string(s.substr(from)));
  return Value::make_list(std::move(out));
}

Value string_method(const std::string& s, const std::string& name) {
  auto bound = [&](auto f) { return Value::function([s, f](Args& a) { return f(s, a); }); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return bound([l, r](const std::string& s, Args& a) {
      const Value& chars = arg(a, 0, "chars", Value::none());
      return Value::string(strip(s, chars.is(K::string) ? &chars.s : nullptr, l, r));
    });
  }
  if (name == "upper" || name == "lower") {
    const bool up = name == "upper";
    return bound([up](const std::string& s, Args&) { return Value::string(ascii_case(s, up)); });
  }
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bound([prefix](const std::string& s, Args& a) { return Value::boolean(affix(s, arg(a, 0, "prefix", Value::undefined()), prefix)); });
  }
  if (name == "split") {
    return bound([](const std::string& s, Args& a) {
      const Value& mx = arg(a, 1, "maxsplit", Value::integer(-1));
      return split(s, arg(a, 0, "sep", Value::none()), as_int(mx, "maxsplit"));
    });
  }
  if (name == "replace") {
    return bound([](const std::string& s, Args& a) {
      const std::string from = string_arg(a, 0, "replace");
      std::string to = arg(a, 1, "", Value::undefined()).s;
      int64_t count = as_int(arg(a, 2, "count", Value::integer(-1)), "count");
      std::string out;
      size_t pos = 0;
      if (from.empty()) return Value::string(s);
      for (size_t at = s.find(from); at != std::string::npos && count != 0; at = s.find(from, pos), --count) {
        out += s.substr(pos, at - pos) + to;
        pos = at + from.size();
      }
      return Value::string(out + s.substr(pos));
    });
  }
  if (name == "find") {
    return bound([](const std::string& s, Args& a) {
      const size_t at = s.find(string_arg(a, 0, "find"));
      return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(code_points(s.substr(0, at)).size()));
    });
  }
  if (name == "title" || name == "capitalize") {
    const bool title = name == "title";
    return bound([title](const std::string& s, Args&) {
      std::string out = s;
      bool start = true;
      for (char& c : out) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c));
        c = static_cast<char>(start && alpha ? std::toupper(c) : (title || !start) ? std::tolower(c) : c);
        if (title) start = !alpha;
        else if (alpha) start = false;
      }
      return Value::string(out);
    });
  }
  return Value::undefined(name);
}

}  // namespace

Value attribute(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case K::undefined: undefined_error(obj);
    case K::string: return string_method(obj.s, name);
    case K::dict: {
      if (obj.is_namespace) {
        if (const Value* v = obj.find(name)) return *v;
        return Value::undefined(name);
      }
      const Value self = obj;
      if (name == "items" || name == "keys" || name == "values") {
        return Value::function([self, name](Args&) {
          List out;
          for (const auto& [k, v] : *self.dict) {
            if (name == "items") out.push_back(Value::make_list({Value::string(k), v}));
            else out.push_back(name == "keys" ? Value::string(k) : v);
          }
          return Value::make_list(std::move(out));
        });
      }
      if (name == "get") {
        return Value::function([self](Args& a) {
          const Value& key = arg(a, 0, "key", Value::undefined());
          const Value* v = key.is(K::string) ? self.find(key.s) : nullptr;
          return v ? *v : arg(a, 1, "default", Value::none());
        });
      }
      if (const Value* v = obj.find(name)) return *v;
      return Value::undefined(name);
    }
    case K::list: {
      const Value self = obj;
      if (name == "append") {
        return Value::function([self](Args& a) {
          self.list->push_back(arg(a, 0, "", Value::none()));
          return Value::none();
        });
      }
      if (name == "index") {
        return Value::function([self](Args& a) {
          const Value& x = arg(a, 0, "", Value::none());
          for (size_t k = 0; k < self.list->size(); ++k) {
            if (equal((*self.list)[k], x)) return Value::integer(static_cast<int64_t>(k));
          }
          fail(fmt::format("{} is not in the list", repr(x)));
        });
      }
      return Value::undefined(name);
    }
    default: return Value::undefined(name);
  }
}

}  // namespace jumbo::jinja::detail
