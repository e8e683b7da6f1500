// json_schema_to_gbnf / free_json_gbnf: exact grammar text for small schemas, exact errors, and
// end-to-end language checks: the grammar (run through a PCRE2 translation) accepts the listed
// valid texts, rejects the invalid ones, and everything it accepts from random edits of valid
// texts parses as JSON and passes the independent validator (tests/support).
#include "grammar/json_schema_to_gbnf.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "support/gbnf_matcher.h"
#include "support/json_schema_validator.h"

namespace arbor::grammar {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using test::FullMatcher;

constexpr JsonGrammarOptions kCompact{JsonWhitespace::kCompact};

constexpr char kStringRules[] =
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] "
    "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )\n";
constexpr char kNumberRule[] =
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,15} )? ( [eE] [\\-+]? "
    "[0-9]{1,2} )?\n";
constexpr char kWsRule[] = "ws ::= ( \" \" | \"\\n\" [ \\t]{0,8} )?\n";

std::string grammar_of(const char* schema, const JsonGrammarOptions& options = {}) {
  Result<std::string> g = json_schema_to_gbnf(ordered_json::parse(schema), options);
  return g.ok() ? *g : "ERROR " + g.status().to_string();
}

std::string error_of(const ordered_json& schema) {
  Result<std::string> g = json_schema_to_gbnf(schema);
  EXPECT_FALSE(g.ok()) << schema.dump() << " gave\n" << (g.ok() ? *g : "");
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  return g.status().message();
}

FullMatcher matcher_of(const ordered_json& schema, const JsonGrammarOptions& options = {}) {
  Result<std::string> g = json_schema_to_gbnf(schema, options);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  Result<FullMatcher> m = FullMatcher::from_gbnf_grammar(g.ok() ? *g : "root ::= \"\"");
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

TEST(JsonSchemaToGbnf, ExactTextForSmallSchemas) {
  EXPECT_EQ(grammar_of(R"({"type":"string"})"), std::string("root ::= string\n") + kStringRules);
  EXPECT_EQ(grammar_of(R"({"type":"object","properties":{"a":{"type":"integer"},
                           "b":{"type":"boolean"}},"required":["a","b"]})"),
            std::string("root ::= \"{\" ws \"\\\"a\\\":\" ws integer \",\" ws \"\\\"b\\\":\" ws "
                        "boolean ws \"}\"\n") +
                kWsRule +
                "integer ::= \"0\" | \"-\"? [1-9] [0-9]{0,15}\n"
                "boolean ::= \"true\" | \"false\"\n");
  EXPECT_EQ(grammar_of(R"({"type":"object","properties":{"a":{"type":"integer","minimum":1,
                           "maximum":12},"b":{"type":"boolean"},"c":{"type":"null"}},
                           "required":["b"]})", kCompact),
            "root ::= \"{\" ( \"\\\"a\\\":\" root-a \",\" \"\\\"b\\\":\" boolean ( \",\" "
            "\"\\\"c\\\":\" null )? | \"\\\"b\\\":\" boolean ( \",\" \"\\\"c\\\":\" null )? ) "
            "\"}\"\n"
            "root-a ::= [1-9] | \"1\" [0-2]\n"
            "boolean ::= \"true\" | \"false\"\n"
            "null ::= \"null\"\n");
  EXPECT_EQ(grammar_of(R"({"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":3})",
                       kCompact),
            "root ::= \"[\" root-item ( \",\" root-item ){0,2} \"]\"\n"
            "root-item ::= \"\\\"x\\\"\" | \"\\\"y\\\"\"\n");
  EXPECT_EQ(grammar_of(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"number"}],
                           "items":false,"minItems":1})", kCompact),
            std::string("root ::= \"[\" string ( \",\" number )? \"]\"\n") + kStringRules +
                kNumberRule);
  EXPECT_EQ(grammar_of(R"({"enum":["a",1,null,{"x":"é"}]})"),
            "root ::= \"\\\"a\\\"\" | \"1\" | \"null\" | \"{\\\"x\\\":\\\"\\u00E9\\\"}\"\n");
  EXPECT_EQ(grammar_of(R"({"type":"string","pattern":"^[a-z]{2}\\d$"})"),
            "root ::= \"\\\"\" [a-z]{2} [0-9] \"\\\"\"\n");
  EXPECT_EQ(grammar_of(R"({"type":["string","null"],"format":"uuid"})"),
            "root ::= \"\\\"\" uuid \"\\\"\" | null\n"
            "null ::= \"null\"\n"
            "uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
            "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}\n");
  EXPECT_EQ(grammar_of(R"({"type":"string","minLength":2,"maxLength":5})"),
            std::string("root ::= \"\\\"\" char{2,5} \"\\\"\"\n") +
                "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( "
                "[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )\n");
  EXPECT_EQ(grammar_of(R"({"type":"integer","exclusiveMinimum":-5})"),
            "root ::= \"-\" [1-4] | \"0\" | [1-9] [0-9]{0,15}\n");
}

TEST(JsonSchemaToGbnf, ExactTextForReferencesAndAdditionalProperties) {
  EXPECT_EQ(grammar_of(R"({"$defs":{"Node":{"type":"object","properties":{"next":{"anyOf":[
                           {"$ref":"#/$defs/Node"},{"type":"null"}]}},"required":["next"]}},
                           "$ref":"#/$defs/Node"})", kCompact),
            "root ::= Node\n"
            "Node ::= \"{\" \"\\\"next\\\":\" Node-next \"}\"\n"
            "Node-next ::= Node | null\n"
            "null ::= \"null\"\n");
  EXPECT_EQ(grammar_of(R"({"type":"object","properties":{"a":{"type":"boolean"}},
                           "additionalProperties":{"type":"null"}})", kCompact),
            "root ::= \"{\" ( \"\\\"a\\\":\" boolean ( \",\" root-additional-key \":\" null )* | "
            "root-additional-key \":\" null ( \",\" root-additional-key \":\" null )* )? \"}\"\n"
            "root-additional-key ::= \"\\\"\" ( [^\\x00-\\x1F\"\\\\a] [^\\x00-\\x1F\"\\\\]* | "
            "\"a\" [^\\x00-\\x1F\"\\\\] [^\\x00-\\x1F\"\\\\]* )? \"\\\"\"\n"
            "boolean ::= \"true\" | \"false\"\n"
            "null ::= \"null\"\n");
  // A definition named like a shared rule gets a suffix; identical bodies share one rule.
  EXPECT_EQ(grammar_of(R"({"definitions":{"string":{"type":"integer","minimum":0}},
                           "type":"object","properties":{"a":{"$ref":"#/definitions/string"},
                           "b":{"type":"integer","minimum":0},"c":{"type":"integer",
                           "minimum":0}},"required":["a","b","c"]})", kCompact),
            "root ::= \"{\" \"\\\"a\\\":\" string-2 \",\" \"\\\"b\\\":\" root-b \",\" "
            "\"\\\"c\\\":\" root-b \"}\"\n"
            "string-2 ::= \"0\" | [1-9] [0-9]{0,15}\n"
            "root-b ::= \"0\" | [1-9] [0-9]{0,15}\n");
}

TEST(JsonSchemaToGbnf, RepeatedPatternAtomsNeedingEscapesBecomeSharedRules) {
  EXPECT_EQ(grammar_of(R"({"type":"object","properties":{"code":{"type":"string",
                           "pattern":"^[A-Z]{2}.{1,3}\"?$"},"x":{"type":"string",
                           "pattern":".{2}"}},"required":["code","x"]})", kCompact),
            "root ::= \"{\" \"\\\"code\\\":\" root-code \",\" \"\\\"x\\\":\" root-x \"}\"\n"
            "root-code-repeat ::= [^\\x00-\\x1F\"\\\\] | \"\\\\\\\"\" | \"\\\\\\\\\" | "
            "\"\\\\b\" | \"\\\\t\" | \"\\\\f\" | \"\\\\r\" | \"\\\\u00\" ( \"0\" [0-7bef] | "
            "\"1\" [0-9a-f] )\n"
            "root-code ::= \"\\\"\" [A-Z]{2} root-code-repeat{1,3} \"\\\\\\\"\"? \"\\\"\"\n"
            "root-x ::= \"\\\"\" root-code-repeat{2} \"\\\"\"\n");
}

TEST(JsonSchemaToGbnf, FreeJsonIsAnyObject) {
  EXPECT_EQ(*free_json_gbnf(kCompact),
            std::string("root ::= object\n"
                        "value ::= object | array | string | number | boolean | null\n"
                        "object ::= \"{\" ( string \":\" value ( \",\" string \":\" value )* )? "
                        "\"}\"\n"
                        "array ::= \"[\" ( value ( \",\" value )* )? \"]\"\n") +
                kStringRules + kNumberRule +
                "boolean ::= \"true\" | \"false\"\n"
                "null ::= \"null\"\n");
  const std::string flexible = *free_json_gbnf();
  EXPECT_NE(flexible.find("object ::= \"{\" ws ( string \":\" ws value ( \",\" ws string \":\" ws "
                          "value )* ws )? \"}\"\n"),
            std::string::npos)
      << flexible;
  Result<FullMatcher> m = FullMatcher::from_gbnf_grammar(flexible);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  for (const char* ok : {"{}", "{ }", R"({"a":[1,2.5,-3e10,{"b":null}],"c":"\u00e9\n"})",
                         "{\n  \"a\": [\n    true\n  ]\n}"}) {
    EXPECT_TRUE(m->matches(ok)) << ok;
  }
  for (const char* bad : {"[]", "1", "\"x\"", " {}", "{} ", "{\"a\"}", "{\"a\":1,}", "{'a':1}",
                          "{\"a\":01}", "{\"a\":\"\\x\"}", "{\"a\":\"\x01\"}"}) {
    EXPECT_FALSE(m->matches(bad)) << bad;
  }
}

TEST(JsonSchemaToGbnf, PropertyOrderFollowsTheJsonTypeUsed) {
  const char* schema = R"({"type":"object","properties":{"b":{"type":"null"},"a":{"type":"null"}},
                           "required":["a","b"]})";
  EXPECT_EQ(*json_schema_to_gbnf(ordered_json::parse(schema), kCompact),
            "root ::= \"{\" \"\\\"b\\\":\" null \",\" \"\\\"a\\\":\" null \"}\"\n"
            "null ::= \"null\"\n");
  // nlohmann::json keeps keys sorted.
  EXPECT_EQ(*json_schema_to_gbnf(json::parse(schema), kCompact),
            "root ::= \"{\" \"\\\"a\\\":\" null \",\" \"\\\"b\\\":\" null \"}\"\n"
            "null ::= \"null\"\n");
}

TEST(JsonSchemaToGbnf, ErrorsNameKeywordAndPath) {
  EXPECT_EQ(error_of({{"type", "object"}, {"patternProperties", ordered_json::object()}}),
            "unsupported JSON Schema keyword 'patternProperties' at /");
  EXPECT_EQ(error_of(ordered_json::parse(
                R"({"type":"object","properties":{"a/b~c":{"type":"string","not":{}}}})")),
            "unsupported JSON Schema keyword 'not' at /properties/a~1b~0c");
  EXPECT_EQ(error_of({{"type", "object"}, {"minProperties", 1}}),
            "unsupported JSON Schema keyword 'minProperties' at /");
  EXPECT_EQ(error_of({{"type", "number"}, {"multipleOf", 2}}),
            "unsupported JSON Schema keyword 'multipleOf' at /");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"allOf":[{},{}]})")),
            "keyword 'allOf' at / has 2 schemas; only a single schema is supported");
  EXPECT_EQ(error_of(ordered_json::parse(
                R"({"$ref":"#/$defs/A","type":"object","$defs":{"A":{}}})")),
            "JSON Schema keyword 'type' at / cannot be combined with '$ref'");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"anyOf":[{}],"minimum":1})")),
            "JSON Schema keyword 'minimum' at / cannot be combined with 'anyOf'");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"$ref":"http://x/y.json"})")),
            "unsupported $ref 'http://x/y.json' at /: only local JSON pointers ('#', "
            "'#/$defs/NAME') are supported");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"$ref":"#/$defs/missing"})")),
            "$ref '#/$defs/missing' at / does not resolve");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"$ref":"#/$defs/~2"})")),
            "$ref '#/$defs/~2' at / is not a valid JSON pointer");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"$defs":{"A":{"$ref":"#/$defs/B"},
                                          "B":{"anyOf":[{"$ref":"#/$defs/A"},{"type":"null"}]}},
                                          "$ref":"#/$defs/A"})")),
            "$ref '#/$defs/A' at /$defs/B/anyOf/0 closes a reference cycle that passes through "
            "no object or array");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})")),
            "$ref '#' at /anyOf/0 closes a reference cycle that passes through no object or "
            "array");
  EXPECT_EQ(error_of({{"type", "strin"}}), "unknown type 'strin' at /");
  EXPECT_EQ(error_of({{"type", ordered_json::array()}}),
            "keyword 'type' at / must be a type name or a non-empty array of type names");
  EXPECT_EQ(error_of({{"type", "string"}, {"format", "uri"}}),
            "unsupported string format \"uri\" at /");
  EXPECT_EQ(error_of({{"type", "string"}, {"format", "date"}, {"maxLength", 3}}),
            "JSON Schema keyword 'format' at / cannot be combined with 'maxLength'");
  EXPECT_EQ(error_of({{"type", "string"}, {"pattern", "a+"}, {"minLength", 3}}),
            "JSON Schema keyword 'pattern' at / cannot be combined with 'minLength'");
  EXPECT_EQ(error_of({{"type", "string"}, {"pattern", "(?=a)"}}),
            "keyword 'pattern' at /: unsupported regex construct: lookahead at offset 0");
  EXPECT_EQ(error_of({{"type", "string"}, {"minLength", 5}, {"maxLength", 3}}),
            "minLength 5 at / is greater than maxLength 3");
  EXPECT_EQ(error_of({{"type", "string"}, {"minLength", -1}}),
            "keyword 'minLength' at / must be a non-negative integer");
  EXPECT_EQ(error_of({{"type", "string"}, {"maxLength", 2000000}}),
            "string length bounds at /: repetition count 2000000 exceeds the supported limit "
            "1000000");
  EXPECT_EQ(error_of({{"type", "integer"}, {"minimum", 5}, {"maximum", 3}}),
            "no integer satisfies the bounds at / (lowest 5, highest 3)");
  EXPECT_EQ(error_of({{"type", "integer"}, {"exclusiveMinimum", 2.5}, {"exclusiveMaximum", 3}}),
            "no integer satisfies the bounds at / (lowest 3, highest 2)");
  EXPECT_EQ(error_of({{"type", "integer"}, {"minimum", "0"}}),
            "keyword 'minimum' at / must be a number");
  EXPECT_EQ(error_of({{"type", "integer"}, {"minimum", 1e30}}),
            "integer bound 1e+30 at / is outside the 64-bit range");
  EXPECT_EQ(error_of({{"type", "number"}, {"maximum", 99.5}}),
            "bound 'maximum' 99.5 at / is not supported for type number: only integer bounds "
            "within 2^53 are");
  EXPECT_EQ(error_of({{"type", "number"}, {"exclusiveMinimum", 3}, {"maximum", 3}}),
            "no number satisfies the bounds at /");
  EXPECT_EQ(error_of(ordered_json::parse(
                R"({"type":"object","properties":{"a":{}},"required":["b"]})")),
            "required property 'b' at / is not declared in 'properties'");
  EXPECT_EQ(error_of(ordered_json::parse(
                R"({"type":"object","properties":{"a":false},"required":["a"]})")),
            "required property 'a' at / has the schema false");
  EXPECT_EQ(error_of({{"type", "object"}, {"required", "a"}}),
            "keyword 'required' at / must be an array of strings");
  EXPECT_EQ(error_of({{"type", "object"},
                      {"properties", {{std::string(257, 'k'), ordered_json::object()}}},
                      {"additionalProperties", true}}),
            "property name at / is longer than 256 characters, which additionalProperties does "
            "not support");
  EXPECT_EQ(error_of({{"type", "object"}, {"additionalProperties", 1}}),
            "keyword 'additionalProperties' at / must be a boolean or a schema");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"type":"array","items":[{}]})")),
            "keyword 'items' at / is an array (the draft-4 tuple form); use 'prefixItems'");
  EXPECT_EQ(error_of({{"type", "array"}, {"minItems", 3}, {"maxItems", 2}}),
            "minItems 3 at / is greater than maxItems 2");
  EXPECT_EQ(error_of(ordered_json::parse(
                R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})")),
            "minItems 2 at / cannot be met: at most 1 elements are allowed");
  EXPECT_EQ(error_of({{"enum", {1, 2}}, {"minimum", 0}}),
            "JSON Schema keyword 'minimum' at / cannot be combined with 'enum'");
  EXPECT_EQ(error_of({{"type", "string"}, {"enum", {1, 2}}}),
            "no value of 'enum' at / satisfies the other keywords");
  EXPECT_EQ(error_of({{"const", 1}, {"enum", {2}}}),
            "no value of 'enum' at / satisfies the other keywords");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"enum":[]})")),
            "keyword 'enum' at / must be a non-empty array");
  EXPECT_EQ(error_of(false), "schema at / is false: it accepts no value");
  EXPECT_EQ(error_of(42), "schema at / must be an object or a boolean");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"anyOf":[]})")),
            "keyword 'anyOf' at / must be a non-empty array of schemas");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"oneOf":[false]})")),
            "every schema of 'oneOf' at / is false");
  EXPECT_EQ(error_of(ordered_json::parse(R"({"type":"object","properties":{"a":{"type":"array",
                                          "items":{"type":"string","format":"hostname"}}}})")),
            "unsupported string format \"hostname\" at /properties/a/items");
}

TEST(JsonSchemaToGbnf, DeepNestingAndBadUtf8AreErrorsNotCrashes) {
  ordered_json deep = {{"type", "string"}};
  for (int i = 0; i < 200; ++i) {
    deep = {{"type", "array"}, {"items", deep}};
  }
  const std::string message = error_of(deep);
  EXPECT_NE(message.find("is nested more than 128 levels deep"), std::string::npos) << message;
  EXPECT_EQ(message.rfind("JSON Schema at /items/items/", 0), 0u) << message;

  ordered_json bad_utf8 = {{"enum", {std::string("a\xFF")}}};
  EXPECT_EQ(error_of(bad_utf8).rfind("JSON Schema could not be read: ", 0), 0u);
}

TEST(JsonSchemaToGbnf, UnreferencedDefinitionsAreNotChecked) {
  EXPECT_EQ(grammar_of(R"({"$defs":{"A":{"not":{}}},"type":"null","title":"t",
                           "description":"d","$schema":"x","examples":[1],"default":null})"),
            "root ::= null\nnull ::= \"null\"\n");
}

// A schema with the grammar it gives and texts it must accept / reject.
struct LanguageCase {
  const char* name;
  const char* schema;
  std::vector<std::string> accept;
  std::vector<std::string> reject;
};

std::vector<LanguageCase> language_cases() {
  return {
      {"person",
       R"({"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":8},
           "age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string",
           "format":"email"},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},
           "required":["name","age"]})",
       {R"({"name":"Al","age":0})", R"({"name":"\u00e9\"\\","age":150,"tags":[]})",
        R"({"name":"Bo","age":42,"email":"x.y@ex-ample.co.uk","tags":["a","b"]})",
        R"({"name":"Bo","age":42,"tags":["b"]})"},
       {R"({"name":"","age":1})", R"({"name":"123456789","age":1})", R"({"name":"A","age":151})",
        R"({"name":"A","age":-1})", R"({"age":1,"name":"A"})", R"({"name":"A"})",
        R"({"name":"A","age":1,"x":1})", R"({"name":"A","age":1,"tags":["a","b","a"]})",
        R"({"name":"A","age":1,"email":"a@b"})", R"({"name":"A","age":1.5})",
        R"({"name":"A","age":1,"tags":["c"]})", R"({"name":"A","age":01})"}},
      {"optional_first",
       R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},
           "c":{"type":"number","minimum":0}},"required":["c"]})",
       {R"({"c":0})", R"({"a":true,"c":1.5})", R"({"b":null,"c":2})",
        R"({"a":false,"b":null,"c":100})"},
       {R"({})", R"({"a":true})", R"({"c":-1})", R"({"c":1,"a":true})",
        R"({"b":null,"a":true,"c":1})",
        R"({,"c":1})", R"({"c":1,})", R"({"c":1e5})"}},
      {"all_optional_with_additional",
       R"({"type":"object","properties":{"a":{"type":"string"},"ab":{"type":"integer"}},
           "additionalProperties":{"type":"integer"}})",
       {R"({})", R"({"a":"x"})", R"({"ab":1})", R"({"b":1})", R"({"":1})", R"({"abc":2,"x":3})",
        R"({"a":"x","ab":2,"zz":3})", R"({"a":"x","b":1})"},
       {R"({"a":1})", R"({"b":"x"})", R"({"a":"x","a":1})", R"({"b":1,"a":"x"})",
        R"({"ab":1,"ab":2})", R"({"x":1,"ab":1})"}},
      {"tuple",
       R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],
           "items":{"type":"boolean"},"minItems":2,"maxItems":4})",
       {R"([1,"a"])", R"([1,"a",true])", R"([1,"a",true,false])"},
       {R"([])", R"([1])", R"(["a",1])", R"([1,"a",1])", R"([1,"a",true,true,true])"}},
      {"tuple_open",
       R"({"type":"array","prefixItems":[{"const":1}]})",
       {R"([])", R"([1])", R"([1,"x",{"y":[]}])"},
       {R"([2])", R"(["x"])"}},
      {"recursive_tree",
       R"({"$ref":"#/$defs/T","$defs":{"T":{"type":"object","properties":{"v":{"type":"integer"},
           "kids":{"type":"array","items":{"$ref":"#/$defs/T"}}},"required":["v"]}}})",
       {R"({"v":1})", R"({"v":1,"kids":[]})",
        R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"},
       {R"({"v":1,"kids":[{}]})", R"({"v":1,"kids":[{"v":"x"}]})", R"({"kids":[]})"}},
      {"root_recursion",
       R"({"type":"object","properties":{"child":{"$ref":"#"}}})",
       {R"({})", R"({"child":{}})", R"({"child":{"child":{}}})"},
       {R"({"child":1})", R"({"child":{"x":1}})"}},
      {"any_of_and_const",
       R"({"anyOf":[{"type":"integer","minimum":10},{"const":"none"},{"type":"array",
           "items":{"type":"null"}}]})",
       {"10", "999", R"("none")", "[]", "[null,null]"},
       {"9", R"("nonE")", "[1]", "null", "10.5"}},
      {"implied_types",
       R"({"properties":{"a":{"maxLength":1}},"required":["a"]})",
       {R"({"a":"x"})", R"({"a":""})"},
       {R"({"a":"xy"})", R"({"a":1})", R"("x")", R"({})"}},
      {"no_constraints", R"({})", {"1", "null", R"({"a":[true]})", R"("s")"}, {"", "nul", "[1,]"}},
      {"formats",
       R"({"type":"array","prefixItems":[{"type":"string","format":"date"},{"type":"string",
           "format":"time"},{"type":"string","format":"date-time"},{"type":"string",
           "format":"ipv4"}],"items":false,"minItems":4})",
       {R"(["2024-02-29","23:59:59Z","2000-02-29T00:00:00.123456789+05:30","255.0.10.1"])"},
       {R"(["2023-02-29","23:59:59Z","2000-02-29T00:00:00Z","1.2.3.4"])",
        R"(["2024-02-29","24:00:00Z","2000-02-29T00:00:00Z","1.2.3.4"])",
        R"(["2024-02-29","23:59:59","2000-02-29T00:00:00Z","1.2.3.4"])",
        R"(["2024-02-29","23:59:59Z","1900-02-29T00:00:00Z","1.2.3.4"])",
        R"(["2024-02-29","23:59:59Z","2000-02-29T00:00:00Z","1.2.3.256"])",
        R"(["2024-02-29","23:59:59Z","2000-02-29T00:00:00Z","01.2.3.4"])"}},
  };
}

TEST(JsonSchemaToGbnf, LanguageOfRepresentativeSchemas) {
  for (const LanguageCase& c : language_cases()) {
    SCOPED_TRACE(c.name);
    const ordered_json schema = ordered_json::parse(c.schema);
    const FullMatcher m = matcher_of(schema, kCompact);
    for (const std::string& text : c.accept) {
      EXPECT_TRUE(m.matches(text)) << text;
      // The test's own expectations agree with the independent validator.
      EXPECT_EQ(test::validate_json(json::parse(text), json(schema)), std::nullopt) << text;
    }
    for (const std::string& text : c.reject) EXPECT_FALSE(m.matches(text)) << text;
  }
}

// Random single-character edits of valid texts: whatever the grammar accepts must parse and
// validate. Counts the accepted edits so that the test demonstrably exercises something.
TEST(JsonSchemaToGbnf, EverythingAcceptedFromRandomEditsValidates) {
  const std::string alphabet = "{}[]\",:0123456789-.eE tfnrlua\\bx";
  for (const LanguageCase& c : language_cases()) {
    SCOPED_TRACE(c.name);
    const ordered_json schema = ordered_json::parse(c.schema);
    const FullMatcher m = matcher_of(schema, kCompact);
    std::mt19937 rng(7);
    int accepted = 0;
    for (const std::string& seed_text : c.accept) {
      for (int i = 0; i < 300; ++i) {
        std::string t = seed_text;
        const int edits = 1 + static_cast<int>(rng() % 2);
        for (int e = 0; e < edits; ++e) {
          const size_t pos = t.empty() ? 0 : rng() % (t.size() + 1);
          const char ch = alphabet[rng() % alphabet.size()];
          switch (rng() % 3) {
            case 0: t.insert(pos, 1, ch); break;
            case 1: if (pos < t.size()) t.erase(pos, 1); break;
            default: if (pos < t.size()) t[pos] = ch; break;
          }
        }
        if (!m.matches(t)) continue;
        ++accepted;
        json parsed;
        ASSERT_NO_THROW(parsed = json::parse(t)) << t;
        ASSERT_EQ(test::validate_json(parsed, json(schema)), std::nullopt) << t;
      }
    }
    EXPECT_GT(accepted, 0);
  }
}

TEST(JsonSchemaToGbnf, FlexibleWhitespaceIsBoundedAndOnlyBetweenTokens) {
  const ordered_json schema = ordered_json::parse(
      R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},
          "b":{"type":"object","properties":{"c":{"type":"null"}}}},"required":["a"]})");
  const FullMatcher flexible = matcher_of(schema);
  const FullMatcher compact = matcher_of(schema, kCompact);
  const ordered_json value = {{"a", {1, 2}}, {"b", {{"c", nullptr}}}};
  EXPECT_TRUE(flexible.matches(value.dump()));
  EXPECT_TRUE(flexible.matches(value.dump(2)));
  EXPECT_TRUE(flexible.matches(value.dump(1, '\t')));
  EXPECT_FALSE(flexible.matches(R"({ "a": [ 1, 2 ] , "b": {} })"));  // no ws before ','
  EXPECT_TRUE(flexible.matches(R"({ "a": [ 1, 2 ], "b": { } })"));
  EXPECT_TRUE(compact.matches(value.dump()));
  EXPECT_FALSE(compact.matches(value.dump(2)));
  EXPECT_FALSE(compact.matches(R"({"a": [1]})"));
  EXPECT_FALSE(flexible.matches(" " + value.dump()));
  EXPECT_FALSE(flexible.matches(value.dump() + "\n"));
  EXPECT_FALSE(flexible.matches(R"({"a" :[1]})"));
  EXPECT_FALSE(flexible.matches(R"({"a":[1  ]})"));
  EXPECT_TRUE(flexible.matches("{\"a\":[1\n        ]}"));    // newline and 8 spaces
  EXPECT_FALSE(flexible.matches("{\"a\":[1\n         ]}"));  // 9 spaces
  EXPECT_FALSE(flexible.matches("{\"a\":[1\r\n]}"));
}

TEST(JsonSchemaToGbnf, PatternMatchesDecodedStringContent) {
  // Texts are JSON-encoded by nlohmann (escapes \" \\ \n \u0001); the grammar sees the encoded
  // text, PCRE2 the decoded string.
  const std::vector<std::string> alphabet = {"a", "b", "\"", "\\", "\n", "\x01", "\xC3\xA9", "/"};
  std::vector<std::string> strings = {""};
  for (int len = 0, start = 0; len < 3; ++len) {
    const int end = static_cast<int>(strings.size());
    for (int i = start; i < end; ++i) {
      for (const std::string& c : alphabet) strings.push_back(strings[i] + c);
    }
    start = end;
  }
  for (const char* pattern : {"[^a]b?", ".+", "a\"?\\\\", "[\\s\\S]{2}", "\\W*", "[\\x00-\\x1f]+a?",
                              "\\u00e9|\"\"|\\n", "^(a|/)*$", "[^\\n\\\\]{1,2}"}) {
    SCOPED_TRACE(pattern);
    const FullMatcher grammar = matcher_of({{"type", "string"}, {"pattern", pattern}});
    Result<FullMatcher> reference = FullMatcher::from_ecmascript_regex(pattern);
    ASSERT_TRUE(reference.ok()) << reference.status().to_string();
    int matches = 0;
    for (const std::string& s : strings) {
      const bool want = reference->matches(s);
      matches += want;
      ASSERT_EQ(grammar.matches(json(s).dump()), want) << json(s).dump();
    }
    EXPECT_GT(matches, 0);
  }
}

TEST(JsonSchemaToGbnf, DateFormatAgreesWithCalendarEverywhere) {
  const FullMatcher grammar = matcher_of({{"type", "string"}, {"format", "date"}});
  const json schema = {{"type", "string"}, {"format", "date"}};
  int valid = 0;
  for (int year : {0, 4, 100, 400, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 9999}) {
    for (int month = 0; month <= 13; ++month) {
      for (int day = 0; day <= 32; ++day) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%04d-%02d-%02d", year, month, day);
        const bool want = !test::validate_json(json(buf), schema).has_value();
        valid += want;
        ASSERT_EQ(grammar.matches(json(buf).dump()), want) << buf;
      }
    }
  }
  EXPECT_EQ(valid, 12 * 365 + 7);  // leap years: 0, 4, 400, 1996, 2000, 2024, 2400
}

TEST(JsonSchemaToGbnf, StringFormatsAcceptAndReject) {
  struct FormatCase {
    const char* format;
    std::vector<const char*> good;
    std::vector<const char*> bad;
  };
  const std::vector<FormatCase> cases = {
      {"time",
       {"00:00:00Z", "23:59:59.5+14:00", "12:30:00-00:00", "01:02:03.123456789Z"},
       {"24:00:00Z", "12:60:00Z", "12:00:60Z", "12:00:00", "12:00:00z", "12:00:00.Z",
        "12:00:00.1234567890Z", "12:00:00+24:00", "1:00:00Z"}},
      {"date-time",
       {"2024-01-31T10:00:00Z", "1999-12-31T23:59:59.9-08:00"},
       {"2024-01-31 10:00:00Z", "2024-01-31t10:00:00Z", "2024-04-31T10:00:00Z", "2024-01-31T"}},
      {"uuid",
       {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"},
       {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400",
        "g23e4567-e89b-12d3-a456-426614174000"}},
      {"email",
       {"a@b.co", "first.last+tag@sub.example-1.org", "x_%@a1.b2"},
       {"a@b", "@b.co", "a@.co", "a..b@c.co", ".a@b.co", "a@-b.co", "a@b-.co", "a b@c.co",
        "a@b@c.co", "a@b.co."}},
      {"ipv4",
       {"0.0.0.0", "255.255.255.255", "10.20.199.249"},
       {"256.0.0.0", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1.2.3.-4", "1.2.3.4 "}},
  };
  for (const FormatCase& c : cases) {
    SCOPED_TRACE(c.format);
    const ordered_json schema = {{"type", "string"}, {"format", c.format}};
    const FullMatcher grammar = matcher_of(schema);
    for (const char* s : c.good) {
      EXPECT_TRUE(grammar.matches(json(s).dump())) << s;
      EXPECT_EQ(test::validate_json(json(s), json(schema)), std::nullopt) << s;
    }
    for (const char* s : c.bad) {
      EXPECT_FALSE(grammar.matches(json(s).dump())) << s;
      EXPECT_NE(test::validate_json(json(s), json(schema)), std::nullopt) << s;
    }
  }
  // Every octet value, with and without leading zeros.
  const FullMatcher ipv4 = matcher_of({{"type", "string"}, {"format", "ipv4"}});
  for (int v = 0; v <= 300; ++v) {
    for (const std::string& octet : {std::to_string(v), "0" + std::to_string(v)}) {
      const std::string s = "1.2.3." + octet;
      const bool want = v <= 255 && octet.size() <= 3 && (octet == "0" || octet[0] != '0');
      ASSERT_EQ(ipv4.matches(json(s).dump()), want) << s;
      ASSERT_EQ(!test::validate_json(json(s), json({{"type", "string"}, {"format", "ipv4"}})),
                want)
          << s;
    }
  }
}

TEST(JsonSchemaToGbnf, StringLengthCountsCodePointsAndEscapes) {
  const FullMatcher m = matcher_of({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}});
  EXPECT_FALSE(m.matches(R"("a")"));
  EXPECT_TRUE(m.matches(R"("ab")"));
  EXPECT_TRUE(m.matches("\"\xC3\xA9\xF0\x9F\x98\x80\""));  // two code points, six bytes
  EXPECT_TRUE(m.matches(R"("\n\u00e9")"));
  EXPECT_FALSE(m.matches(R"("abcd")"));
  EXPECT_FALSE(m.matches(R"("\ud83d\ude00")"));  // surrogate escapes are not produced
}

TEST(JsonSchemaToGbnf, IntegerBoundsThroughSchemas) {
  struct BoundCase {
    const char* schema;
    std::vector<int64_t> good;
    std::vector<int64_t> bad;
  };
  const std::vector<BoundCase> cases = {
      {R"({"type":"integer","minimum":1,"maximum":12})", {1, 7, 10, 12}, {0, 13, -1, 20}},
      {R"({"type":"integer","minimum":0})", {0, 1, 9999999999999999}, {-1, 10000000000000000}},
      {R"({"type":"integer","minimum":-5})", {-5, 0, 123456}, {-6, -10}},
      {R"({"type":"integer","maximum":100})", {100, -9999999999999999, 0}, {101, 1000}},
      {R"({"type":"integer","exclusiveMinimum":0.5,"exclusiveMaximum":3})", {1, 2}, {0, 3}},
      {R"({"type":"integer","minimum":1.5,"maximum":3.9})", {2, 3}, {1, 4}},
  };
  for (const BoundCase& c : cases) {
    SCOPED_TRACE(c.schema);
    const FullMatcher m = matcher_of(ordered_json::parse(c.schema));
    for (int64_t v : c.good) EXPECT_TRUE(m.matches(std::to_string(v))) << v;
    for (int64_t v : c.bad) EXPECT_FALSE(m.matches(std::to_string(v))) << v;
  }
}

}  // namespace
}  // namespace arbor::grammar
