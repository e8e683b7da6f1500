// Python str operations on UTF-8 strings for the Jinja interpreter: whitespace and stripping by
// code point, case mapping, splitting, replacing and str.format.
//
// Case mapping covers ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (what chat templates
// meet in role names and markup); other scripts are left unchanged.
#include <algorithm>
#include <cstdint>

#include "base/strings.h"
#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {
namespace {

struct CodePoints {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;  // byte offset of each code point, plus the end
};

CodePoints decode(const std::string& s) {
  CodePoints out;
  const std::vector<size_t> offs = utf8_offsets(s);
  for (size_t k = 0; k + 1 < offs.size(); ++k) {
    const size_t b = offs[k], e = offs[k + 1];
    const unsigned char c = static_cast<unsigned char>(s[b]);
    uint32_t cp = c;
    if (e - b > 1) {
      cp = c & (0xFFu >> (e - b + 1));
      for (size_t i = b + 1; i < e; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
    }
    out.cps.push_back(cp);
  }
  out.offsets = offs;
  return out;
}

bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_line_break(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17F) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17F) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

bool is_cased(uint32_t c) { return to_upper(c) != c || to_lower(c) != c; }

template <typename F>
std::string map_code_points(const std::string& s, F f) {
  const CodePoints d = decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < d.cps.size(); ++i) append_utf8(out, f(i, d.cps[i]));
  return out;
}

}  // namespace

std::string string_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const CodePoints d = decode(s);
  std::vector<uint32_t> set;
  if (chars.is_string()) set = decode(chars.as_string()).cps;
  auto strip_it = [&](uint32_t c) {
    return chars.is_string() ? std::find(set.begin(), set.end(), c) != set.end() : is_py_space(c);
  };
  size_t b = 0, e = d.cps.size();
  if (left) {
    while (b < e && strip_it(d.cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(d.cps[e - 1])) --e;
  }
  return s.substr(d.offsets[b], d.offsets[e] - d.offsets[b]);
}

std::string string_upper(std::string s) {
  return map_code_points(s, [](size_t, uint32_t c) { return to_upper(c); });
}

std::string string_lower(std::string s) {
  return map_code_points(s, [](size_t, uint32_t c) { return to_lower(c); });
}

std::string string_title(std::string s) {
  bool prev_cased = false;
  return map_code_points(s, [&](size_t, uint32_t c) {
    const uint32_t r = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = is_cased(c);
    return r;
  });
}

std::string string_capitalize(std::string s) {
  return map_code_points(s,
                         [](size_t i, uint32_t c) { return i == 0 ? to_upper(c) : to_lower(c); });
}

bool string_is_lower(const std::string& s) {
  bool cased = false;
  for (uint32_t c : decode(s).cps) {
    if (to_lower(c) != c) return false;
    cased = cased || is_cased(c);
  }
  return cased;
}

bool string_is_upper(const std::string& s) {
  bool cased = false;
  for (uint32_t c : decode(s).cps) {
    if (to_upper(c) != c) return false;
    cased = cased || is_cased(c);
  }
  return cased;
}

std::string string_replace(const std::string& s, const std::string& from, const std::string& to,
                           int64_t count) {
  int64_t left = count;
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    const std::vector<size_t> offs = utf8_offsets(s);
    for (size_t k = 0; k + 1 < offs.size(); ++k) {
      if (left-- != 0) out += to;
      out += s.substr(offs[k], offs[k + 1] - offs[k]);
    }
    if (left != 0) out += to;
    return out;
  }
  size_t i = 0;
  while (left != 0) {
    const size_t hit = s.find(from, i);
    if (hit == std::string::npos) break;
    out += s.substr(i, hit - i) + to;
    i = hit + from.size();
    --left;
  }
  return out + s.substr(i);
}

std::vector<std::string> string_splitlines(const std::string& s) {
  const CodePoints d = decode(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < d.cps.size(); ++i) {
    if (!is_line_break(d.cps[i])) continue;
    lines.push_back(s.substr(d.offsets[start], d.offsets[i] - d.offsets[start]));
    if (d.cps[i] == '\r' && i + 1 < d.cps.size() && d.cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < d.cps.size()) lines.push_back(s.substr(d.offsets[start]));
  return lines;
}

namespace {

std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit, bool right) {
  const CodePoints d = decode(s);
  std::vector<std::pair<size_t, size_t>> words;  // code point ranges
  const size_t n = d.cps.size();
  size_t i = 0;
  while (i < n) {
    while (i < n && is_py_space(d.cps[i])) ++i;
    if (i == n) break;
    size_t j = i;
    while (j < n && !is_py_space(d.cps[j])) ++j;
    words.emplace_back(i, j);
    i = j;
  }
  auto text = [&](size_t b, size_t e) {
    return s.substr(d.offsets[b], d.offsets[e] - d.offsets[b]);
  };
  std::vector<std::string> out;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
    for (const auto& [b, e] : words) out.push_back(text(b, e));
    return out;
  }
  const size_t k = static_cast<size_t>(maxsplit);
  if (!right) {
    for (size_t w = 0; w < k; ++w) out.push_back(text(words[w].first, words[w].second));
    out.push_back(string_strip(text(words[k].first, n), Value::none(), false, true));
    return out;
  }
  const size_t first_split = words.size() - k;
  out.push_back(string_strip(text(0, words[first_split - 1].second), Value::none(), true, false));
  for (size_t w = first_split; w < words.size(); ++w)
    out.push_back(text(words[w].first, words[w].second));
  return out;
}

}  // namespace

std::vector<std::string> string_split(const std::string& s, const std::string* sep,
                                      int64_t maxsplit, bool from_right) {
  if (sep == nullptr) return split_whitespace(s, maxsplit, from_right);
  std::vector<size_t> hits;
  for (size_t p = s.find(*sep); p != std::string::npos; p = s.find(*sep, p + sep->size()))
    hits.push_back(p);
  if (maxsplit >= 0 && hits.size() > static_cast<size_t>(maxsplit)) {
    const size_t k = static_cast<size_t>(maxsplit);
    // rsplit splits at the last occurrences; non-overlapping from the right can differ from the
    // left for self-overlapping separators, which templates do not use.
    hits = from_right
               ? std::vector<size_t>(hits.end() - static_cast<std::ptrdiff_t>(k), hits.end())
               : std::vector<size_t>(hits.begin(), hits.begin() + static_cast<std::ptrdiff_t>(k));
  }
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t h : hits) {
    out.push_back(s.substr(start, h - start));
    start = h + sep->size();
  }
  out.push_back(s.substr(start));
  return out;
}

size_t string_count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return utf8_length(s) + 1;
  size_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

std::string string_format(const Value& self, const CallArgs& a) {
  const std::string& f = self.as_string();
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if ((c == '{' || c == '}') && i + 1 < f.size() && f[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') fail(a.pos, "ValueError: Single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = f.find('}', i);
    if (close == std::string::npos)
      fail(a.pos, "ValueError: Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) fail(a.pos, "ValueError: bad conversion in format field");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    if (field.find_first_of(":.[") != std::string::npos) {
      fail(a.pos, "str.format: arbor supports only {}, {N} and {name} fields, not {" + field + "}");
    }
    Value arg;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      const size_t index = field.empty() ? auto_index++ : std::stoul(field);
      if (index >= a.args.size())
        fail(a.pos, "IndexError: Replacement index " + std::to_string(index) +
                        " out of range for positional args tuple");
      arg = a.args[index];
    } else {
      const Value* kw = a.kwarg(field);
      if (kw == nullptr) fail(a.pos, "KeyError: '" + field + "'");
      arg = *kw;
    }
    const std::string text = conversion == 'r' ? arg.repr() : arg.str();
    out += self.is_markup() && !arg.is_markup() ? html_escape(text) : text;
  }
  return out;
}

}  // namespace arbor::chat::jinja
