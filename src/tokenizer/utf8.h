// UTF-8 helpers shared by the tokenizer algorithms (internal to arbor_tokenizer).
//
// Conventions: "valid" means well-formed UTF-8 per RFC 3629 (no overlongs, no surrogates, at most
// U+10FFFF). Lossy decoding replaces each maximal invalid subpart with U+FFFD, the same policy as
// Rust's String::from_utf8_lossy, which Hugging Face's decoders use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace arbor::tokenizer::internal {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";      // U+2581 "▁"

// Length of the sequence a lead byte announces (1 for ASCII and for stray bytes).
inline size_t utf8_seq_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Length of the valid sequence at s[pos], or 0 when the bytes there are not a complete valid
// sequence. `*incomplete` (optional) is set when the bytes up to the end of `s` are a valid but
// unfinished prefix of a sequence.
size_t utf8_valid_len(std::string_view s, size_t pos, bool* incomplete = nullptr);

bool is_valid_utf8(std::string_view s);

// Appends `s` to `out`, replacing each maximal invalid subpart with U+FFFD.
void append_utf8_lossy(std::string_view s, std::string& out);
// Streaming form: like append_utf8_lossy, but a valid yet unfinished sequence at the end of `s`
// is left unconsumed. Returns the number of bytes consumed.
size_t append_utf8_lossy_prefix(std::string_view s, std::string& out);

// Appends `s` to `out` decoded and re-encoded the way llama.cpp prepares text for its regex
// pre-tokenisers (unicode_cpts_from_utf8, then one UTF-8 sequence per code point): a lead byte
// followed by the continuation bytes it announces is decoded whatever the value (an overlong
// form gives its code point, "\xC0\xAF" is "/"); any other byte alone becomes one U+FFFD.
// Surrogates and values above U+10FFFF, which valid UTF-8 cannot carry, become U+FFFD too
// (llama.cpp passes the former on and throws on the latter). The result is valid UTF-8.
void append_utf8_like_llama_cpp(std::string_view s, std::string& out);

void append_codepoint(uint32_t cpt, std::string& out);

// GPT-2's reversible byte <-> printable code point mapping ("bytes_to_unicode").
struct ByteLevelTables {
  std::array<uint32_t, 256> byte_to_cpt{};
  std::array<std::string, 256> byte_to_utf8{};
  std::array<int16_t, 512> cpt_to_byte{};  // -1 where the code point is not a byte's image
};
const ByteLevelTables& byte_level_tables();

// Maps each byte of `bytes` to its GPT-2 code point (UTF-8 encoded).
std::string byte_level_encode(std::string_view bytes);
// Inverse of byte_level_encode. Code points outside the mapping are copied through unchanged.
std::string byte_level_decode(std::string_view text);

}  // namespace arbor::tokenizer::internal
