// Jinja filters, tests and globals: those jinja2 (and transformers, for tojson, raise_exception
// and strftime_now) define that chat templates use.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "jinja_internal.h"

namespace jumbo::jinja::detail {
namespace {

using K = Value::Kind;

Value arg(const Args& a, size_t k, const char* name, const Value& fallback) {
  for (const auto& [key, v] : a.named) {
    if (key == name) return v;
  }
  return k < a.positional.size() ? a.positional[k] : fallback;
}

Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t from = 0;
  while (true) {
    const size_t dot = path.find('.', from);
    const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    if (cur.is(K::undefined)) return cur;
    cur = subscript(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    from = dot + 1;
  }
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
Value select(const Value& v, const Args& a, bool keep, bool by_attribute) {
  size_t k = 0;
  std::string attribute;
  if (by_attribute) {
    const Value& name = arg(a, k++, "", Value::undefined());
    if (!name.is(K::string)) fail("selectattr/rejectattr need an attribute name");
    attribute = name.s;
  }
  const Value& test = arg(a, k++, "", Value::undefined());
  Args rest;
  for (; k < a.positional.size(); ++k) rest.positional.push_back(a.positional[k]);
  List out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attribute ? attr_path(item, attribute) : item;
    const bool ok = test.is(K::undefined) ? truthy(subject) : apply_test(test.s, subject, rest);
    if (ok == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

bool less(const Value& a, const Value& b) { return compare("<", a, b); }

std::string indent_text(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t from = 0;
  bool is_first = true;
  while (true) {
    const size_t nl = s.find('\n', from);
    const std::string line = s.substr(from, nl == std::string::npos ? std::string::npos : nl - from);
    const bool indent = (!is_first || first) && (blank || !line.empty());
    out += (indent ? pad : "") + line;
    if (nl == std::string::npos) return out;
    out += '\n';
    from = nl + 1;
    is_first = false;
  }
}

using FilterFn = Value (*)(const Value&, const Args&);

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = {
      {"abs", [](const Value& v, const Args&) { return v.is(K::floating) ? Value::floating(std::fabs(v.f)) : Value::integer(std::llabs(v.i)); }},
      {"attr", [](const Value& v, const Args& a) { return attribute(v, str(arg(a, 0, "name", Value::undefined()))); }},
      {"capitalize", [](const Value& v, const Args&) { Args none; return (*attribute(Value::string(str(v)), "capitalize").fn)(none); }},
      {"count", [](const Value& v, const Args&) { return Value::integer(length(v)); }},
      {"default", [](const Value& v, const Args& a) {
         const bool boolean = truthy(arg(a, 1, "boolean", Value::boolean(false)));
         if (v.is(K::undefined) || (boolean && !truthy(v))) return arg(a, 0, "default_value", Value::string(""));
         return v;
       }},
      {"dictsort", [](const Value& v, const Args&) {
         if (!v.is(K::dict)) fail(fmt::format("dictsort needs a dict, got {}", type_name(v)));
         List items;
         for (const auto& [k, x] : *v.dict) items.push_back(Value::make_list({Value::string(k), x}));
         std::stable_sort(items.begin(), items.end(), [](const Value& p, const Value& q) { return (*p.list)[0].s < (*q.list)[0].s; });
         return Value::make_list(std::move(items));
       }},
      {"first", [](const Value& v, const Args&) { auto l = iterate(v); return l.empty() ? Value::undefined("first") : l.front(); }},
      {"float", [](const Value& v, const Args&) {
         if (v.is_number()) return Value::floating(v.number());
         try { return Value::floating(std::stod(str(v))); } catch (const std::exception&) { return Value::floating(0); }
       }},
      {"indent", [](const Value& v, const Args& a) {
         const Value& w = arg(a, 0, "width", Value::integer(4));
         const std::string pad = w.is(K::string) ? w.s : std::string(static_cast<size_t>(std::max<int64_t>(0, w.i)), ' ');
         return Value::string(indent_text(str(v), pad, truthy(arg(a, 1, "first", Value::boolean(false))),
                                          truthy(arg(a, 2, "blank", Value::boolean(false)))));
       }},
      {"int", [](const Value& v, const Args&) {
         if (v.is(K::floating)) return Value::integer(static_cast<int64_t>(v.f));
         if (v.is_number()) return Value::integer(v.is(K::boolean) ? v.b : v.i);
         try { return Value::integer(std::stoll(strip(str(v), nullptr, true, true))); } catch (const std::exception&) { return Value::integer(0); }
       }},
      {"items", [](const Value& v, const Args&) {
         if (v.is(K::undefined)) return Value::make_list();
         if (!v.is(K::dict)) fail(fmt::format("items needs a dict, got {}", type_name(v)));
         Args none;
         return (*attribute(v, "items").fn)(none);
       }},
      {"join", [](const Value& v, const Args& a) {
         const std::string sep = str(arg(a, 0, "d", Value::string("")));
         const Value& at = arg(a, 1, "attribute", Value::none());
         std::string out;
         bool first = true;
         for (const Value& item : iterate(v)) {
           out += (first ? "" : sep) + str(at.is(K::none) ? item : attr_path(item, str(at)));
           first = false;
         }
         return Value::string(out);
       }},
      {"last", [](const Value& v, const Args&) { auto l = iterate(v); return l.empty() ? Value::undefined("last") : l.back(); }},
      {"length", [](const Value& v, const Args&) { return Value::integer(length(v)); }},
      {"list", [](const Value& v, const Args&) { return Value::make_list(iterate(v)); }},
      {"lower", [](const Value& v, const Args&) { Args none; return (*attribute(Value::string(str(v)), "lower").fn)(none); }},
      {"map", [](const Value& v, const Args& a) {
         List out;
         const Value& at = arg(a, 99, "attribute", Value::none());
         for (const Value& item : iterate(v)) {
           if (!at.is(K::none)) {
             Value x = attr_path(item, str(at));
             out.push_back(x.is(K::undefined) ? arg(a, 99, "default", x) : x);
           } else {
             Args rest;
             for (size_t k = 1; k < a.positional.size(); ++k) rest.positional.push_back(a.positional[k]);
             out.push_back(apply_filter(str(arg(a, 0, "", Value::undefined())), item, rest));
           }
         }
         return Value::make_list(std::move(out));
       }},
      {"max", [](const Value& v, const Args&) { auto l = iterate(v); if (l.empty()) return Value::undefined("max"); return *std::max_element(l.begin(), l.end(), less); }},
      {"min", [](const Value& v, const Args&) { auto l = iterate(v); if (l.empty()) return Value::undefined("min"); return *std::min_element(l.begin(), l.end(), less); }},
      {"reject", [](const Value& v, const Args& a) { return select(v, a, false, false); }},
      {"rejectattr", [](const Value& v, const Args& a) { return select(v, a, false, true); }},
      {"replace", [](const Value& v, const Args& a) {
         Args m{a.positional, {}};
         if (m.positional.size() < 3) m.positional.push_back(arg(a, 2, "count", Value::integer(-1)));
         return (*attribute(Value::string(str(v)), "replace").fn)(m);
       }},
      {"reverse", [](const Value& v, const Args&) {
         if (v.is(K::string)) { auto c = code_points(v.s); std::string s; for (auto it = c.rbegin(); it != c.rend(); ++it) s += *it; return Value::string(s); }
         auto l = iterate(v);
         std::reverse(l.begin(), l.end());
         return Value::make_list(std::move(l));
       }},
      {"round", [](const Value& v, const Args& a) {
         const int64_t digits = arg(a, 0, "precision", Value::integer(0)).i;
         const double scale = std::pow(10.0, double(digits));
         return Value::floating(std::nearbyint(v.number() * scale) / scale);
       }},
      {"safe", [](const Value& v, const Args&) { return v; }},
      {"select", [](const Value& v, const Args& a) { return select(v, a, true, false); }},
      {"selectattr", [](const Value& v, const Args& a) { return select(v, a, true, true); }},
      {"sort", [](const Value& v, const Args& a) {
         auto l = iterate(v);
         const bool rev = truthy(arg(a, 0, "reverse", Value::boolean(false)));
         const Value& at = arg(a, 2, "attribute", Value::none());
         auto key = [&](const Value& x) { return at.is(K::none) ? x : attr_path(x, str(at)); };
         std::stable_sort(l.begin(), l.end(), [&](const Value& p, const Value& q) { return rev ? less(key(q), key(p)) : less(key(p), key(q)); });
         return Value::make_list(std::move(l));
       }},
      {"string", [](const Value& v, const Args&) { return Value::string(str(v)); }},
      {"sum", [](const Value& v, const Args& a) {
         Value total = arg(a, 1, "start", Value::integer(0));
         for (const Value& x : iterate(v)) total = binary("+", total, x);
         return total;
       }},
      {"title", [](const Value& v, const Args&) { Args none; return (*attribute(Value::string(str(v)), "title").fn)(none); }},
      {"tojson", [](const Value& v, const Args& a) {
         const Value& ind = arg(a, 0, "indent", Value::none());
         return Value::string(to_json(v, ind.is(K::none) ? -1 : static_cast<int>(ind.i)));
       }},
      {"trim", [](const Value& v, const Args& a) {
         const Value& chars = arg(a, 0, "chars", Value::none());
         return Value::string(strip(str(v), chars.is(K::string) ? &chars.s : nullptr, true, true));
       }},
      {"unique", [](const Value& v, const Args&) {
         List out;
         for (const Value& x : iterate(v)) {
           if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
         }
         return Value::make_list(std::move(out));
       }},
      {"upper", [](const Value& v, const Args&) { Args none; return (*attribute(Value::string(str(v)), "upper").fn)(none); }},
      {"wordcount", [](const Value& v, const Args&) {
         Args none;
         return Value::integer(length((*attribute(Value::string(str(v)), "split").fn)(none)));
       }},
  };
  return table;
}

using TestFn = bool (*)(const Value&, const Args&);

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> table = {
      {"boolean", [](const Value& v, const Args&) { return v.is(K::boolean); }},
      {"callable", [](const Value& v, const Args&) { return v.is(K::function); }},
      {"defined", [](const Value& v, const Args&) { return !v.is(K::undefined); }},
      {"divisibleby", [](const Value& v, const Args& a) { const int64_t d = arg(a, 0, "num", Value::integer(1)).i; return d != 0 && v.i % d == 0; }},
      {"eq", [](const Value& v, const Args& a) { return equal(v, arg(a, 0, "other", Value::undefined())); }},
      {"even", [](const Value& v, const Args&) { return v.is(K::integer) && v.i % 2 == 0; }},
      {"false", [](const Value& v, const Args&) { return v.is(K::boolean) && !v.b; }},
      {"float", [](const Value& v, const Args&) { return v.is(K::floating); }},
      {"ge", [](const Value& v, const Args& a) { return compare(">=", v, arg(a, 0, "other", Value::undefined())); }},
      {"gt", [](const Value& v, const Args& a) { return compare(">", v, arg(a, 0, "other", Value::undefined())); }},
      {"in", [](const Value& v, const Args& a) { return contains(arg(a, 0, "seq", Value::undefined()), v); }},
      {"integer", [](const Value& v, const Args&) { return v.is(K::integer); }},
      {"iterable", [](const Value& v, const Args&) { return v.is(K::undefined) || v.is(K::string) || v.is(K::list) || v.is(K::dict); }},
      {"le", [](const Value& v, const Args& a) { return compare("<=", v, arg(a, 0, "other", Value::undefined())); }},
      {"lower", [](const Value& v, const Args&) { return v.is(K::string) && std::none_of(v.s.begin(), v.s.end(), [](char c) { return std::isupper(static_cast<unsigned char>(c)); }); }},
      {"lt", [](const Value& v, const Args& a) { return compare("<", v, arg(a, 0, "other", Value::undefined())); }},
      {"mapping", [](const Value& v, const Args&) { return v.is(K::dict); }},
      {"ne", [](const Value& v, const Args& a) { return !equal(v, arg(a, 0, "other", Value::undefined())); }},
      {"none", [](const Value& v, const Args&) { return v.is(K::none); }},
      {"number", [](const Value& v, const Args&) { return v.is(K::integer) || v.is(K::floating); }},
      {"odd", [](const Value& v, const Args&) { return v.is(K::integer) && v.i % 2 != 0; }},
      {"sameas", [](const Value& v, const Args& a) {
         const Value& o = arg(a, 0, "other", Value::undefined());
         if (v.kind != o.kind) return false;
         if (v.is(K::list)) return v.list == o.list;
         if (v.is(K::dict)) return v.dict == o.dict;
         return v.is(K::none) || v.is(K::undefined) || (v.is(K::boolean) && v.b == o.b);
       }},
      {"sequence", [](const Value& v, const Args&) { return v.is(K::undefined) || v.is(K::string) || v.is(K::list) || v.is(K::dict); }},
      {"string", [](const Value& v, const Args&) { return v.is(K::string); }},
      {"true", [](const Value& v, const Args&) { return v.is(K::boolean) && v.b; }},
      {"undefined", [](const Value& v, const Args&) { return v.is(K::undefined); }},
      {"upper", [](const Value& v, const Args&) { return v.is(K::string) && std::none_of(v.s.begin(), v.s.end(), [](char c) { return std::islower(static_cast<unsigned char>(c)); }); }},
  };
  return table;
}

const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> table = {
      {"d", "default"}, {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"}, {"<", "lt"},
      {"lessthan", "lt"}, {"<=", "le"}, {">", "gt"}, {"greaterthan", "gt"}, {">=", "ge"}};
  return table;
}

std::string canonical(const std::string& name) {
  auto it = aliases().find(name);
  return it == aliases().end() ? name : it->second;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(canonical(name)) > 0; }
bool has_test(const std::string& name) { return tests().count(canonical(name)) > 0; }

Value apply_filter(const std::string& name, const Value& v, Args& args) {
  auto it = filters().find(canonical(name));
  if (it == filters().end()) fail(fmt::format("no filter named \"{}\"", name));
  return it->second(v, args);
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  auto it = tests().find(canonical(name));
  if (it == tests().end()) fail(fmt::format("no test named \"{}\"", name));
  return it->second(v, args);
}

void add_globals(std::unordered_map<std::string, Value>& g) {
  g["raise_exception"] = Value::function([](Args& a) -> Value {
    throw RaisedException(str(arg(a, 0, "message", Value::string(""))));
  });
  g["strftime_now"] = Value::function([](Args& a) {
    const std::string format = str(arg(a, 0, "format", Value::string("")));
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
  g["range"] = Value::function([](Args& a) {
    std::vector<int64_t> n;
    for (const Value& v : a.positional) {
      if (!v.is(K::integer)) fail(fmt::format("range() takes integers, got {}", type_name(v)));
      n.push_back(v.i);
    }
    if (n.empty() || n.size() > 3) fail("range() takes 1 to 3 integers");
    const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1], step = n.size() == 3 ? n[2] : 1;
    if (step == 0) fail("range() step cannot be zero");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (out.size() >= 1000000) fail("range() of more than 1000000 items");
      out.push_back(Value::integer(k));
    }
    return Value::make_list(std::move(out));
  });
  auto make_dict = [](bool ns) {
    return [ns](Args& a) {
      Value d = Value::make_dict();
      d.is_namespace = ns;
      for (const Value& p : a.positional) {
        if (!p.is(K::dict)) fail(fmt::format("{}() takes a dict or keyword arguments", ns ? "namespace" : "dict"));
        for (const auto& [k, v] : *p.dict) d.set(k, v);
      }
      for (const auto& [k, v] : a.named) d.set(k, v);
      return d;
    };
  };
  g["namespace"] = Value::function(make_dict(true));
  g["dict"] = Value::function(make_dict(false));
}

}  // namespace jumbo::jinja::detail
