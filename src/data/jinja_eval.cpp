// The Jinja evaluator: expressions to values, statements to text, with jinja2's scoping (a for
// loop's body and a macro have their own variables; `if` does not; namespace() objects cross).
#include <fmt/format.h>

#include "jinja_ast.h"
#include "jumbo/config/config.h"

namespace jumbo::jinja::detail {

Value Context::lookup(const std::string& name) const {
  for (auto f = frames.rbegin(); f != frames.rend(); ++f) {
    if (auto it = f->find(name); it != f->end()) return it->second;
  }
  return Value::undefined(name);
}

void render_body(const Body& body, Context& c, std::string& out) {
  for (const NodePtr& n : body) {
    n->render(c, out);
    if (c.flow != Flow::normal) return;
  }
}

Value ListExpr::eval(Context& c) const {
  List out;
  for (const ExprPtr& e : items) out.push_back(e->eval(c));
  return Value::make_list(std::move(out));
}

Value DictExpr::eval(Context& c) const {
  Value d = Value::make_dict();
  for (const auto& [k, v] : items) {
    const Value key = k->eval(c);
    if (!key.is(Value::Kind::string)) fail(fmt::format("a dict key must be a string here, got {}", type_name(key)));
    d.set(key.s, v->eval(c));
  }
  return d;
}

Value GetAttr::eval(Context& c) const { return attribute(obj->eval(c), name); }
Value GetItem::eval(Context& c) const { return subscript(obj->eval(c), key->eval(c)); }

Value SliceExpr::eval(Context& c) const {
  auto opt = [&](const ExprPtr& e) { return e ? e->eval(c) : Value::none(); };
  return slice(obj->eval(c), opt(start), opt(stop), opt(step));
}

Args CallArgs::eval(Context& c) const {
  Args a;
  for (const ExprPtr& e : positional) a.positional.push_back(e->eval(c));
  for (const auto& [k, e] : named) a.named.emplace_back(k, e->eval(c));
  return a;
}

Value Call::eval(Context& c) const {
  const Value f = callee->eval(c);
  if (!f.is(Value::Kind::function)) {
    if (f.is(Value::Kind::undefined)) fail(fmt::format("'{}' is undefined", f.s));
    fail(fmt::format("{} is not callable", type_name(f)));
  }
  Args a = args.eval(c);
  return (*f.fn)(a);
}

Value FilterExpr::eval(Context& c) const {
  Args a = args.eval(c);
  return apply_filter(name, obj->eval(c), a);
}

Value TestExpr::eval(Context& c) const {
  Args a = args.eval(c);
  return Value::boolean(apply_test(name, obj->eval(c), a) != negated);
}

Value Unary::eval(Context& c) const {
  const Value v = operand->eval(c);
  if (op == '!') return Value::boolean(!truthy(v));
  if (op == '+') return binary("+", Value::integer(0), v);
  return binary("-", Value::integer(0), v);
}

Value Binary::eval(Context& c) const {
  if (op == "and") {
    Value l = left->eval(c);
    return truthy(l) ? right->eval(c) : l;
  }
  if (op == "or") {
    Value l = left->eval(c);
    return truthy(l) ? l : right->eval(c);
  }
  return binary(op, left->eval(c), right->eval(c));
}

Value Compare::eval(Context& c) const {
  Value l = first->eval(c);
  for (const auto& [op, e] : rest) {
    Value r = e->eval(c);
    bool ok;
    if (op == "in") ok = contains(r, l);
    else if (op == "not in") ok = !contains(r, l);
    else ok = compare(op, l, r);
    if (!ok) return Value::boolean(false);
    l = std::move(r);
  }
  return Value::boolean(true);
}

Value CondExpr::eval(Context& c) const {
  if (truthy(cond->eval(c))) return then->eval(c);
  return otherwise ? otherwise->eval(c) : Value::undefined("the else branch of an if expression");
}

void OutputNode::render(Context& c, std::string& out) const { out += str(expr->eval(c)); }

void IfNode::render(Context& c, std::string& out) const {
  for (const auto& [cond, body] : branches) {
    if (truthy(cond->eval(c))) return render_body(body, c, out);
  }
  render_body(otherwise, c, out);
}

namespace {

void bind_targets(Context& c, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) return c.assign(targets[0], v);
  const std::vector<Value> items = iterate(v);
  if (items.size() != targets.size()) {
    fail(fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
  }
  for (size_t k = 0; k < targets.size(); ++k) c.assign(targets[k], items[k]);
}

}  // namespace

void ForNode::render(Context& c, std::string& out) const {
  const Value seq = iter->eval(c);
  if (seq.is(Value::Kind::undefined) && !seq.s.empty()) {
    // jinja2's Undefined iterates as empty
  } else if (!seq.is(Value::Kind::undefined) && !seq.is(Value::Kind::list) && !seq.is(Value::Kind::dict) &&
             !seq.is(Value::Kind::string)) {
    fail(fmt::format("{} is not iterable", type_name(seq)));
  }
  std::vector<Value> items = iterate(seq);
  if (filter) {
    std::vector<Value> kept;
    for (const Value& item : items) {
      c.frames.emplace_back();
      bind_targets(c, targets, item);
      const bool keep = truthy(filter->eval(c));
      c.frames.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    c.frames.emplace_back();
    render_body(otherwise, c, out);
    c.frames.pop_back();
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    c.frames.emplace_back();
    Value loop = Value::make_dict();
    loop.set("index", Value::integer(k + 1));
    loop.set("index0", Value::integer(k));
    loop.set("revindex", Value::integer(n - k));
    loop.set("revindex0", Value::integer(n - k - 1));
    loop.set("first", Value::boolean(k == 0));
    loop.set("last", Value::boolean(k == n - 1));
    loop.set("length", Value::integer(n));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", k > 0 ? items[k - 1] : Value::undefined("loop.previtem"));
    loop.set("nextitem", k + 1 < n ? items[k + 1] : Value::undefined("loop.nextitem"));
    loop.set("cycle", Value::function([k](Args& a) {
      if (a.positional.empty()) fail("loop.cycle() needs at least one value");
      return a.positional[k % a.positional.size()];
    }));
    c.assign("loop", loop);
    bind_targets(c, targets, items[k]);
    render_body(body, c, out);
    c.frames.pop_back();
    const Flow flow = c.flow;
    c.flow = Flow::normal;
    if (flow == Flow::break_loop) break;
  }
}

void SetNode::render(Context& c, std::string& out) const {
  (void)out;
  Value v;
  if (value) {
    v = value->eval(c);
  } else {
    std::string text;
    render_body(body, c, text);
    v = Value::string(std::move(text));
  }
  if (!attribute.empty()) {
    Value ns = c.lookup(targets[0]);
    if (!ns.is(Value::Kind::dict) || !ns.is_namespace) {
      fail(fmt::format("cannot set the attribute \"{}\" of {} (only of a namespace())", attribute, type_name(ns)));
    }
    ns.set(attribute, std::move(v));  // shares the namespace's entries
    return;
  }
  bind_targets(c, targets, v);
}

void MacroNode::render(Context& c, std::string& out) const {
  (void)out;
  const MacroNode* self = this;
  // The macro sees the globals and the template's variables at the time of the call.
  Context* caller = &c;
  c.assign(name, Value::function([self, caller](Args& a) {
    if (caller->depth > 64) fail(fmt::format("macro {} nested more than 64 deep", self->name));
    Context m;
    m.frames.push_back(caller->frames[0]);
    if (caller->frames.size() > 1) m.frames.push_back(caller->frames[1]);
    m.frames.emplace_back();
    m.depth = caller->depth + 1;
    const size_t np = self->params.size(), nd = self->defaults.size();
    if (a.positional.size() > np) fail(fmt::format("macro {} takes {} arguments, got {}", self->name, np, a.positional.size()));
    for (size_t k = 0; k < np; ++k) {
      const std::string& p = self->params[k];
      const Value* given = k < a.positional.size() ? &a.positional[k] : nullptr;
      for (const auto& [key, v] : a.named) {
        if (key == p) given = &v;
      }
      if (given) m.assign(p, *given);
      else if (k >= np - nd) m.assign(p, self->defaults[k - (np - nd)]->eval(m));
      else m.assign(p, Value::undefined(p));
    }
    std::string text;
    render_body(self->body, m, text);
    return Value::string(std::move(text));
  }));
}

}  // namespace jumbo::jinja::detail

namespace jumbo::jinja {

Template::Template(std::string_view source, const std::string& where)
    : program_(detail::parse(detail::lex(source, where), where)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& variables) const {
  detail::Context c;
  c.frames.emplace_back();
  detail::add_globals(c.frames[0]);
  if (variables.is_object()) {
    for (const auto& [k, v] : variables.items()) c.frames[0][k] = detail::from_json(v);
  }
  c.frames.emplace_back();
  std::string out;
  detail::render_body(program_->body, c, out);
  return out;
}

}  // namespace jumbo::jinja
