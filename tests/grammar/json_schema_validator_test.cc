// The test-only JSON Schema validator (tests/support/json_schema_validator.h): valid and invalid
// instances per keyword, with the exact first-violation messages.
#include "support/json_schema_validator.h"

#include <gtest/gtest.h>

#include <string>

namespace arbor::test {
namespace {

using nlohmann::json;

std::optional<std::string> check(const char* value, const char* schema) {
  return validate_json(json::parse(value), json::parse(schema));
}

constexpr std::nullopt_t kValid = std::nullopt;

TEST(JsonSchemaValidator, Type) {
  EXPECT_EQ(check(R"("x")", R"({"type":"string"})"), kValid);
  EXPECT_EQ(check("1", R"({"type":"integer"})"), kValid);
  EXPECT_EQ(check("1.0", R"({"type":"integer"})"), kValid);
  EXPECT_EQ(check("18446744073709551615", R"({"type":"integer"})"), kValid);
  EXPECT_EQ(check("1.5", R"({"type":"integer"})"), "at /: 1.5 is not of type \"integer\"");
  EXPECT_EQ(check("1.5", R"({"type":"number"})"), kValid);
  EXPECT_EQ(check("true", R"({"type":"boolean"})"), kValid);
  EXPECT_EQ(check("null", R"({"type":"null"})"), kValid);
  EXPECT_EQ(check("0", R"({"type":"null"})"), "at /: 0 is not of type \"null\"");
  EXPECT_EQ(check("[]", R"({"type":"object"})"), "at /: [] is not of type \"object\"");
  EXPECT_EQ(check("{}", R"({"type":"array"})"), "at /: {} is not of type \"array\"");
  EXPECT_EQ(check("null", R"({"type":["string","null"]})"), kValid);
  EXPECT_EQ(check("1", R"({"type":["string","null"]})"),
            "at /: 1 is not of type [\"string\",\"null\"]");
  EXPECT_EQ(check(R"("x")", "true"), kValid);
  EXPECT_EQ(check(R"("x")", "false"), "at /: the schema false accepts nothing");
  EXPECT_EQ(check(R"({"a":[1]})", "{}"), kValid);
}

TEST(JsonSchemaValidator, EnumAndConst) {
  EXPECT_EQ(check("2", R"({"enum":[1,2]})"), kValid);
  EXPECT_EQ(check("2.0", R"({"enum":[1,2]})"), kValid);
  EXPECT_EQ(check("3", R"({"enum":[1,2]})"), "at /: 3 is not in enum");
  EXPECT_EQ(check(R"({"a":[1]})", R"({"enum":[{"a":[1]}]})"), kValid);
  EXPECT_EQ(check(R"({"a":[2]})", R"({"enum":[{"a":[1]}]})"), "at /: {\"a\":[2]} is not in enum");
  EXPECT_EQ(check(R"("x")", R"({"const":"x"})"), kValid);
  EXPECT_EQ(check(R"("y")", R"({"const":"x"})"), "at /: \"y\" is not the const \"x\"");
}

TEST(JsonSchemaValidator, Combinators) {
  EXPECT_EQ(check("1", R"({"anyOf":[{"type":"string"},{"type":"integer"}]})"), kValid);
  EXPECT_EQ(check("true", R"({"anyOf":[{"type":"string"},{"type":"integer"}]})"),
            "at /: matches no schema of anyOf");
  // oneOf is anyOf: matching both branches is fine.
  EXPECT_EQ(check("1", R"({"oneOf":[{"type":"number"},{"type":"integer"}]})"), kValid);
  EXPECT_EQ(check("null", R"({"oneOf":[{"type":"number"}]})"), "at /: matches no schema of oneOf");
  EXPECT_EQ(check("5", R"({"allOf":[{"minimum":1},{"maximum":4}]})"),
            "at /: 5 is greater than maximum 4");
}

TEST(JsonSchemaValidator, References) {
  const char* tree = R"({"$ref":"#/$defs/T","$defs":{"T":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/T"}}},
      "required":["v"]}}})";
  EXPECT_EQ(check(R"({"v":1,"kids":[{"v":2,"kids":[]}]})", tree), kValid);
  EXPECT_EQ(check(R"({"v":1,"kids":[{"v":2,"kids":[{"v":"x"}]}]})", tree),
            "at /kids/0/kids/0/v: \"x\" is not of type \"integer\"");
  EXPECT_EQ(check(R"({"v":1,"kids":[{}]})", tree), "at /kids/0: required property 'v' is missing");
  EXPECT_EQ(check(R"({"next":{"next":{}}})",
                  R"({"type":"object","properties":{"next":{"$ref":"#"}}})"),
            kValid);
  EXPECT_EQ(check(R"({"x":1})", R"({"definitions":{"A":{"type":"object",
      "additionalProperties":true}},"$ref":"#/definitions/A"})"),
            kValid);
  EXPECT_EQ(check("1", R"({"$ref":"#/$defs/nope"})"), "unresolved $ref #/$defs/nope");
}

TEST(JsonSchemaValidator, ObjectsAndAbsentAdditionalPropertiesMeansFalse) {
  const char* schema = R"({"type":"object","properties":{"a":{"type":"string"},
      "b":{"type":"integer"}},"required":["a"]})";
  EXPECT_EQ(check(R"({"a":"x"})", schema), kValid);
  EXPECT_EQ(check(R"({"b":1,"a":"x"})", schema), kValid);  // order is free here
  EXPECT_EQ(check(R"({"b":1})", schema), "at /: required property 'a' is missing");
  EXPECT_EQ(check(R"({"a":"x","c":1})", schema), "at /: property 'c' is not allowed");
  EXPECT_EQ(check(R"({"a":1})", schema), "at /a: 1 is not of type \"string\"");
  EXPECT_EQ(check(R"({"a":"x","c":1})",
                  R"({"type":"object","properties":{"a":{}},"additionalProperties":true})"),
            kValid);
  EXPECT_EQ(check(R"({"c":"x"})",
                  R"({"type":"object","additionalProperties":{"type":"integer"}})"),
            "at /c: \"x\" is not of type \"integer\"");
  EXPECT_EQ(check(R"({"c":1})", R"({"type":"object"})"), "at /: property 'c' is not allowed");
  EXPECT_EQ(check(R"({"a/b":{"c~":1}})", R"({"type":"object","properties":{"a/b":{
      "type":"object","properties":{"c~":{"type":"string"}}}}})"),
            "at /a~1b/c~0: 1 is not of type \"string\"");
  // A schema that does not describe objects leaves their properties alone.
  EXPECT_EQ(check(R"({"c":1})", R"({"anyOf":[{},{"type":"null"}]})"), kValid);
  EXPECT_EQ(check(R"({"c":1})", R"({"minLength":3})"), kValid);
}

TEST(JsonSchemaValidator, Arrays) {
  const char* schema = R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],
      "items":{"type":"boolean"},"minItems":1,"maxItems":3})";
  EXPECT_EQ(check(R"([1])", schema), kValid);
  EXPECT_EQ(check(R"([1,"a",true])", schema), kValid);
  EXPECT_EQ(check(R"([])", schema), "at /: 0 items, fewer than minItems");
  EXPECT_EQ(check(R"([1,"a",true,false])", schema), "at /: 4 items, more than maxItems");
  EXPECT_EQ(check(R"(["a"])", schema), "at /0: \"a\" is not of type \"integer\"");
  EXPECT_EQ(check(R"([1,"a",1])", schema), "at /2: 1 is not of type \"boolean\"");
  EXPECT_EQ(check(R"([1,{"x":[]}])", R"({"type":"array","prefixItems":[{"type":"integer"}]})"),
            kValid);
  EXPECT_EQ(check(R"([1,2])", R"({"type":"array","prefixItems":[{}],"items":false})"),
            "at /1: the schema false accepts nothing");
}

TEST(JsonSchemaValidator, StringsCountCodePointsAndAnchorPatterns) {
  EXPECT_EQ(check("\"\xC3\xA9\xF0\x9F\x98\x80\"", R"({"type":"string","maxLength":2})"), kValid);
  EXPECT_EQ(check(R"("abc")", R"({"type":"string","maxLength":2})"),
            "at /: length 3 is greater than maxLength");
  EXPECT_EQ(check(R"("a")", R"({"type":"string","minLength":2})"),
            "at /: length 1 is less than minLength");
  EXPECT_EQ(check(R"("b")", R"({"type":"string","pattern":"b"})"), kValid);
  EXPECT_EQ(check(R"("abc")", R"({"type":"string","pattern":"b"})"),
            "at /: \"abc\" does not match pattern \"b\"");
  EXPECT_EQ(check(R"("ab\n")", R"({"type":"string","pattern":"^ab$"})"),
            "at /: \"ab\\n\" does not match pattern \"^ab$\"");
  EXPECT_EQ(check("\"\xC3\xA9\"", R"({"type":"string","pattern":"\\u00e9"})"), kValid);
  // Length and pattern only constrain strings.
  EXPECT_EQ(check("12345", R"({"maxLength":2,"pattern":"x"})"), kValid);
}

TEST(JsonSchemaValidator, Formats) {
  auto fmt = [](const char* format, const char* value) {
    return validate_json(json(value), json{{"type", "string"}, {"format", format}});
  };
  EXPECT_EQ(fmt("date", "2024-02-29"), kValid);
  EXPECT_EQ(fmt("date", "2000-02-29"), kValid);
  EXPECT_EQ(fmt("date", "1900-02-29"), "at /: \"1900-02-29\" is not a valid date");
  EXPECT_EQ(fmt("date", "2023-04-31"), "at /: \"2023-04-31\" is not a valid date");
  EXPECT_EQ(fmt("date", "2023-4-30"), "at /: \"2023-4-30\" is not a valid date");
  EXPECT_EQ(fmt("time", "23:59:59.123+01:00"), kValid);
  EXPECT_EQ(fmt("time", "23:59:60Z"), "at /: \"23:59:60Z\" is not a valid time");
  EXPECT_EQ(fmt("date-time", "2024-01-01T00:00:00Z"), kValid);
  EXPECT_EQ(fmt("date-time", "2024-01-01 00:00:00Z"),
            "at /: \"2024-01-01 00:00:00Z\" is not a valid date-time");
  EXPECT_EQ(fmt("uuid", "123e4567-e89b-12d3-a456-426614174000"), kValid);
  EXPECT_EQ(fmt("uuid", "123e4567-e89b-12d3-a456-42661417400"),
            "at /: \"123e4567-e89b-12d3-a456-42661417400\" is not a valid uuid");
  EXPECT_EQ(fmt("email", "a.b+c@d-e.fg"), kValid);
  EXPECT_EQ(fmt("email", "a@b"), "at /: \"a@b\" is not a valid email");
  EXPECT_EQ(fmt("email", "a..b@c.de"), "at /: \"a..b@c.de\" is not a valid email");
  EXPECT_EQ(fmt("ipv4", "192.168.0.1"), kValid);
  EXPECT_EQ(fmt("ipv4", "192.168.0.01"), "at /: \"192.168.0.01\" is not a valid ipv4");
  EXPECT_EQ(fmt("ipv4", "256.1.1.1"), "at /: \"256.1.1.1\" is not a valid ipv4");
  EXPECT_EQ(fmt("uri", "http://x"), "at /: \"http://x\" is not a valid uri");
}

TEST(JsonSchemaValidator, NumericBounds) {
  EXPECT_EQ(check("1", R"({"minimum":1,"maximum":12})"), kValid);
  EXPECT_EQ(check("12.0", R"({"minimum":1,"maximum":12})"), kValid);
  EXPECT_EQ(check("12.5", R"({"minimum":1,"maximum":12})"),
            "at /: 12.5 is greater than maximum 12");
  EXPECT_EQ(check("0", R"({"minimum":1})"), "at /: 0 is less than minimum 1");
  EXPECT_EQ(check("0", R"({"exclusiveMinimum":0})"),
            "at /: 0 is not greater than exclusiveMinimum 0");
  EXPECT_EQ(check("0.001", R"({"exclusiveMinimum":0})"), kValid);
  EXPECT_EQ(check("3", R"({"exclusiveMaximum":3})"),
            "at /: 3 is not less than exclusiveMaximum 3");
  EXPECT_EQ(check("9223372036854775807", R"({"maximum":9223372036854775806})"),
            "at /: 9223372036854775807 is greater than maximum 9223372036854775806");
  EXPECT_EQ(check("-1", R"({"minimum":-1.5})"), kValid);
}

TEST(JsonSchemaValidator, UnsupportedKeywordsFailValidation) {
  EXPECT_EQ(check("1", R"({"not":{"type":"string"}})"), "unsupported keyword 'not'");
  EXPECT_EQ(check(R"({"a":1})", R"({"type":"object","properties":{"a":{"multipleOf":2}}})"),
            "unsupported keyword 'multipleOf'");
  EXPECT_EQ(check("1", R"({"title":"t","description":"d","default":1,"examples":[1]})"), kValid);
}

}  // namespace
}  // namespace arbor::test
