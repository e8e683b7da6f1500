// Small ASCII string helpers shared by the modules (names, HTTP header fields, origins).
#pragma once

#include <string>
#include <string_view>

namespace arbor {

// ASCII case-insensitive equality ("Q4_K" == "q4_K", "Transfer-Encoding" == "transfer-encoding").
bool equal_ignore_case(std::string_view a, std::string_view b);

// `s` with ASCII letters lowered.
std::string ascii_lower(std::string_view s);

}  // namespace arbor
