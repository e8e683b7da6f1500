// The shared rules of the JSON grammars json_schema_to_gbnf.h writes (internal to the grammar
// module): their names, bodies and dependencies.
//
// Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/json_schema_to_gbnf.h"

namespace arbor::grammar::internal {

// In the order the rules are written at the end of a grammar.
enum class SharedRule {
  kWs,
  kValue,
  kObject,
  kArray,
  kString,
  kChar,
  kNumber,
  kInteger,
  kBoolean,
  kNull,
  kDate,
  kTime,
  kDateTime,
  kUuid,
  kEmail,
  kIpv4,
  kIpv4Octet,
};
inline constexpr int kNumSharedRules = static_cast<int>(SharedRule::kIpv4Octet) + 1;

// "ws", "value", ..., "ipv4-octet".
std::string_view shared_rule_name(SharedRule rule);

// The rule's body, one line. kCompact grammars never use kWs and leave it out of the others.
std::string shared_rule_body(SharedRule rule, JsonWhitespace whitespace);

// The shared rules `rule`'s body refers to.
std::vector<SharedRule> shared_rule_dependencies(SharedRule rule, JsonWhitespace whitespace);

}  // namespace arbor::grammar::internal
