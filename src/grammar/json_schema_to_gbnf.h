// JSON Schema -> GBNF grammar text, for structured output (OpenAI `response_format`
// json_schema / json_object, vLLM `guided_json`).
//
// The grammar's language is a subset of the JSON texts valid under the schema (with the
// semantics below): every accepted text parses as JSON and validates; valid texts outside the
// grammar are only those that use other whitespace, key order or escapes than the grammar
// produces, or numbers longer than its digit caps.
//
// Supported keywords (anything else that affects validation is kInvalidArgument, e.g.
// "unsupported JSON Schema keyword 'patternProperties' at /properties/a"; paths are JSON
// pointers into the schema, "/" for the root):
//   * annotations, ignored: title description default examples $schema $id $comment deprecated
//     readOnly writeOnly; $defs and definitions (their schemas are checked only when referenced).
//   * boolean schemas: true (any JSON value); false only where it removes an option (a property,
//     an anyOf branch, a prefixItems slot, additionalProperties, items).
//   * type: one name or an array of names. Without `type`, the schema is restricted to the types
//     whose keywords it uses (properties -> object, minLength -> string, ...), or any JSON value
//     when it uses none: a subset of JSON Schema's "any type" that matches what such schemas mean.
//   * enum / const (any JSON values; emitted as their compact serialisation, filtered by `type`;
//     other keywords beside them are rejected).
//   * anyOf; oneOf is treated as anyOf (exclusivity is not enforced); allOf with one schema.
//     Siblings of anyOf/oneOf/allOf/$ref other than annotations are rejected.
//   * $ref to local JSON pointers: "#", "#/$defs/NAME", "#/definitions/NAME" (any "#/..." pointer
//     works). Each referenced schema becomes one rule, so recursion is allowed; a cycle of
//     references that passes through no object or array is rejected.
//   * object: properties (emitted in the schema's order; with a nlohmann::json schema that order
//     is alphabetical, see below), required, additionalProperties (false, true or a schema).
//     ABSENT additionalProperties MEANS false, as in OpenAI's strict mode, in every schema that
//     describes objects (its type includes "object", or it has properties, required or
//     additionalProperties); {} and other schemas still accept any object. Optional properties
//     may be present or absent but keep the declared order. Additional properties come after
//     the declared ones; their names use no escapes and avoid the declared names (declared
//     names are then limited to 256 characters); duplicates among them are not prevented.
//     A required name missing from `properties` is rejected. minProperties, maxProperties,
//     patternProperties, propertyNames, dependent* are unsupported.
//   * array: items (a schema), prefixItems, minItems, maxItems. With prefixItems and no items,
//     further elements are any JSON value (JSON Schema's default); `items: false` ends the array.
//     The draft-4 array form of items is rejected.
//   * string: minLength / maxLength (code points), pattern, format. The pattern must match the
//     WHOLE string (treated as anchored ^...$, like Outlines and vLLM; JSON Schema itself searches
//     unanchored); see regex_to_gbnf.h for the regex subset. Formats: date (calendar-valid
//     YYYY-MM-DD, leap years included), time (HH:MM:SS, optional .fraction of 1-9 digits,
//     then Z or +HH:MM/-HH:MM; no leap second, uppercase Z), date-time (date "T" time), uuid
//     (8-4-4-4-12 hex digits, either case), email (dot-separated atoms of [A-Za-z0-9_%+-], "@",
//     two or more dot-separated DNS labels of 1-63 [A-Za-z0-9-] not starting or ending with
//     '-'), ipv4 (dotted quad, 0-255, no leading zeros). Other formats are rejected, as is
//     combining format, pattern and minLength/maxLength with one another.
//   * integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers; fractional bounds
//     round inward) -> an exact digit-range grammar; without an upper (lower) bound values stop
//     at 16 digits.
//   * number: the same four keywords with integer values only (else kInvalidArgument); bounded
//     numbers have no exponent. multipleOf is unsupported.
//   Strings allow the JSON escapes \" \\ \/ \b \f \n \r \t \uXXXX (not surrogates: each escape
//   is one code point); content is any code point except " \ and U+0000..U+001F.
//   Unbounded numbers: int part up to 16 digits, fraction up to 15, exponent up to 2 digits.
//
// Generated grammar: `root` first, then one rule per referenced definition (named after it:
// #/$defs/Address -> Address) and per complex property / item / branch schema (named from the
// path: root-address, root-tags-item, root-0; plus root-additional-key for additional-property
// names and root-code-repeat for costly repeated pattern atoms), rules with identical bodies
// merged; then the shared rules that were used, from this fixed list: ws value object array
// string char number integer boolean null date time date-time uuid email ipv4 ipv4-octet (a
// definition named like one of them gets a suffix: string-2). Every rule is on one line.
// Whitespace (kFlexible) is the `ws` rule after { [ , : and before } ], never before the root
// value or after it.
//
// Pure functions; any thread. Deeply nested schemas (over 128 levels) are rejected.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace arbor::grammar {

enum class JsonWhitespace {
  // No whitespace at all: {"a":1,"b":[1,2]}.
  kCompact,
  // Optional bounded whitespace between tokens: ws ::= ( " " | "\n" [ \t]{0,8} )?
  kFlexible,
};

struct JsonGrammarOptions {
  JsonWhitespace whitespace = JsonWhitespace::kFlexible;  // default: flexible
  // The name of the rule for the schema's value, which also prefixes the rules derived from it.
  // Another name than "root" leaves `root` undefined (and reserved) for a caller that embeds
  // the value in a grammar of its own (tool calls: root ::= "<tool_call>" call ...). It must be
  // a GBNF rule name that is not one of the shared rules listed above.
  std::string root_rule = "root";
};

// The grammar for JSON texts valid under `schema` (see above). kInvalidArgument names the
// unsupported keyword or the bad value and its path. Properties come out in the schema's order.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                        const JsonGrammarOptions& options = {});

// The same for a nlohmann::json schema, whose objects keep their keys sorted: properties come
// out in alphabetical order. Parse request bodies as ordered_json to keep the declared order.
Result<std::string> json_schema_to_gbnf(const nlohmann::json& schema,
                                        const JsonGrammarOptions& options = {});

// The grammar for OpenAI's `json_object` mode: root is any JSON object; values any JSON.
// Cannot fail; a Result for symmetry with json_schema_to_gbnf.
Result<std::string> free_json_gbnf(const JsonGrammarOptions& options = {});

}  // namespace arbor::grammar
