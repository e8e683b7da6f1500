// Structured-output request fields, in every dialect arbor's clients speak, read into one
// grammar::GrammarSpec (docs/structured_output.md, "API"):
//   OpenAI      response_format: {"type": "text" | "json_object" | "json_schema",
//                                 "json_schema": {"name", "schema", "strict"}}
//   Responses   text.format: {"type": "text" | "json_object" | "json_schema", "name",
//                             "schema", "strict", "description"} (/v1/responses)
//   vLLM        structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object"}
//               and the older guided_json, guided_regex, guided_choice, guided_grammar
//   llama.cpp   grammar (GBNF text), json_schema (an object)
//   TGI         parameters.grammar: {"type": "json" | "regex", "value": ...} (TGI routes)
// At most one constraint per request (two are a 400 naming both). The spec is compiled here, so
// a schema or grammar arbor cannot run is a 400 naming the field and the problem, never a
// request that silently runs unconstrained.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "grammar/grammar_spec.h"
#include "server/api_errors.h"

namespace arbor::server {

// OpenAI routes (completions and chat). Leaves *out unchanged when no field asks for a format.
// raw_body: the body text `body` was parsed from ("" = none), read again for a JSON Schema so
// that its properties keep their order.
std::optional<ApiError> read_structured_output(const nlohmann::json& body,
                                               std::string_view raw_body,
                                               std::optional<grammar::GrammarSpec>* out);
// /v1/responses: `text` ({"format": ..., "verbosity": null}). A verbosity other than null is a
// 400 naming text.verbosity.
std::optional<ApiError> read_text_format(const nlohmann::json& body, std::string_view raw_body,
                                         std::optional<grammar::GrammarSpec>* out);
// TGI routes: `parameters.grammar`.
std::optional<ApiError> read_tgi_grammar(const nlohmann::json& parameters,
                                         std::string_view raw_body,
                                         std::optional<grammar::GrammarSpec>* out);

}  // namespace arbor::server
