#include "grammar/grammar_spec.h"

#include <nlohmann/json.hpp>

#include "grammar/choice_to_gbnf.h"
#include "grammar/json_schema_to_gbnf.h"
#include "grammar/regex_to_gbnf.h"

namespace arbor::grammar {

std::string GrammarSpec::cache_key() const {
  std::string key(grammar_kind_name(kind));
  key.push_back('\0');
  key += source;
  return key;
}

std::string_view grammar_kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kGbnf: return "grammar";
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kJsonObject: return "json_object";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kChoice: return "choice";
  }
  return "?";
}

namespace {

// Ordered: a schema's properties keep their order in the output.
Result<nlohmann::ordered_json> parse_json(std::string_view text, std::string_view what) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(what, " is not valid JSON");
  return j;
}

}  // namespace

Result<std::string> spec_to_gbnf(const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarKind::kGbnf: return spec.source;
    case GrammarKind::kJsonSchema: {
      ARBOR_ASSIGN_OR_RETURN(const nlohmann::ordered_json schema, parse_json(spec.source, "the JSON Schema"));
      return json_schema_to_gbnf(schema);
    }
    case GrammarKind::kJsonObject: return free_json_gbnf();
    case GrammarKind::kRegex: return regex_to_gbnf(spec.source);
    case GrammarKind::kChoice: {
      ARBOR_ASSIGN_OR_RETURN(const nlohmann::ordered_json list, parse_json(spec.source, "the choice list"));
      if (!list.is_array()) return invalid_argument("the choice list must be an array of strings");
      std::vector<std::string> choices;
      for (const nlohmann::ordered_json& c : list) {
        if (!c.is_string()) return invalid_argument("the choice list must be an array of strings");
        choices.push_back(c.get<std::string>());
      }
      return choice_to_gbnf(choices);
    }
  }
  return invalid_argument("unknown grammar kind");
}

Result<Automaton> compile_spec(const GrammarSpec& spec) {
  ARBOR_ASSIGN_OR_RETURN(const std::string gbnf, spec_to_gbnf(spec));
  return compile_gbnf(gbnf);
}

}  // namespace arbor::grammar
