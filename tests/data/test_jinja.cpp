// The Jinja interpreter (data/jinja.h) piece by piece: each case's expected text is what jinja2
// (trim_blocks, lstrip_blocks, as transformers configures it) renders.
#include <gtest/gtest.h>

#include "data_test_support.h"
#include "jumbo/data/jinja.h"

namespace jumbo {
namespace {

using jinja::Template;
using json = nlohmann::ordered_json;

std::string render(const std::string& source, const json& vars = json::object()) {
  return Template(source, "t.jinja").render(vars);
}

std::string syntax_error(const std::string& source) {
  return test::user_error_of([&] { Template(source, "t.jinja"); });
}

TEST(Jinja, TextOutputAndComments) {
  EXPECT_EQ(render("plain"), "plain");
  EXPECT_EQ(render("a{{ 1 + 2 }}b{# note #}c"), "a3bc");
  EXPECT_EQ(render("{{ x }}|{{ y }}", {{"x", "X"}}), "X|");  // undefined prints as ""
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true }}"), "a1NoneTrue");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"), "3 -4 1 2 3.5 1024");
  EXPECT_EQ(render("{{ 'ab' * 3 }}{{ 1.0 }}{{ [1, 'x'] }}{{ {'k': none} }}"), "ababab1.0[1, 'x']{'k': None}");
  EXPECT_EQ(render("{{ \"q\\\"\\n\\t\\u00e9\" }}"), "q\"\n\t\xC3\xA9");
  EXPECT_EQ(render("line\n"), "line");  // one trailing newline of the source is dropped
}

TEST(Jinja, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(render("a  {{- 'b' -}}  \n c"), "abc");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
  EXPECT_EQ(render("<\n  {% if true %}\n  x\n  {% endif %}\n>"), "<\n  x\n>");
  EXPECT_EQ(render("<\n  {# c #}\n>"), "<\n>");
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");  // not at a line's start: kept
  EXPECT_EQ(render("  {{ 'v' }}\n"), "  v");                // variables are not lstripped
  EXPECT_EQ(render("{%- if true %}\n\n  x{%- endif %}\n"), "\n  x");
  EXPECT_EQ(render("<\n  {%+ if true %}x{% endif +%}\n>"), "<\n  x\n>");
  EXPECT_EQ(render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
}

TEST(Jinja, IfForAndLoopVariables) {
  EXPECT_EQ(render("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}"), "c");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }}{{ loop.revindex }}{{ loop.previtem }}{{ x }};{% endfor %}",
                   {{"xs", {"a", "b"}}}),
            "10TrueFalse22a;21FalseTrue21ab;");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"), "2/2 4/2 ");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"), "a=1,b=2,");
  EXPECT_EQ(render("{% for k in {'z': 1, 'a': 2} %}{{ k }}{% endfor %}"), "za");  // insertion order
  EXPECT_EQ(render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}"
                   "{% endif %}{{ x }}{% endfor %}"), "02");
  EXPECT_EQ(render("{% for x in undefined_list %}x{% endfor %}."), ".");
  EXPECT_EQ(render("{% for x in 'héllo' %}{{ x }}|{% endfor %}"), "h|é|l|l|o|");
  EXPECT_EQ(render("{{ 'yes' if 1 < 2 < 3 else 'no' }}{{ 'x' if false }}"), "yes");
}

TEST(Jinja, SetScopesAndNamespaces) {
  // A loop's body has its own variables; an if does not; namespace() crosses the loop.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(render("{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.index = 0 %}{{ ns.index }}"), "0");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set block %}in {{ 'side' }}{% endset %}[{{ block }}]"), "[in side]");
  EXPECT_EQ(render("{% set messages = messages[1:] %}{{ messages | length }}", {{"messages", {1, 2, 3}}}), "2");
  EXPECT_EQ(render("{% macro tag(name, v='x') %}<{{ name }}={{ v }}>{% endmacro %}{{ tag('a') }}{{ tag('b', v=2) }}"),
            "<a=x><b=2>");
}

TEST(Jinja, AccessSlicesAndMethods) {
  const json vars = {{"m", {{"role", "user"}, {"content", "  Hi there  "}}}, {"xs", {1, 2, 3, 4}}};
  EXPECT_EQ(render("{{ m.role }}{{ m['role'] }}{{ m.missing is defined }}{{ xs[-1] }}{{ xs[9] is defined }}", vars),
            "useruserFalse4False");
  EXPECT_EQ(render("{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[1:3] }}{{ 'abcdef'[1:4] }}", vars),
            "[2, 3, 4][1, 2, 3][4, 3, 2, 1][2, 3]bcd");
  EXPECT_EQ(render("[{{ m.content.strip() }}][{{ m.content.lstrip() }}][{{ 'xxaxx'.strip('x') }}]", vars),
            "[Hi there][Hi there  ][a]");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}"),
            "['a', 'b', '', 'c']['a', 'b']['a', 'b c']");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}"),
            "TrueTrueABab");
  EXPECT_EQ(render("{{ m.get('role') }}{{ m.get('none', 'd') }}{{ m.keys() | list }}", vars), "userd['role', 'content']");
  EXPECT_EQ(render("{{ 'role' in m }}{{ 3 in xs }}{{ 'ell' in 'hello' }}{{ 5 not in xs }}", vars), "TrueTrueTrueTrue");
}

TEST(Jinja, FiltersAndTests) {
  EXPECT_EQ(render("[{{ '  x \n' | trim }}]{{ 'héllo' | length }}{{ [1, 2] | length }}{{ x | length }}"), "[x]520");
  EXPECT_EQ(render("{{ x | default('d') }}{{ '' | default('e', true) }}{{ [3, 1] | first }}{{ [3, 1] | last }}"), "de31");
  EXPECT_EQ(render("{{ ['a', 'b'] | join(', ') }}{{ 'Hi' | upper }}{{ 'Hi' | lower }}{{ 1 | string }}"), "a, bHIhi1");
  EXPECT_EQ(render("{{ 'aXbX' | replace('X', '-') }}{{ {'a': 1} | items | list }}{{ 'ab' | list }}"),
            "a-b-[['a', 1]]['a', 'b']");
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | join }}",
                   {{"ms", {{{"role", "user"}, {"c", "1"}}, {{"role", "bot"}, {"c", "2"}}, {{"role", "user"}, {"c", "3"}}}}}),
            "13");
  EXPECT_EQ(render("{{ ['a', 'code', 'b'] | reject('equalto', 'code') | join(',') }}"), "a,b");
  EXPECT_EQ(render("{{ none is none }}{{ 1 is number }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}"
                   "{{ 1 is not string }}{{ x is undefined }}{{ true is true }}{{ 3 is odd }}{{ 2 is eq 2 }}"),
            "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ not x is defined }}{{ [1] == [1] }}{{ {'a': [1]} == {'a': [1]} }}{{ 1 == 1.0 }}"),
            "TrueTrueTrueTrue");
}

TEST(Jinja, ToJsonIsPythonsJsonDumps) {
  const json v = json::parse(R"({"name": "f", "n": 1, "x": 1.5, "ok": true, "none": null,
                                  "list": [1, "é\"\n<"], "empty": {}})");
  EXPECT_EQ(render("{{ v | tojson }}", {{"v", v}}),
            R"({"name": "f", "n": 1, "x": 1.5, "ok": true, "none": null, "list": [1, "é\"\n<"], "empty": {}})");
  EXPECT_EQ(render("{{ v | tojson(indent=2) }}", {{"v", {{"a", {1, 2}}, {"b", json::object()}}}}),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(render("{{ '\\x01' | tojson }}"), "\"\\u0001\"");
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
  try {
    render("{% if messages | length > 1 %}{{ raise_exception('roles must alternate ' ~ 2) }}{% endif %}",
           {{"messages", {1, 2}}});
    FAIL() << "no exception";
  } catch (const jinja::RaisedException& e) {
    EXPECT_STREQ(e.what(), "roles must alternate 2");
  }
  EXPECT_EQ(render("{{ strftime_now('%Y') | length }}"), "4");
}

TEST(Jinja, UndefinedValuesFailWhenComputedWith) {
  EXPECT_THROW(render("{{ x + 'a' }}"), jinja::RenderError);
  EXPECT_THROW(render("{{ x.attr }}"), jinja::RenderError);
  EXPECT_THROW(render("{{ 1 + 'a' }}"), jinja::RenderError);
  EXPECT_THROW(render("{% set x = 1 %}{% set x.a = 2 %}"), jinja::RenderError);
  EXPECT_EQ(render("{{ x ~ 'a' }}{{ 'a' if x else 'b' }}"), "ab");
}

TEST(Jinja, SyntaxErrorsNameTheFileLineAndWhatWasExpected) {
  auto expect = [](const std::string& msg, std::initializer_list<const char*> parts) {
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
  };
  expect(syntax_error("a\n{% if x %}\nb"), {"t.jinja:3", "expected \"{% elif %}\" or \"{% else %}\" or \"{% endif %}\""});
  expect(syntax_error("{{ x + }}"), {"t.jinja:1", "expected an expression, got \"}}\""});
  expect(syntax_error("\n\n{% for x y %}{% endfor %}"), {"t.jinja:3", "expected \"in\", got \"y\""});
  expect(syntax_error("{{ x | nosuchfilter }}"), {"t.jinja:1", "no filter named \"nosuchfilter\""});
  expect(syntax_error("{% if x is nosuchtest %}{% endif %}"), {"no test named \"nosuchtest\""});
  expect(syntax_error("{% endfor %}"), {"t.jinja:1", "unknown statement \"endfor\""});
  expect(syntax_error("{{ 'open }}"), {"t.jinja:1", "a string not closed"});
  expect(syntax_error("{{ x "), {"not closed by \"}}\""});
  expect(syntax_error("{% set x = [1, 2 %}"), {"expected \"]\", got \"%}\""});
  expect(syntax_error("{# no end"), {"a comment \"{#\" not closed"});
}

}  // namespace
}  // namespace jumbo
