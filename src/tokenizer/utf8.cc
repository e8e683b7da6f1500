#include "tokenizer/utf8.h"

namespace arbor::tokenizer::internal {

size_t utf8_valid_len(std::string_view s, size_t pos, bool* incomplete) {
  if (incomplete) *incomplete = false;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; ++i) {
    if (pos + i >= s.size()) {
      if (incomplete) *incomplete = true;
      return 0;
    }
    const auto b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
  }
  return n;
}

bool is_valid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t n = utf8_valid_len(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

namespace {
// Length of the maximal invalid subpart at s[pos] (at least 1): the longest prefix that could
// still have begun a valid sequence.
size_t invalid_subpart_len(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  const size_t n = utf8_seq_len(b0);
  if (b0 < 0xC2 || b0 > 0xF4 || n == 1) return 1;
  size_t len = 1;
  for (; len < n && pos + len < s.size(); ++len) {
    // Check whether s[pos, pos+len+1) is still a valid prefix by validating a padded copy.
    std::string probe(s.substr(pos, len + 1));
    bool incomplete = false;
    if (utf8_valid_len(probe, 0, &incomplete) == 0 && !incomplete) break;
  }
  return len;
}
}  // namespace

namespace {
size_t lossy_impl(std::string_view s, std::string& out, bool final) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    bool incomplete = false;
    while (pos < s.size()) {
      const size_t n = utf8_valid_len(s, pos, &incomplete);
      if (n == 0) break;
      pos += n;
    }
    out.append(s.substr(start, pos - start));
    if (pos == s.size()) break;
    if (incomplete && !final) return pos;  // wait for the rest of the sequence
    out.append(kReplacementChar);
    pos += invalid_subpart_len(s, pos);
  }
  return s.size();
}
}  // namespace

void append_utf8_lossy(std::string_view s, std::string& out) { lossy_impl(s, out, true); }

size_t append_utf8_lossy_prefix(std::string_view s, std::string& out) {
  return lossy_impl(s, out, false);
}

void append_utf8_like_llama_cpp(std::string_view s, std::string& out) {
  size_t pos = 0;
  while (pos < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[pos]);
    size_t n = b0 < 0x80 ? 1 : b0 < 0xC0 ? 0 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : b0 < 0xF8 ? 4 : 0;
    if (n > 1 && pos + n > s.size()) n = 0;
    for (size_t i = 1; i < n; ++i) {
      if ((static_cast<uint8_t>(s[pos + i]) & 0xC0) != 0x80) n = 0;
    }
    if (n == 0) {
      out.append(kReplacementChar);
      ++pos;
      continue;
    }
    static constexpr uint8_t kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cpt = b0 & kLeadMask[n];
    for (size_t i = 1; i < n; ++i) cpt = (cpt << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
    if ((cpt >= 0xD800 && cpt <= 0xDFFF) || cpt > 0x10FFFF) {
      out.append(kReplacementChar);
    } else {
      append_codepoint(cpt, out);
    }
    pos += n;
  }
}

void append_codepoint(uint32_t cpt, std::string& out) {
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

namespace {
ByteLevelTables make_byte_level_tables() {
  ByteLevelTables t;
  t.cpt_to_byte.fill(-1);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t.byte_to_cpt[b] = printable ? b : next++;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    append_codepoint(t.byte_to_cpt[b], t.byte_to_utf8[b]);
    t.cpt_to_byte[t.byte_to_cpt[b]] = static_cast<int16_t>(b);
  }
  return t;
}
}  // namespace

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables = make_byte_level_tables();
  return tables;
}

std::string byte_level_encode(std::string_view bytes) {
  const auto& t = byte_level_tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

std::string byte_level_decode(std::string_view text) {
  const auto& t = byte_level_tables();
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = utf8_valid_len(text, pos);
    if (n == 0) {  // not UTF-8: copy the byte through
      out.push_back(text[pos++]);
      continue;
    }
    uint32_t cpt = static_cast<uint8_t>(text[pos]);
    if (n > 1) {
      cpt &= 0x7F >> n;
      for (size_t i = 1; i < n; ++i) cpt = (cpt << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
    }
    if (cpt < t.cpt_to_byte.size() && t.cpt_to_byte[cpt] >= 0) {
      out.push_back(static_cast<char>(t.cpt_to_byte[cpt]));
    } else {
      out.append(text.substr(pos, n));
    }
    pos += n;
  }
  return out;
}

}  // namespace arbor::tokenizer::internal
