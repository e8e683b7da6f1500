// Python semantics of the Jinja interpreter that chat templates observe. Every expected text and
// error type here is what Python's jinja2 3.1.2 printed for the same template and variables in
// transformers' environment (tests/chat/render_chat_reference.py), so these pin the engine to
// jinja2 without needing Python at test time; template_reference_test checks the real templates
// against jinja2 live.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "chat/jinja.h"

namespace arbor::chat::jinja {
namespace {

const nlohmann::ordered_json kVars = nlohmann::ordered_json::parse(R"({
    "xs": [1, 2, 3], "s": "  Hello World  ", "d": {"a": [1, 2], "b": 1},
    "schema": {"type": "array", "items": {"type": "string"}},
    "messages": [{"role": "user", "content": "Hello!"},
                 {"role": "assistant", "content": "Hi there"}]})");

Result<std::string> render(const std::string& src) {
  ARBOR_ASSIGN_OR_RETURN(Template t, Template::parse(src));
  RenderEnvironment env;
  env.now_unix_seconds = 1721980800;
  return t.render(Value::from_json(kVars), {}, env);
}

struct Case {
  const char* tmpl;
  const char* want;  // the rendered text, or the Python exception type of the error
};

TEST(JinjaSemantics, RendersAsJinja2) {
  const Case cases[] = {
      {"{{ schema.items is defined }}|{{ schema['items'] }}|{{ schema.type }}|{{ d.values is "
       "callable }}|{{ d['keys'] is callable }}",
       "True|{'type': 'string'}|array|True|True"},
      {"{{ strftime_now is defined }}{{ raise_exception is defined }}{{ range is callable }}{{ "
       "nope is defined }}",
       "TrueTrueTrueFalse"},
      {"{% set g = xs | map('string') %}{{ g is iterable }}{{ g is sequence }}{{ g | join }}{{ g | "
       "join }}|{% if xs | select('gt', 5) %}truthy{% endif %}",
       "TrueFalse123|truthy"},
      {"{{ xs | reverse | join }}{{ d | reverse | list }}{{ (xs | map('string') | reverse) }}",
       "321['b', 'a']['3', '2', '1']"},
      {"{{ \"<a>\" | safe + \"<b>\" }}|{{ \"<a>\" + \"<b>\" | e }}|{{ \"<a>\" | safe ~ \"<b>\" "
       "}}|{{ (\"x\" | safe).upper() + \"&\" }}",
       "<a>&lt;b&gt;|&lt;a&gt;&lt;b&gt;|<a><b>|X&amp;"},
      {"{{ {1: 'one', 'k': 2, none: 3, true: 4}[1] }}|{{ {1: 'one', 2: 'two'} | tojson }}|{{ {1: "
       "'a'} }}|{{ 1 in {1: 0} }}",
       "4|{\"1\": \"one\", \"2\": \"two\"}|{1: 'a'}|True"},
      {"{{ d | dictsort }}|{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | "
       "sort(case_sensitive=true) }}|{{ [3, 1, 2] | sort(reverse=true) }}|{{ messages | "
       "sort(attribute='role') | map(attribute='role') | list }}",
       "[('a', [1, 2]), ('b', 1)]|['A', 'b', 'c']|['A', 'b', 'c']|[3, 2, 1]|['assistant', 'user']"},
      {"{{ ['b', 'B', 'a'] | unique | list }}|{{ [3, 1, 2] | min }}{{ [3, 1, 2] | max }}|{{ ['b', "
       "'A'] | min }}|{{ [] | min is undefined }}",
       "['b', 'a']|13|A|True"},
      {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('> "
       "', blank=true) }}",
       "a\n  b\n\n  c|  a\n  b|a\n> \n> b"},
      {"{{ {'a': 'é', 'b': [1.5, none]} | tojson(ensure_ascii=true) }}|{{ {'b': 1, 'a': [1]} | "
       "tojson(indent=2, sort_keys=true) }}|{{ [1, {'a': 2}] | tojson(separators=(',', ':')) }}",
       "{\"a\": \"\\u00e9\", \"b\": [1.5, null]}|{\n  \"a\": [\n    1\n  ],\n  \"b\": "
       "1\n}|[1,{\"a\":2}]"},
      {"{{ 'x{}y{}'.format(1, 'z') }}|{{ '{0}-{0}-{n}'.format('a', n=2) }}|{{ "
       "'{{}}{}'.format(none) }}|{{ '{!r}'.format('q') }}",
       "x1yz|a-a-2|{}None|'q'"},
      {"{% filter upper %}shout {{ 'this' }}{% endfilter %}|{% filter trim | upper %}  x  {% "
       "endfilter %}",
       "SHOUT THIS|X"},
      {"{{ 1e15 }} {{ 1e16 }} {{ 0.0001 }} {{ 0.00001 }} {{ 123456789.123 }} {{ -2.5 }} {{ 1/3 }} "
       "{{ [0.1, 2.0] | tojson }} {{ 100.0 }}",
       "1000000000000000.0 1e+16 0.0001 1e-05 123456789.123 -2.5 0.3333333333333333 [0.1, 2.0] "
       "100.0"},
      {"{{ 'Ünïcödé' | upper }} {{ 'ΑΒΓ' | lower }} {{ 'привет мир' | title }} {{ 'a1' is lower }} "
       "{{ '12' is lower }}",
       "ÜNÏCÖDÉ αβγ Привет Мир True False"},
      {"{{ '  a  b '.split() }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'l1\\nl2\\r\\nl3'.splitlines() "
       "}}|{{ 'ab'.strip('b') }}|{{ 'xéx'.strip('x') }}|{{ 'hello'.find('l') }}{{ "
       "'hello'.count('l') }}",
       "['a', 'b']|['a b', 'c']|['l1', 'l2', 'l3']|a|é|22"},
      {"{{ '\\u00a0x\\u3000'.strip() | length }}|{{ ' x '.isspace() }}{{ '123'.isdigit() }}",
       "1|FalseTrue"},
      {"{{ (1, 2) == [1, 2] }}{{ [1, 2] < [1, 3] }}{{ 'a' < 'b' }}{{ (1,) + (2,) }}{{ [1] * 2 }}{{ "
       "'ab' * 2 }}",
       "FalseTrueTrue(1, 2)[1, 1]abab"},
      {"{{ '12' | int + 1 }}{{ ' 7 ' | int }}{{ '2.5' | int }}{{ 'x' | int(5) }}{{ '1e3' | float "
       "}}{{ none | int }}",
       "137251000.00"},
      {"{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}{{ m('y', b='z') }}",
       "xx!yz"},
      {"{% for a, b in ['xy', [1, 2]] %}{{ a }}{{ b }};{% endfor %}{% for k in {'p': 1, 2: 3} %}{{ "
       "k }}{% endfor %}",
       "xy;12;p2"},
      {"{{ xs | first }}{{ xs | last }}{{ 'abc' | first }}{{ [] | first is undefined }}{% set g = "
       "xs | map('string') %}{{ g | first }}{{ g | list }}",
       "13aTrue1['2', '3']"},
      {"{% set g = xs | select('odd') %}{{ 3 in g }}{{ g | list }}|{{ d | items | list }}|{{ nope "
       "| items | list }}",
       "True[]|[('a', [1, 2]), ('b', 1)]|[]"},
      // Macros read the scopes they were defined in when they run (Python closures).
      {"{% for x in [1,2] %}{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% endfor %}", "12"},
      {"{% for x in [1,2] %}{% set y = x * 10 %}{% macro m() %}{{ y }}{% endmacro %}"
       "{% set y = 99 %}{{ m() }}{% endfor %}",
       "9999"},
      {"{% macro outer(a) %}{% set b = 1 %}{% macro inner() %}{{ a }}{{ b }}{% endmacro %}"
       "{% set b = 2 %}{{ inner() }}{% endmacro %}{{ outer(7) }}",
       "72"},
      {"{% set z = 1 %}{% macro m() %}{{ z }}{% endmacro %}{% for i in [1] %}{% set z = 5 %}"
       "{{ m() }}{% endfor %}",
       "1"},
      {"a\r\nb\rc{{ \"x\r\ny\" }}\r\n  {% if true %}\r\nd{% endif %}\r\n", "a\nb\ncx\ny\nd"},
  };
  for (const Case& c : cases) {
    Result<std::string> r = render(c.tmpl);
    ASSERT_TRUE(r.ok()) << c.tmpl << " -> " << r.status().to_string();
    EXPECT_EQ(*r, c.want) << c.tmpl;
  }
}

TEST(JinjaSemantics, FailsWhereJinja2Raises) {
  const Case cases[] = {
      {"{{ none | items | list }}", "TypeError"},
      {"{{ xs | map('string') | length }}", "TypeError"},
      {"{{ none | length }}", "TypeError"},
      {"{{ xs | map('string') | tojson }}", "TypeError"},
      {"{{ xs | map('string') | last }}", "TypeError"},
      {"{% for x in none %}{% endfor %}", "TypeError"},
      {"{{ xs.append(4) }}", "SecurityError"},
      {"{{ d.pop('a') }}", "SecurityError"},
      {"{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", "TypeError"},
      {"{{ 'a' + 1 }}", "TypeError"},
      {"{{ 1 < 'a' }}", "TypeError"},
      {"{{ 'x' in 1 }}", "TypeError"},
      {"{{ 1 in 'x' }}", "TypeError"},
      {"{{ nope.x }}", "UndefinedError"},
      {"{{ 'abc' | indent }}{{ 3 | indent }}", "TypeError"},
  };
  for (const Case& c : cases) {
    Result<std::string> r = render(c.tmpl);
    ASSERT_FALSE(r.ok()) << c.tmpl << " rendered " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.want), std::string::npos)
        << c.tmpl << " -> " << r.status().message();
  }
}

TEST(JinjaSemantics, StrftimeNowFormatsTheFixedInstantInLocalTime) {
  // 1721980800 is 2024-07-26 08:00:00 UTC; the test environment's TZ decides the local hour, as
  // datetime.now() does, so only the date (the same in every zone from UTC-8 to UTC+15) is fixed.
  Result<std::string> r = render("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "2024-07-26|26 Jul 2024");
}

}  // namespace
}  // namespace arbor::chat::jinja
