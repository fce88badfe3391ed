// The Jinja lexer: text and tags, with jinja2's whitespace control as transformers configures it
// (trim_blocks, lstrip_blocks, keep_trailing_newline off), then the tokens inside the tags.
#include <fmt/format.h>

#include <cctype>

#include "jinja_internal.h"
#include "jumbo/data/utf8.h"
#include "jumbo/config/config.h"

namespace jumbo::jinja::detail {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& where) : src_(src), where_(where) {}

  std::vector<Token> run() {
    std::string text;
    bool strip_next = false;  // a closing "-" strips the whitespace that follows
    size_t pos = 0;
    while (pos < src_.size()) {
      const size_t open = find_open(pos);
      size_t text_end = open == std::string_view::npos ? src_.size() : open;
      std::string_view chunk = src_.substr(pos, text_end - pos);
      if (strip_next) {
        size_t k = 0;
        while (k < chunk.size() && is_space(chunk[k])) ++k;
        chunk.remove_prefix(k);
        strip_next = false;
      }
      text.append(chunk);
      if (open == std::string_view::npos) break;
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {  // lstrip_blocks: blocks and comments only
        size_t k = open;
        while (k > 0 && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k;
        if (k == 0 || src_[k - 1] == '\n') {
          const size_t n = std::min(open - k, text.size());
          text.resize(text.size() - n);
        }
      }
      flush_text(text, line_at(open));
      pos = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
      const int line = line_at(open);
      if (kind == '#') {
        const size_t close = src_.find("#}", pos);
        if (close == std::string_view::npos) error(line, "a comment \"{#\" not closed by \"#}\"");
        const bool minus = close > pos && src_[close - 1] == '-';
        const bool plus = close > pos && src_[close - 1] == '+';
        pos = close + 2;
        after_tag(pos, minus, plus, strip_next);
        continue;
      }
      if (kind == '%' && is_raw(pos)) {
        pos = lex_raw(pos, line, text, strip_next);
        continue;
      }
      tokens_.push_back({kind == '{' ? Tok::var_open : Tok::block_open, "", line});
      const char end = kind == '{' ? '}' : '%';
      bool minus = false, plus = false;
      pos = lex_tag(pos, end, minus, plus);
      tokens_.push_back({kind == '{' ? Tok::var_close : Tok::block_close, "", line_at(pos - 1)});
      if (kind == '%') after_tag(pos, minus, plus, strip_next);
      else strip_next = minus;
    }
    flush_text(text, line_at(src_.size()));
    tokens_.push_back({Tok::eof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::string_view src_;
  const std::string& where_;
  std::vector<Token> tokens_;

  [[noreturn]] void error(int line, const std::string& what) const {
    throw UserError(fmt::format("{}:{}: {}", where_, line, what));
  }

  int line_at(size_t pos) const {
    int line = 1;
    for (size_t k = 0; k < pos && k < src_.size(); ++k) line += src_[k] == '\n';
    return line;
  }

  size_t find_open(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string_view::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string_view::npos;
  }

  void flush_text(std::string& text, int line) {
    if (text.empty()) return;
    std::string normalized;  // jinja2 writes every line ending of the text as "\n"
    for (size_t k = 0; k < text.size(); ++k) {
      if (text[k] == '\r') {
        normalized += '\n';
        if (k + 1 < text.size() && text[k + 1] == '\n') ++k;
      } else {
        normalized += text[k];
      }
    }
    tokens_.push_back({Tok::text, std::move(normalized), line});
    text.clear();
  }

  // After "%}" or "#}": "-" strips the whitespace that follows, trim_blocks one newline.
  void after_tag(size_t& pos, bool minus, bool plus, bool& strip_next) const {
    if (minus) {
      strip_next = true;
    } else if (!plus) {
      if (pos < src_.size() && src_[pos] == '\n') ++pos;
      else if (pos + 1 < src_.size() && src_[pos] == '\r' && src_[pos + 1] == '\n') pos += 2;
    }
  }

  bool is_raw(size_t pos) const {
    while (pos < src_.size() && is_space(src_[pos])) ++pos;
    return src_.substr(pos, 3) == "raw" && (pos + 3 >= src_.size() || !std::isalnum(static_cast<unsigned char>(src_[pos + 3])));
  }

  size_t lex_raw(size_t pos, int line, std::string& text, bool& strip_next) {
    size_t close = src_.find("%}", pos);
    if (close == std::string_view::npos) error(line, "\"{% raw\" not closed by \"%}\"");
    pos = close + 2;
    after_tag(pos, src_[close - 1] == '-', src_[close - 1] == '+', strip_next);
    for (size_t k = src_.find("{%", pos); k != std::string_view::npos; k = src_.find("{%", k + 2)) {
      size_t q = k + 2;
      const bool minus = q < src_.size() && src_[q] == '-';
      if (minus || (q < src_.size() && src_[q] == '+')) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.substr(q, 6) != "endraw") continue;
      std::string body(src_.substr(pos, k - pos));
      if (strip_next) {
        size_t s = 0;
        while (s < body.size() && is_space(body[s])) ++s;
        body.erase(0, s);
        strip_next = false;
      }
      if (minus) while (!body.empty() && is_space(body.back())) body.pop_back();
      text += body;
      const size_t end = src_.find("%}", q);
      if (end == std::string_view::npos) error(line_at(k), "\"{% endraw\" not closed by \"%}\"");
      size_t after = end + 2;
      after_tag(after, src_[end - 1] == '-', src_[end - 1] == '+', strip_next);
      return after;
    }
    error(line, "\"{% raw %}\" without \"{% endraw %}\"");
  }

  // The tokens of a tag up to its "}}" or "%}"; returns the position after it.
  size_t lex_tag(size_t pos, char end, bool& minus, bool& plus) {
    const int open_line = line_at(pos);
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        error(open_line, fmt::format("a tag opened here is not closed by \"{}}}\"", end == '}' ? "}" : "%"));
      }
      const char c = src_[pos];
      if ((c == '-' || c == '+') && pos + 2 < src_.size() + 0 && src_[pos + 1] == end && src_[pos + 2] == '}') {
        (c == '-' ? minus : plus) = true;
        return pos + 3;
      }
      if (c == end && pos + 1 < src_.size() && src_[pos + 1] == '}') return pos + 2;
      const int line = line_at(pos);
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens_.push_back({Tok::name, std::string(src_.substr(pos, e - pos)), line});
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = lex_number(pos, line);
      } else if (c == '"' || c == '\'') {
        pos = lex_string(pos, line);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* t : two) {
          if (src_.substr(pos, 2) == t) op = t;
        }
        if (op.size() == 1 && std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
          error(line, fmt::format("unexpected character {:?} in a tag", std::string(1, c)));
        }
        tokens_.push_back({Tok::op, op, line});
        pos += op.size();
      }
    }
  }

  size_t lex_number(size_t pos, int line) {
    size_t e = pos;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        e = q;
        digits();
      }
    }
    std::string text;
    for (size_t k = pos; k < e; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    tokens_.push_back({is_float ? Tok::floating : Tok::integer, text, line});
    return e;
  }

  // Python's string escapes, as jinja2 decodes them.
  size_t lex_string(size_t pos, int line) {
    const char quote = src_[pos];
    std::string value;
    size_t k = pos + 1;
    while (true) {
      if (k >= src_.size()) error(line, "a string not closed before the end of the template");
      const char c = src_[k];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) error(line, "a string not closed before the end of the template");
      const char e = src_[k + 1];
      k += 2;
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case 'a': value += '\a'; break;
        case '0': value += '\0'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (k + n > src_.size()) error(line, "a truncated \\x, \\u or \\U escape in a string");
          uint32_t cp = 0;
          for (size_t q = 0; q < n; ++q) {
            const char h = src_[k + q];
            if (!std::isxdigit(static_cast<unsigned char>(h))) error(line, "a bad \\x, \\u or \\U escape in a string");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
          }
          k += n;
          append_utf8(value, cp);
          break;
        }
        default: value += '\\'; value += e; break;  // Python keeps unknown escapes
      }
    }
    tokens_.push_back({Tok::string, std::move(value), line});
    return k + 1;
  }
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& where) {
  // keep_trailing_newline is off: one newline at the very end is not part of the output.
  if (source.ends_with("\r\n")) source.remove_suffix(2);
  else if (source.ends_with("\n")) source.remove_suffix(1);
  return Lexer(source, where).run();
}

}  // namespace jumbo::jinja::detail
