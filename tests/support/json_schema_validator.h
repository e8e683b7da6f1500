// Test-only JSON Schema validator for exactly the subset and semantics that
// src/grammar/json_schema_to_gbnf.h documents, written independently of the converter (it shares
// no code with it) so that tests can check what a generated grammar accepts against it.
//
// Semantics that differ from plain JSON Schema, as the converter defines them:
//   * an absent additionalProperties means false in a schema that describes objects (type
//     includes "object", or it has properties, required or additionalProperties);
//   * oneOf is anyOf (exclusivity not checked);
//   * `pattern` must match the whole string (PCRE2, anchored at both ends);
//   * formats date, time, date-time, uuid, email, ipv4 as the converter's header defines them.
// Keywords outside the subset make validation fail with "unsupported keyword ...", so a test
// cannot pass by accident on a schema this validator does not understand.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace arbor::test {

// Not thread-safe (compiled patterns are cached in a process-wide map).
//
// nullopt when `value` is valid under `schema`; else a message naming the first violation and
// where it is, e.g. "at /age: 151 is greater than maximum 150".
std::optional<std::string> validate_json(const nlohmann::json& value,
                                         const nlohmann::json& schema);

}  // namespace arbor::test
