// Choice list -> GBNF grammar text, for vLLM's `guided_choice`: the output is exactly one of the
// given strings.
//
// Pure function; any thread.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace arbor::grammar {

// "root ::= \"a\" | \"b\"\n" with one literal per choice, in the given order (duplicates kept
// once). Choices are UTF-8 and may be empty (a literal ""). kInvalidArgument for an empty list or
// a choice that is not valid UTF-8 (naming its index).
Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices);

}  // namespace arbor::grammar
