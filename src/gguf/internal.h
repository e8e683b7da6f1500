// Private helpers shared by the gguf module's .cc files. Not part of the public API.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace arbor::gguf::internal {

// A key or tensor name as it may appear in an error message: control bytes
// escaped as \xNN, quotes and backslashes escaped, cut to max_bytes of input with "..." so a
// corrupt 1 MB "name" cannot flood a log.
std::string printable(std::string_view s, size_t max_bytes = 96);

}  // namespace arbor::gguf::internal
