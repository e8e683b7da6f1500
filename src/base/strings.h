// Small string helpers shared by the modules (names, HTTP header fields, origins, UTF-8).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace arbor {

// ASCII case-insensitive equality ("Q4_K" == "q4_K", "Transfer-Encoding" == "transfer-encoding").
bool equal_ignore_case(std::string_view a, std::string_view b);

// `s` with ASCII letters lowered.
std::string ascii_lower(std::string_view s);

// Appends the UTF-8 encoding of code point cp (< 0x110000; surrogates are encoded as given).
void append_utf8(std::string& out, uint32_t cp);

}  // namespace arbor
