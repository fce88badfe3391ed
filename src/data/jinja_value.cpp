// Jinja values: Python's semantics for truth, equality, arithmetic, str(), repr() and
// json.dumps (as transformers' tojson calls it: ensure_ascii=False), on JSON-like values.
#include <fmt/format.h>

#include <cmath>

#include "jinja_internal.h"

namespace jumbo::jinja::detail {

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::boolean;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::integer;
  v.i = i;
  return v;
}
Value Value::floating(double f) {
  Value v;
  v.kind = Kind::floating;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::string;
  v.s = std::move(s);
  return v;
}
Value Value::make_list(List l) {
  Value v;
  v.kind = Kind::list;
  v.list = std::make_shared<List>(std::move(l));
  return v;
}
Value Value::make_dict(Dict d) {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::function;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

const Value* Value::find(std::string_view key) const {
  if (kind != Kind::dict) return nullptr;
  for (const auto& [k, v] : *dict) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, old] : *dict) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict->emplace_back(key, std::move(v));
}

void fail(const std::string& message) { throw RenderError(message); }

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: case Value::Kind::none: return false;
    case Value::Kind::boolean: return v.b;
    case Value::Kind::integer: return v.i != 0;
    case Value::Kind::floating: return v.f != 0;
    case Value::Kind::string: return !v.s.empty();
    case Value::Kind::list: return !v.list->empty();
    case Value::Kind::dict: return !v.dict->empty();
    case Value::Kind::function: return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is(K::floating) || b.is(K::floating)) return a.number() == b.number();
    return (a.is(K::boolean) ? int64_t{a.b} : a.i) == (b.is(K::boolean) ? int64_t{b.b} : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::undefined: case K::none: return true;
    case K::string: return a.s == b.s;
    case K::list:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case K::dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* other = b.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    case K::function: return a.fn == b.fn;
    default: return false;
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return v.s.empty() ? "an undefined value" : fmt::format("undefined '{}'", v.s);
    case Value::Kind::none: return "none";
    case Value::Kind::boolean: return "a boolean";
    case Value::Kind::integer: return "an integer";
    case Value::Kind::floating: return "a float";
    case Value::Kind::string: return "a string";
    case Value::Kind::list: return "a list";
    case Value::Kind::dict: return v.is_namespace ? "a namespace" : "a dict";
    case Value::Kind::function: return "a function";
  }
  return "?";
}

namespace {

std::string float_text(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", f);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') { out += '\\'; out += static_cast<char>(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int level) {
  using K = Value::Kind;
  auto newline = [&](int l) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * l), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case K::undefined: fail(fmt::format("tojson of {}", type_name(v)));
    case K::none: out += "null"; return;
    case K::boolean: out += v.b ? "true" : "false"; return;
    case K::integer: out += std::to_string(v.i); return;
    case K::floating:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_text(v.f);
      return;
    case K::string: json_string(out, v.s); return;
    case K::list:
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        json_value(out, (*v.list)[k], indent, level + 1);
      }
      newline(level);
      out += ']';
      return;
    case K::dict: {
      if (v.dict->empty()) { out += "{}"; return; }
      out += '{';
      bool first = true;
      for (const auto& [k, item] : *v.dict) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        json_string(out, k);
        out += ": ";
        json_value(out, item, indent, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    case K::function: fail("tojson of a function");
  }
}

}  // namespace

std::string str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.b ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::floating: return float_text(v.f);
    case Value::Kind::string: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::string: return repr_string(v.s);
    case Value::Kind::list: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      return out + "]";
    }
    case Value::Kind::dict: {
      std::string out = v.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, item] : *v.dict) {
        out += (first ? "" : ", ") + repr_string(k) + ": " + repr(item);
        first = false;
      }
      return out + (v.is_namespace ? "}>" : "}");
    }
    case Value::Kind::function: return "<function>";
    default: return str(v);
  }
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_value(out, v, indent, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value::make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::make_dict();
      for (const auto& [k, e] : j.items()) d.dict->emplace_back(k, from_json(e));
      return d;
    }
    default: return Value::undefined();
  }
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - k);
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

namespace {

// Python's str.isspace() for one UTF-8 character.
bool python_space(const std::string& ch) {
  static const char* spaces[] = {"\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f", " ",
                                 "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003",
                                 "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
                                 "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  for (const char* s : spaces) {
    if (ch == s) return true;
  }
  return false;
}

}  // namespace

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string> cps = code_points(s);
  std::vector<std::string> set;
  if (chars) set = code_points(*chars);
  auto strippable = [&](const std::string& ch) {
    if (!chars) return python_space(ch);
    for (const std::string& c : set) {
      if (c == ch) return true;
    }
    return false;
  };
  size_t a = 0, b = cps.size();
  if (left) while (a < b && strippable(cps[a])) ++a;
  if (right) while (b > a && strippable(cps[b - 1])) --b;
  std::string out;
  for (size_t k = a; k < b; ++k) out += cps[k];
  return out;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return *v.list;
    case Value::Kind::dict: {
      std::vector<Value> keys;
      for (const auto& [k, item] : *v.dict) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::string: {
      std::vector<Value> chars;
      for (std::string& c : code_points(v.s)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    default: fail(fmt::format("{} is not iterable", type_name(v)));
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return 0;
    case Value::Kind::string: return static_cast<int64_t>(code_points(v.s).size());
    case Value::Kind::list: return static_cast<int64_t>(v.list->size());
    case Value::Kind::dict: return static_cast<int64_t>(v.dict->size());
    default: fail(fmt::format("{} has no length", type_name(v)));
  }
}

}  // namespace jumbo::jinja::detail
