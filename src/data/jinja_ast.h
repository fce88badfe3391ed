#pragma once
// The Jinja syntax tree: built by jinja_parser.cpp, evaluated by jinja_eval.cpp.
#include "jinja_internal.h"

namespace jumbo::jinja::detail {

struct Literal : Expr {
  Value value;
  Value eval(Context&) const override { return value; }
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value eval(Context& c) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Context& c) const override;
};
struct Name : Expr {
  std::string name;
  Value eval(Context& c) const override { return c.lookup(name); }
};
struct GetAttr : Expr {
  ExprPtr obj;
  std::string name;
  Value eval(Context& c) const override;
};
struct GetItem : Expr {
  ExprPtr obj, key;
  Value eval(Context& c) const override;
};
struct SliceExpr : Expr {
  ExprPtr obj, start, stop, step;  // each may be null
  Value eval(Context& c) const override;
};
struct CallArgs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> named;
  Args eval(Context& c) const;
};
struct Call : Expr {
  ExprPtr callee;
  CallArgs args;
  Value eval(Context& c) const override;
};
struct FilterExpr : Expr {
  ExprPtr obj;
  std::string name;
  CallArgs args;
  Value eval(Context& c) const override;
};
struct TestExpr : Expr {
  ExprPtr obj;
  std::string name;
  CallArgs args;
  bool negated = false;
  Value eval(Context& c) const override;
};
struct Unary : Expr {
  char op;  // '-', '+' or '!' (not)
  ExprPtr operand;
  Value eval(Context& c) const override;
};
struct Binary : Expr {
  std::string op;  // + - * / // % ** ~ and or
  ExprPtr left, right;
  Value eval(Context& c) const override;
};
struct Compare : Expr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // == != < <= > >= in "not in"
  Value eval(Context& c) const override;
};
struct CondExpr : Expr {
  ExprPtr then, cond, otherwise;  // otherwise may be null (undefined)
  Value eval(Context& c) const override;
};

// ---- statements ----
struct TextNode : Node {
  std::string text;
  void render(Context&, std::string& out) const override { out += text; }
};
struct OutputNode : Node {
  ExprPtr expr;
  void render(Context& c, std::string& out) const override;
};
struct IfNode : Node {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  void render(Context& c, std::string& out) const override;
};
struct ForNode : Node {
  std::vector<std::string> targets;
  ExprPtr iter, filter;  // filter may be null
  Body body, otherwise;
  void render(Context& c, std::string& out) const override;
};
// {% set a = x %}, {% set a, b = x %}, {% set ns.attr = x %}, {% set a %}...{% endset %}.
struct SetNode : Node {
  std::vector<std::string> targets;
  std::string attribute;  // ns.attr: targets[0] is ns
  ExprPtr value;          // null: the block's output
  Body body;
  void render(Context& c, std::string& out) const override;
};
struct MacroNode : Node {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last params
  Body body;
  void render(Context& c, std::string& out) const override;
};
struct FlowNode : Node {
  Flow flow;
  void render(Context& c, std::string&) const override { c.flow = flow; }
};
struct BlockNode : Node {  // {% generation %}: its body as is
  Body body;
  void render(Context& c, std::string& out) const override { render_body(body, c, out); }
};

}  // namespace jumbo::jinja::detail
