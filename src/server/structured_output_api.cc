#include "server/structured_output_api.h"

#include <string>
#include <vector>

#include "base/status.h"
#include "server/api_common.h"

namespace arbor::server {
namespace {

using grammar::GrammarKind;
using grammar::GrammarSpec;
using json = nlohmann::json;

bool present(const json& o, const char* name) { return o.contains(name) && !o[name].is_null(); }

// One constraint found in the body, with the field that asked for it.
struct Found {
  std::string field;
  GrammarSpec spec;
  std::string pointer;  // kJsonSchema: where the schema is in the body (a JSON pointer)
};

std::optional<ApiError> schema_spec(const json& v, const std::string& field,
                                    const std::string& pointer, Found* out) {
  if (v.is_string()) {  // vLLM accepts the schema as JSON text too
    const json parsed = json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      return invalid_param(field, str_cat("'", field, "' must be a JSON Schema object"));
    }
    *out = Found{field, GrammarSpec{GrammarKind::kJsonSchema, parsed.dump()}, pointer};
    return std::nullopt;
  }
  if (!v.is_object() && !v.is_boolean()) {
    return invalid_param(field, str_cat("'", field, "' must be a JSON Schema object"));
  }
  *out = Found{field, GrammarSpec{GrammarKind::kJsonSchema, v.dump()}, pointer};
  return std::nullopt;
}

std::optional<ApiError> string_spec(const json& v, const std::string& field, GrammarKind kind,
                                    Found* out) {
  if (!v.is_string() || v.get<std::string>().empty()) {
    return invalid_param(field, str_cat("'", field, "' must be a non-empty string"));
  }
  *out = Found{field, GrammarSpec{kind, v.get<std::string>()}};
  return std::nullopt;
}

std::optional<ApiError> choice_spec(const json& v, const std::string& field, Found* out) {
  if (!v.is_array() || v.empty()) {
    return invalid_param(field, str_cat("'", field, "' must be a non-empty array of strings"));
  }
  for (const json& c : v) {
    if (!c.is_string()) {
      return invalid_param(field, str_cat("'", field, "' must be a non-empty array of strings"));
    }
  }
  *out = Found{field, GrammarSpec{GrammarKind::kChoice, v.dump()}};
  return std::nullopt;
}

std::optional<ApiError> read_response_format(const json& rf, std::vector<Found>* found) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
    return invalid_param("response_format",
                         "'response_format' must be an object with a string 'type'");
  }
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    found->push_back(Found{"response_format", GrammarSpec{GrammarKind::kJsonObject, ""}});
    return std::nullopt;
  }
  if (type == "json_schema") {
    const auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object()) {
      return invalid_param("response_format.json_schema",
                           "'response_format.json_schema' is required for type 'json_schema'");
    }
    // OpenAI's shape nests the schema under "schema"; vLLM also accepts the schema itself.
    const bool nested = js->contains("schema");
    const json& schema = nested ? (*js)["schema"] : *js;
    if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null()) {
      return invalid_param("response_format.json_schema.strict",
                           "'response_format.json_schema.strict' must be a boolean");
    }
    Found f;
    ARBOR_API_TRY(schema_spec(schema, "response_format.json_schema.schema",
                              nested ? "/response_format/json_schema/schema"
                                     : "/response_format/json_schema",
                              &f));
    found->push_back(std::move(f));
    return std::nullopt;
  }
  return invalid_param("response_format.type",
                       str_cat("'response_format.type' is '", type,
                               "'; supported: text, json_object, json_schema"));
}

std::optional<ApiError> read_vllm(const json& so, std::vector<Found>* found) {
  if (!so.is_object()) {
    return invalid_param("structured_outputs", "'structured_outputs' must be an object");
  }
  for (const auto& [key, value] : so.items()) {
    if (value.is_null()) continue;
    const std::string field = "structured_outputs." + key;
    Found f;
    if (key == "json") {
      ARBOR_API_TRY(schema_spec(value, field, "/structured_outputs/json", &f));
    } else if (key == "regex") {
      ARBOR_API_TRY(string_spec(value, field, GrammarKind::kRegex, &f));
    } else if (key == "choice") {
      ARBOR_API_TRY(choice_spec(value, field, &f));
    } else if (key == "grammar") {
      ARBOR_API_TRY(string_spec(value, field, GrammarKind::kGbnf, &f));
    } else if (key == "json_object") {
      if (!value.is_boolean()) return invalid_param(field, str_cat("'", field, "' must be a boolean"));
      if (!value.get<bool>()) continue;
      f = Found{field, GrammarSpec{GrammarKind::kJsonObject, ""}};
    } else if (key == "disable_any_whitespace" || key == "disable_fallback" ||
               key == "disable_additional_properties" || key == "whitespace_pattern" ||
               key == "structural_tag") {
      return invalid_param(field, str_cat("'", field, "' is not supported"));
    } else {
      return invalid_param(field, str_cat("'", field, "' is not a structured_outputs field "
                                                      "(json, regex, choice, grammar, json_object)"));
    }
    found->push_back(std::move(f));
  }
  return std::nullopt;
}

// The request body was parsed into nlohmann::json, whose objects sort their keys; a schema's
// "properties" order is the order the output must follow (as OpenAI's), so the schema is read
// again from the raw body in its own order.
void restore_property_order(std::string_view raw_body, Found& f) {
  if (f.spec.kind != GrammarKind::kJsonSchema || raw_body.empty() || f.pointer.empty()) return;
  const nlohmann::ordered_json body = nlohmann::ordered_json::parse(raw_body, nullptr, false);
  const nlohmann::ordered_json::json_pointer pointer(f.pointer);
  if (body.is_discarded() || !body.contains(pointer)) return;
  const nlohmann::ordered_json& v = body.at(pointer);
  if (v.is_string()) {
    const auto parsed = nlohmann::ordered_json::parse(v.get<std::string>(), nullptr, false);
    if (!parsed.is_discarded()) f.spec.source = parsed.dump();
    return;
  }
  f.spec.source = v.dump();
}

std::optional<ApiError> one_spec(std::vector<Found>& found, std::string_view raw_body,
                                 std::optional<GrammarSpec>* out) {
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    return invalid_param(found[1].field, str_cat("'", found[0].field, "' and '", found[1].field,
                                                 "' both constrain the output; send one"));
  }
  restore_property_order(raw_body, found[0]);
  Result<grammar::Automaton> compiled = grammar::compile_spec(found[0].spec);
  if (!compiled.ok()) {
    return invalid_param(found[0].field,
                         str_cat("'", found[0].field, "': ", compiled.status().message()));
  }
  *out = std::move(found[0].spec);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_structured_output(const json& b, std::string_view raw_body,
                                               std::optional<GrammarSpec>* out) {
  std::vector<Found> found;
  if (present(b, "response_format")) ARBOR_API_TRY(read_response_format(b["response_format"], &found));
  if (present(b, "structured_outputs")) ARBOR_API_TRY(read_vllm(b["structured_outputs"], &found));
  struct Legacy {
    const char* name;
    GrammarKind kind;
  };
  for (const Legacy& l : {Legacy{"guided_json", GrammarKind::kJsonSchema},
                          Legacy{"json_schema", GrammarKind::kJsonSchema},
                          Legacy{"guided_regex", GrammarKind::kRegex},
                          Legacy{"guided_choice", GrammarKind::kChoice},
                          Legacy{"guided_grammar", GrammarKind::kGbnf},
                          Legacy{"grammar", GrammarKind::kGbnf}}) {
    if (!present(b, l.name)) continue;
    Found f;
    const json& v = b[l.name];
    switch (l.kind) {
      case GrammarKind::kJsonSchema:
        ARBOR_API_TRY(schema_spec(v, l.name, std::string("/") + l.name, &f));
        break;
      case GrammarKind::kChoice: ARBOR_API_TRY(choice_spec(v, l.name, &f)); break;
      default: ARBOR_API_TRY(string_spec(v, l.name, l.kind, &f)); break;
    }
    found.push_back(std::move(f));
  }
  for (const char* unsupported : {"guided_whitespace_pattern", "guided_decoding_backend"}) {
    if (present(b, unsupported)) {
      return invalid_param(unsupported, str_cat("'", unsupported, "' is not supported"));
    }
  }
  return one_spec(found, raw_body, out);
}

std::optional<ApiError> read_text_format(const json& b, std::string_view raw_body,
                                         std::optional<GrammarSpec>* out) {
  if (!present(b, "text")) return std::nullopt;
  const json& text = b["text"];
  if (!text.is_object()) return invalid_param("text", "'text' must be an object");
  for (const auto& [key, value] : text.items()) {
    if (value.is_null() || key == "format") continue;
    if (key == "verbosity") {
      return invalid_param("text.verbosity", "'text.verbosity' is not supported (reasoning "
                                             "models' verbosity)");
    }
    return invalid_param(str_cat("text.", key), str_cat("unknown field 'text.", key,
                                                         "' (fields: format)"));
  }
  if (!present(text, "format")) return std::nullopt;
  const json& f = text["format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
    return invalid_param("text.format", "'text.format' must be an object with a string 'type'");
  }
  const std::string type = f["type"].get<std::string>();
  std::vector<Found> found;
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    found.push_back(Found{"text.format", GrammarSpec{GrammarKind::kJsonObject, ""}, ""});
  } else if (type == "json_schema") {
    for (const char* key : {"name", "description"}) {
      if (present(f, key) && !f[key].is_string()) {
        return invalid_param(str_cat("text.format.", key),
                             str_cat("'text.format.", key, "' must be a string"));
      }
    }
    if (present(f, "strict") && !f["strict"].is_boolean()) {
      return invalid_param("text.format.strict", "'text.format.strict' must be a boolean");
    }
    if (!present(f, "schema")) {
      return invalid_param("text.format.schema",
                           "'text.format.schema' is required for type 'json_schema'");
    }
    Found schema;
    ARBOR_API_TRY(schema_spec(f["schema"], "text.format.schema", "/text/format/schema", &schema));
    found.push_back(std::move(schema));
  } else {
    return invalid_param("text.format.type",
                         str_cat("'text.format.type' is '", type,
                                 "'; supported: text, json_object, json_schema"));
  }
  return one_spec(found, raw_body, out);
}

std::optional<ApiError> read_tgi_grammar(const json& p, std::string_view raw_body,
                                         std::optional<GrammarSpec>* out) {
  if (!present(p, "grammar")) return std::nullopt;
  const json& g = p["grammar"];
  if (!g.is_object() || !g.contains("type") || !g["type"].is_string() || !g.contains("value")) {
    return invalid_param("grammar", "'grammar' must be {\"type\": \"json\" | \"regex\", \"value\": ...}");
  }
  const std::string type = g["type"].get<std::string>();
  std::vector<Found> found(1);
  if (type == "json" || type == "json_schema") {
    ARBOR_API_TRY(schema_spec(g["value"], "grammar.value", "/parameters/grammar/value", &found[0]));
  } else if (type == "regex") {
    ARBOR_API_TRY(string_spec(g["value"], "grammar.value", GrammarKind::kRegex, &found[0]));
  } else {
    return invalid_param("grammar.type",
                         str_cat("'grammar.type' is '", type, "'; supported: json, regex"));
  }
  return one_spec(found, raw_body, out);
}

}  // namespace arbor::server
