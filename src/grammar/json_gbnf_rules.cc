#include "grammar/json_gbnf_rules.h"

#include "grammar/gbnf_text.h"

namespace arbor::grammar::internal {

namespace {

constexpr std::string_view kNames[kNumSharedRules] = {
    "ws",      "value", "object", "array", "string",    "char", "number", "integer", "boolean",
    "null",    "date",  "time",   "date-time", "uuid", "email", "ipv4",   "ipv4-octet",
};

// Day ranges per month group; February 29 only in leap years (divisible by 4, centuries only
// when divisible by 400).
constexpr char kDate[] =
    "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" "
    "[01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( "
    "\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | ( [0-9]{2} ( \"0\" [48] | [2468] [048] | "
    "[13579] [26] ) | ( [02468] [048] | [13579] [26] ) \"00\" ) \"-02-29\"";

constexpr char kTime[] =
    "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( "
    "\"Z\" | [+\\-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";

constexpr char kUuid[] =
    "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
    "[0-9a-fA-F]{12}";

constexpr char kEmail[] =
    "[A-Za-z0-9_%+\\-]+ ( \".\" [A-Za-z0-9_%+\\-]+ )* \"@\" [A-Za-z0-9] ( [A-Za-z0-9\\-]{0,61} "
    "[A-Za-z0-9] )? ( \".\" [A-Za-z0-9] ( [A-Za-z0-9\\-]{0,61} [A-Za-z0-9] )? )+";

// One code point of a JSON string: anything but " \ and controls, or an escape. \u escapes
// exclude surrogates so that each escape is exactly one code point.
constexpr char kChar[] =
    "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} "
    "| [dD] [0-7] [0-9a-fA-F]{2} ) )";

}  // namespace

std::string_view shared_rule_name(SharedRule rule) { return kNames[static_cast<int>(rule)]; }

std::string shared_rule_body(SharedRule rule, JsonWhitespace whitespace) {
  const std::string ws = whitespace == JsonWhitespace::kFlexible ? "ws" : "";
  switch (rule) {
    case SharedRule::kWs: return "( \" \" | \"\\n\" [ \\t]{0,8} )?";
    case SharedRule::kValue: return "object | array | string | number | boolean | null";
    case SharedRule::kObject: {
      const std::string member = gbnf_sequence({"string", "\":\"", ws, "value"});
      return gbnf_sequence({"\"{\"", ws, "(", member, "(", "\",\"", ws, member, ")*", ws, ")?",
                            "\"}\""});
    }
    case SharedRule::kArray:
      return gbnf_sequence(
          {"\"[\"", ws, "(", "value", "(", "\",\"", ws, "value", ")*", ws, ")?", "\"]\""});
    case SharedRule::kString: return "\"\\\"\" char* \"\\\"\"";
    case SharedRule::kChar: return kChar;
    case SharedRule::kNumber:
      return "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,15} )? ( [eE] [\\-+]? "
             "[0-9]{1,2} )?";
    case SharedRule::kInteger: return "\"0\" | \"-\"? [1-9] [0-9]{0,15}";
    case SharedRule::kBoolean: return "\"true\" | \"false\"";
    case SharedRule::kNull: return "\"null\"";
    case SharedRule::kDate: return kDate;
    case SharedRule::kTime: return kTime;
    case SharedRule::kDateTime: return "date \"T\" time";
    case SharedRule::kUuid: return kUuid;
    case SharedRule::kEmail: return kEmail;
    case SharedRule::kIpv4:
      return "ipv4-octet \".\" ipv4-octet \".\" ipv4-octet \".\" ipv4-octet";
    case SharedRule::kIpv4Octet:
      return "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]";
  }
  return "";
}

std::vector<SharedRule> shared_rule_dependencies(SharedRule rule, JsonWhitespace whitespace) {
  const bool flexible = whitespace == JsonWhitespace::kFlexible;
  switch (rule) {
    case SharedRule::kValue:
      return {SharedRule::kObject, SharedRule::kArray,   SharedRule::kString,
              SharedRule::kNumber, SharedRule::kBoolean, SharedRule::kNull};
    case SharedRule::kObject:
      if (flexible) return {SharedRule::kWs, SharedRule::kString, SharedRule::kValue};
      return {SharedRule::kString, SharedRule::kValue};
    case SharedRule::kArray:
      if (flexible) return {SharedRule::kWs, SharedRule::kValue};
      return {SharedRule::kValue};
    case SharedRule::kString: return {SharedRule::kChar};
    case SharedRule::kDateTime: return {SharedRule::kDate, SharedRule::kTime};
    case SharedRule::kIpv4: return {SharedRule::kIpv4Octet};
    case SharedRule::kWs:
    case SharedRule::kChar:
    case SharedRule::kNumber:
    case SharedRule::kInteger:
    case SharedRule::kBoolean:
    case SharedRule::kNull:
    case SharedRule::kDate:
    case SharedRule::kTime:
    case SharedRule::kUuid:
    case SharedRule::kEmail:
    case SharedRule::kIpv4Octet:
      return {};
  }
  return {};
}

}  // namespace arbor::grammar::internal
