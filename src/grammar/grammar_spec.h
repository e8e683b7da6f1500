// What a request asks its output to be: the structured-output constraint as a plain value (it
// crosses the step protocol inside SamplingParams), and its compilation to an automaton.
//
// Kinds and their sources:
//   kGbnf        GBNF text (grammar.h)
//   kJsonSchema  a JSON Schema, as JSON text (json_schema_to_gbnf.h has the supported subset)
//   kJsonObject  any JSON object (OpenAI's response_format json_object); source unused
//   kRegex       a regular expression the whole output must match (regex_to_gbnf.h)
//   kChoice      a JSON array of strings: the output is exactly one of them
//
// With `thinking`, the grammar constrains only the content after a thinking block
// (grammar/thinking.h): the block itself is sampled freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "grammar/automaton.h"
#include "grammar/thinking.h"

namespace arbor::grammar {

enum class GrammarKind : uint8_t { kGbnf, kJsonSchema, kJsonObject, kRegex, kChoice };

// A thinking block before the constrained output (output_grammar.h).
struct ThinkingSpec {
  ThinkingMarkers markers;
  ThinkingStart start = ThinkingStart::kMaybe;
  // Control tokens (which write no text for a grammar) whose text is a marker, e.g. Mistral's
  // [THINK] and [/THINK]: the gate reads them as that text, as the server's detokenizer does.
  struct ControlText {
    int32_t id = 0;
    std::string text;
    bool operator==(const ControlText&) const = default;
  };
  std::vector<ControlText> control_texts;

  bool operator==(const ThinkingSpec&) const = default;
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kGbnf;
  std::string source;
  // The grammar applies after this thinking block; nullopt: from the first token.
  std::optional<ThinkingSpec> thinking = std::nullopt;

  bool operator==(const GrammarSpec&) const = default;
  // A key that identifies the compiled grammar (kind and source; not `thinking`).
  std::string cache_key() const;
};

std::string_view grammar_kind_name(GrammarKind kind);

// The spec as GBNF (converting schemas, regexes and choices). Errors are invalid_argument and
// name what is wrong (the keyword and its path, the regex offset, the grammar line).
Result<std::string> spec_to_gbnf(const GrammarSpec& spec);

// spec_to_gbnf() then compile_gbnf().
Result<Automaton> compile_spec(const GrammarSpec& spec);

}  // namespace arbor::grammar
