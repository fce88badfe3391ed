// The Jinja parser: tokens to the syntax tree, with jinja2's operator precedence. A syntax error
// is a UserError naming the template, the line and what was expected there.
#include <fmt/format.h>

#include "jinja_ast.h"
#include "jumbo/config/config.h"

namespace jumbo::jinja::detail {
namespace {

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::text: return "text";
    case Tok::var_open: return "\"{{\"";
    case Tok::var_close: return "\"}}\"";
    case Tok::block_open: return "\"{%\"";
    case Tok::block_close: return "\"%}\"";
    case Tok::string: return fmt::format("the string {:?}", t.text.substr(0, 40));
    case Tok::eof: return "the end of the template";
    default: return fmt::format("\"{}\"", t.text);
  }
}

template <class T>
std::unique_ptr<T> make(int line) {
  auto p = std::make_unique<T>();
  p->line = line;
  return p;
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& where) : t_(tokens), where_(where) {}

  Body parse_all() {
    Body body = parse_body({});
    if (peek().kind != Tok::eof) unexpected("the end of the template");
    return body;
  }

 private:
  const std::vector<Token>& t_;
  const std::string& where_;
  size_t pos_ = 0;

  const Token& peek(size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  bool at_op(std::string_view op, size_t ahead = 0) const { return peek(ahead).kind == Tok::op && peek(ahead).text == op; }
  bool at_name(std::string_view name, size_t ahead = 0) const { return peek(ahead).kind == Tok::name && peek(ahead).text == name; }

  [[noreturn]] void error(int line, const std::string& what) const {
    throw UserError(fmt::format("{}:{}: {}", where_, line, what));
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    error(peek().line, fmt::format("expected {}, got {}", expected, describe(peek())));
  }
  void expect_op(std::string_view op) {
    if (!at_op(op)) unexpected(fmt::format("\"{}\"", op));
    ++pos_;
  }
  std::string expect_name(const std::string& what = "a name") {
    if (peek().kind != Tok::name) unexpected(what);
    return next().text;
  }
  void expect_block_close() {
    if (peek().kind != Tok::block_close) unexpected("\"%}\"");
    ++pos_;
  }

  // Statements up to a {% NAME %} whose name is in `ends` (left unconsumed, after "{%").
  Body parse_body(const std::vector<std::string_view>& ends) {
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.kind == Tok::eof) {
        if (!ends.empty()) {
          std::string names;
          for (auto e : ends) names += fmt::format("{}\"{{% {} %}}\"", names.empty() ? "" : " or ", e);
          error(tok.line, fmt::format("expected {} before the end of the template", names));
        }
        return body;
      }
      if (tok.kind == Tok::text) {
        auto n = make<TextNode>(tok.line);
        n->text = next().text;
        body.push_back(std::move(n));
      } else if (tok.kind == Tok::var_open) {
        ++pos_;
        auto n = make<OutputNode>(tok.line);
        n->expr = parse_tuple_or_expr();
        if (peek().kind != Tok::var_close) unexpected("\"}}\"");
        ++pos_;
        body.push_back(std::move(n));
      } else if (tok.kind == Tok::block_open) {
        const Token& name = peek(1);
        if (name.kind != Tok::name) {
          ++pos_;
          unexpected("a statement name (if, for, set, macro, ...)");
        }
        for (auto e : ends) {
          if (name.text == e) {
            ++pos_;  // "{%": the caller reads the name
            return body;
          }
        }
        ++pos_;
        body.push_back(parse_statement(ends));
      } else {
        unexpected("text, \"{{\" or \"{%\"");
      }
    }
  }

  NodePtr parse_statement(const std::vector<std::string_view>& ends) {
    const Token& name = next();
    const std::string& s = name.text;
    if (s == "if") return parse_if(name.line);
    if (s == "for") return parse_for(name.line);
    if (s == "set") return parse_set(name.line);
    if (s == "macro") return parse_macro(name.line);
    if (s == "break" || s == "continue") {
      auto n = make<FlowNode>(name.line);
      n->flow = s == "break" ? Flow::break_loop : Flow::continue_loop;
      expect_block_close();
      return n;
    }
    if (s == "generation") {
      expect_block_close();
      auto n = make<BlockNode>(name.line);
      n->body = parse_body({"endgeneration"});
      ++pos_;
      expect_block_close();
      return n;
    }
    std::string inside;
    for (auto e : ends) inside += fmt::format("{}{}", inside.empty() ? "" : ", ", e);
    error(name.line, fmt::format("unknown statement \"{}\" (expected if, for, set, macro, break, "
                                 "continue, generation{}{})", s, inside.empty() ? "" : ", or here ", inside));
  }

  NodePtr parse_if(int line) {
    auto n = make<IfNode>(line);
    ExprPtr cond = parse_expr();
    while (true) {
      expect_block_close();
      Body body = parse_body({"elif", "else", "endif"});
      n->branches.emplace_back(std::move(cond), std::move(body));
      const std::string tag = next().text;
      if (tag == "elif") {
        cond = parse_expr();
        continue;
      }
      if (tag == "else") {
        expect_block_close();
        n->otherwise = parse_body({"endif"});
        ++pos_;
      }
      expect_block_close();
      return n;
    }
  }

  NodePtr parse_for(int line) {
    auto n = make<ForNode>(line);
    n->targets.push_back(expect_name("a loop variable"));
    while (at_op(",")) {
      ++pos_;
      n->targets.push_back(expect_name("a loop variable"));
    }
    if (!at_name("in")) unexpected("\"in\"");
    ++pos_;
    n->iter = parse_or(/*allow_cond=*/false);
    if (at_name("if")) {
      ++pos_;
      n->filter = parse_expr();
    }
    if (at_name("recursive")) error(peek().line, "recursive loops are not supported");
    expect_block_close();
    n->body = parse_body({"else", "endfor"});
    if (next().text == "else") {
      expect_block_close();
      n->otherwise = parse_body({"endfor"});
      ++pos_;
    }
    expect_block_close();
    return n;
  }

  NodePtr parse_set(int line) {
    auto n = make<SetNode>(line);
    n->targets.push_back(expect_name("a variable name"));
    if (at_op(".")) {
      ++pos_;
      n->attribute = expect_name("an attribute name");
    } else {
      while (at_op(",")) {
        ++pos_;
        n->targets.push_back(expect_name("a variable name"));
      }
    }
    if (peek().kind == Tok::block_close && n->targets.size() == 1 && n->attribute.empty()) {
      ++pos_;
      n->body = parse_body({"endset"});
      ++pos_;
      expect_block_close();
      return n;
    }
    expect_op("=");
    n->value = parse_tuple_or_expr();
    expect_block_close();
    return n;
  }

  NodePtr parse_macro(int line) {
    auto n = make<MacroNode>(line);
    n->name = expect_name("the macro's name");
    expect_op("(");
    while (!at_op(")")) {
      n->params.push_back(expect_name("a parameter name"));
      if (at_op("=")) {
        ++pos_;
        n->defaults.push_back(parse_expr());
      } else if (!n->defaults.empty()) {
        error(peek().line, fmt::format("the macro parameter \"{}\" without a default follows one with", n->params.back()));
      }
      if (!at_op(",")) break;
      ++pos_;
    }
    expect_op(")");
    expect_block_close();
    n->body = parse_body({"endmacro"});
    ++pos_;
    expect_block_close();
    return n;
  }

  // ---- expressions ----
  ExprPtr parse_tuple_or_expr() {
    const int line = peek().line;
    ExprPtr first = parse_expr();
    if (!at_op(",")) return first;
    auto list = make<ListExpr>(line);  // a tuple, as a list
    list->items.push_back(std::move(first));
    while (at_op(",")) {
      ++pos_;
      if (peek().kind == Tok::var_close || peek().kind == Tok::block_close) break;
      list->items.push_back(parse_expr());
    }
    return list;
  }

  ExprPtr parse_expr() { return parse_or(true); }

  ExprPtr parse_or(bool allow_cond) {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      auto b = make<Binary>(peek().line);
      ++pos_;
      b->op = "or";
      b->left = std::move(left);
      b->right = parse_and();
      left = std::move(b);
    }
    if (allow_cond && at_name("if")) {
      auto c = make<CondExpr>(peek().line);
      ++pos_;
      c->then = std::move(left);
      c->cond = parse_or(false);
      if (at_name("else")) {
        ++pos_;
        c->otherwise = parse_or(true);
      }
      return c;
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      auto b = make<Binary>(peek().line);
      ++pos_;
      b->op = "and";
      b->left = std::move(left);
      b->right = parse_not();
      left = std::move(b);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      auto u = make<Unary>(peek().line);
      ++pos_;
      u->op = '!';
      u->operand = parse_not();
      return u;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = peek().line;
    ExprPtr first = parse_math1();
    std::vector<std::pair<std::string, ExprPtr>> rest;
    while (true) {
      std::string op;
      if (peek().kind == Tok::op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                     peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        ++pos_;
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      rest.emplace_back(op, parse_math1());
    }
    if (rest.empty()) return first;
    auto c = make<Compare>(line);
    c->first = std::move(first);
    c->rest = std::move(rest);
    return c;
  }

  ExprPtr binary_chain(ExprPtr (Parser::*operand)(), std::initializer_list<std::string_view> ops) {
    ExprPtr left = (this->*operand)();
    while (true) {
      bool hit = false;
      for (auto op : ops) hit = hit || at_op(op);
      if (!hit) return left;
      auto b = make<Binary>(peek().line);
      b->op = next().text;
      b->left = std::move(left);
      b->right = (this->*operand)();
      left = std::move(b);
    }
  }
  ExprPtr parse_math1() { return binary_chain(&Parser::parse_concat, {"+", "-"}); }
  ExprPtr parse_concat() { return binary_chain(&Parser::parse_math2, {"~"}); }
  ExprPtr parse_math2() { return binary_chain(&Parser::parse_pow, {"*", "/", "//", "%"}); }
  ExprPtr parse_pow() { return binary_chain(&Parser::parse_unary_filtered, {"**"}); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      auto u = make<Unary>(peek().line);
      u->op = next().text[0];
      u->operand = parse_unary(false);
      node = std::move(u);
    } else {
      node = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(node)) : std::move(node);
  }

  ExprPtr parse_primary() {
    const Token& tok = peek();
    switch (tok.kind) {
      case Tok::name: {
        ++pos_;
        const std::string& s = tok.text;
        auto lit = make<Literal>(tok.line);
        if (s == "true" || s == "True") lit->value = Value::boolean(true);
        else if (s == "false" || s == "False") lit->value = Value::boolean(false);
        else if (s == "none" || s == "None") lit->value = Value::none();
        else {
          auto n = make<Name>(tok.line);
          n->name = s;
          return n;
        }
        return lit;
      }
      case Tok::string: {
        auto lit = make<Literal>(tok.line);
        std::string s;
        while (peek().kind == Tok::string) s += next().text;  // adjacent strings join
        lit->value = Value::string(std::move(s));
        return lit;
      }
      case Tok::integer: case Tok::floating: {
        ++pos_;
        auto lit = make<Literal>(tok.line);
        try {
          lit->value = tok.kind == Tok::integer ? Value::integer(std::stoll(tok.text)) : Value::floating(std::stod(tok.text));
        } catch (const std::exception&) {
          error(tok.line, fmt::format("the number {} is out of range", tok.text));
        }
        return lit;
      }
      case Tok::op:
        if (tok.text == "(") {
          ++pos_;
          if (at_op(")")) {
            ++pos_;
            return make<ListExpr>(tok.line);  // ()
          }
          ExprPtr e = parse_expr();
          if (at_op(",")) {
            auto list = make<ListExpr>(tok.line);
            list->items.push_back(std::move(e));
            while (at_op(",")) {
              ++pos_;
              if (at_op(")")) break;
              list->items.push_back(parse_expr());
            }
            e = std::move(list);
          }
          expect_op(")");
          return e;
        }
        if (tok.text == "[") {
          ++pos_;
          auto list = make<ListExpr>(tok.line);
          while (!at_op("]")) {
            list->items.push_back(parse_expr());
            if (!at_op(",")) break;
            ++pos_;
          }
          expect_op("]");
          return list;
        }
        if (tok.text == "{") {
          ++pos_;
          auto dict = make<DictExpr>(tok.line);
          while (!at_op("}")) {
            ExprPtr key = parse_expr();
            expect_op(":");
            dict->items.emplace_back(std::move(key), parse_expr());
            if (!at_op(",")) break;
            ++pos_;
          }
          expect_op("}");
          return dict;
        }
        break;
      default: break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const int line = peek().line;
      if (at_op(".")) {
        ++pos_;
        if (peek().kind == Tok::integer) {
          auto g = make<GetItem>(line);
          auto key = make<Literal>(line);
          key->value = Value::integer(std::stoll(next().text));
          g->obj = std::move(node);
          g->key = std::move(key);
          node = std::move(g);
          continue;
        }
        auto g = make<GetAttr>(line);
        g->obj = std::move(node);
        g->name = expect_name("an attribute name after \".\"");
        node = std::move(g);
      } else if (at_op("[")) {
        ++pos_;
        node = parse_subscript(std::move(node), line);
      } else if (at_op("(")) {
        auto call = make<Call>(line);
        call->callee = std::move(node);
        call->args = parse_call_args();
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    int colons = 0;
    while (!at_op("]")) {
      if (at_op(":")) {
        if (++colons > 2) unexpected("\"]\"");
        ++pos_;
        continue;
      }
      if (parts[colons]) unexpected(colons ? "\":\" or \"]\"" : "\":\" or \"]\"");
      parts[colons] = parse_expr();
    }
    expect_op("]");
    if (colons == 0) {
      if (!parts[0]) error(line, "expected an index inside \"[]\"");
      auto g = make<GetItem>(line);
      g->obj = std::move(obj);
      g->key = std::move(parts[0]);
      return g;
    }
    auto s = make<SliceExpr>(line);
    s->obj = std::move(obj);
    s->start = std::move(parts[0]);
    s->stop = std::move(parts[1]);
    s->step = std::move(parts[2]);
    return s;
  }

  CallArgs parse_call_args() {
    expect_op("(");
    CallArgs args;
    while (!at_op(")")) {
      if (peek().kind == Tok::name && at_op("=", 1)) {
        std::string name = next().text;
        ++pos_;
        args.named.emplace_back(std::move(name), parse_expr());
      } else {
        if (!args.named.empty()) unexpected("a keyword argument (positional ones come first)");
        args.positional.push_back(parse_expr());
      }
      if (!at_op(",")) break;
      ++pos_;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_filters(ExprPtr node) {
    while (true) {
      const int line = peek().line;
      if (at_op("|")) {
        ++pos_;
        auto f = make<FilterExpr>(line);
        f->name = expect_name("a filter name after \"|\"");
        while (at_op(".")) {
          ++pos_;
          f->name += "." + expect_name("a filter name");
        }
        if (!has_filter(f->name)) error(line, fmt::format("no filter named \"{}\"", f->name));
        if (at_op("(")) f->args = parse_call_args();
        f->obj = std::move(node);
        node = std::move(f);
      } else if (at_name("is")) {
        ++pos_;
        auto t = make<TestExpr>(line);
        if (at_name("not")) {
          ++pos_;
          t->negated = true;
        }
        t->name = expect_name("a test name after \"is\"");
        if (!has_test(t->name)) error(line, fmt::format("no test named \"{}\"", t->name));
        if (at_op("(")) {
          t->args = parse_call_args();
        } else {
          const Token& a = peek();
          const bool arg = a.kind == Tok::string || a.kind == Tok::integer || a.kind == Tok::floating ||
                           (a.kind == Tok::name && a.text != "else" && a.text != "or" && a.text != "and" &&
                            a.text != "not" && a.text != "in" && a.text != "is" && a.text != "if") ||
                           (a.kind == Tok::op && (a.text == "[" || a.text == "{"));
          if (arg) t->args.positional.push_back(parse_postfix(parse_primary()));
        }
        t->obj = std::move(node);
        node = std::move(t);
      } else {
        return node;
      }
    }
  }
};

}  // namespace

std::shared_ptr<Program> parse(const std::vector<Token>& tokens, const std::string& where) {
  auto program = std::make_shared<Program>();
  program->where = where;
  program->body = Parser(tokens, where).parse_all();
  return program;
}

}  // namespace jumbo::jinja::detail
