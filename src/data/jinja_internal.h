#pragma once
// The Jinja interpreter's parts (jumbo/data/jinja.h): values, tokens, the syntax tree.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jumbo/data/jinja.h"

namespace jumbo::jinja::detail {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // in insertion order, as Python's
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};
using Function = std::function<Value(Args&)>;

struct Value {
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, function };
  Kind kind = Kind::undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // a string's bytes, or an undefined value's name (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> fn;
  bool is_namespace = false;  // a dict made by namespace(): its attributes can be set

  static Value undefined(std::string name = "");
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value make_list(List v = {});
  static Value make_dict(Dict v = {});
  static Value function(Function f);

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  double number() const { return kind == Kind::floating ? f : kind == Kind::boolean ? (b ? 1 : 0) : double(i); }
  const Value* find(std::string_view key) const;  // a dict's entry, or nullptr
  void set(const std::string& key, Value v);      // a dict's entry, added or replaced
};

[[noreturn]] void fail(const std::string& message);  // throws RenderError
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
std::string type_name(const Value& v);
std::string str(const Value& v);   // Python's str()
std::string repr(const Value& v);  // Python's repr()
// json.dumps(v, ensure_ascii=False, indent=indent, separators=...) (indent < 0: none).
std::string to_json(const Value& v, int indent);
Value from_json(const nlohmann::ordered_json& j);
std::vector<Value> iterate(const Value& v);  // for loops, list(), filters: keys of a dict
int64_t length(const Value& v);
// UTF-8 string helpers: code points, Python's str.strip() whitespace.
std::vector<std::string> code_points(const std::string& s);
std::string strip(const std::string& s, const std::string* chars, bool left, bool right);

Value binary(const std::string& op, const Value& a, const Value& b);
bool compare(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
Value subscript(const Value& obj, const Value& key);
Value attribute(const Value& obj, const std::string& name);  // methods bound to obj included
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

Value apply_filter(const std::string& name, const Value& v, Args& args);
bool apply_test(const std::string& name, const Value& v, Args& args);
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
void add_globals(std::unordered_map<std::string, Value>& globals);

// ---- tokens ----
enum class Tok { text, var_open, var_close, block_open, block_close, name, string, integer, floating, op, eof };
struct Token {
  Tok kind;
  std::string text;  // a string token's value (escapes decoded), else the source text
  int line;
};
std::vector<Token> lex(std::string_view source, const std::string& where);

// ---- syntax tree ----
struct Context;
struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  virtual Value eval(Context& c) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  int line = 0;
  virtual ~Node() = default;
  virtual void render(Context& c, std::string& out) const = 0;
};
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Program {
  Body body;
  std::string where;
};
std::shared_ptr<Program> parse(const std::vector<Token>& tokens, const std::string& where);

enum class Flow { normal, break_loop, continue_loop };
struct Context {
  std::vector<std::unordered_map<std::string, Value>> frames;  // [0] globals, [1] the template's
  Flow flow = Flow::normal;
  int depth = 0;  // macro calls, bounded
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v) { frames.back()[name] = std::move(v); }
};
void render_body(const Body& body, Context& c, std::string& out);

}  // namespace jumbo::jinja::detail
