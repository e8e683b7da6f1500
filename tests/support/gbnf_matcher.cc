#include "support/gbnf_matcher.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <gtest/gtest.h>
#include <pcre2.h>

#include <cstdio>
#include <map>
#include <vector>

namespace arbor::test {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string pcre_codepoint(uint32_t cp) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", cp);
  return buf;
}

// Translates one GBNF rule body (or expression) to PCRE2.
class BodyTranslator {
 public:
  BodyTranslator(std::string_view body, const std::map<std::string, int>* rules)
      : s_(body), rules_(rules) {}

  Result<std::string> run() {
    std::string out;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t') {
        ++i_;
      } else if (c == '"') {
        ARBOR_ASSIGN_OR_RETURN(std::string lit, literal());
        out += lit;
      } else if (c == '[') {
        ARBOR_ASSIGN_OR_RETURN(std::string cls, char_class());
        out += cls;
      } else if (c == '.') {
        out += "(?s:.)", ++i_;
      } else if (c == '(') {
        out += "(?:", ++i_;
      } else if (c == ')' || c == '|' || c == '*' || c == '+' || c == '?') {
        out += c, ++i_;
      } else if (c == '{') {
        const size_t end = s_.find('}', i_);
        if (end == std::string_view::npos) return invalid_argument("unclosed { in ", s_);
        out += s_.substr(i_, end + 1 - i_);
        i_ = end + 1;
      } else {
        ARBOR_ASSIGN_OR_RETURN(std::string ref, rule_ref());
        out += ref;
      }
    }
    return out;
  }

 private:
  // One code point from an escape or raw UTF-8 at i_.
  Result<uint32_t> codepoint() {
    if (s_[i_] != '\\') {
      const auto b0 = static_cast<unsigned char>(s_[i_]);
      const int len = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
      uint32_t cp = len == 1 ? b0 : b0 & (0x3F >> (len - 1));
      for (int k = 1; k < len; ++k) cp = (cp << 6) | (s_[i_ + k] & 0x3F);
      i_ += len;
      return cp;
    }
    const char e = s_[i_ + 1];
    i_ += 2;
    switch (e) {
      case 'n': return uint32_t{'\n'};
      case 'r': return uint32_t{'\r'};
      case 't': return uint32_t{'\t'};
      case 'x': case 'u': case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const int h = i_ < s_.size() ? hex_digit(s_[i_]) : -1;
          if (h < 0) return invalid_argument("bad \\", e, " escape in ", s_);
          cp = cp * 16 + h, ++i_;
        }
        return cp;
      }
      case '\\': case '"': case ']': case '-': case '^': case '[':
        return static_cast<uint32_t>(e);
      default:
        return invalid_argument("unknown escape \\", e, " in ", s_);
    }
  }

  Result<std::string> literal() {
    ++i_;
    std::vector<uint32_t> cps;
    while (i_ < s_.size() && s_[i_] != '"') {
      ARBOR_ASSIGN_OR_RETURN(uint32_t cp, codepoint());
      cps.push_back(cp);
    }
    if (i_ >= s_.size()) return invalid_argument("unclosed literal in ", s_);
    ++i_;
    std::string out;
    for (uint32_t cp : cps) out += pcre_codepoint(cp);
    return cps.size() == 1 ? out : "(?:" + out + ")";
  }

  Result<std::string> char_class() {
    ++i_;
    std::string out = "[";
    if (i_ < s_.size() && s_[i_] == '^') out += '^', ++i_;
    while (i_ < s_.size() && s_[i_] != ']') {
      if (s_[i_] == '-') {
        out += '-', ++i_;
        continue;
      }
      ARBOR_ASSIGN_OR_RETURN(uint32_t cp, codepoint());
      out += pcre_codepoint(cp);
    }
    if (i_ >= s_.size()) return invalid_argument("unclosed class in ", s_);
    ++i_;
    return out + "]";
  }

  Result<std::string> rule_ref() {
    const size_t start = i_;
    while (i_ < s_.size() && (isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_' ||
                              s_[i_] == '-')) {
      ++i_;
    }
    const std::string name(s_.substr(start, i_ - start));
    if (name.empty()) return invalid_argument("unexpected '", s_[start], "' in ", s_);
    if (rules_ == nullptr || rules_->count(name) == 0) {
      return invalid_argument("undefined rule '", name, "'");
    }
    return "(?&r" + std::to_string(rules_->at(name)) + ")";
  }

  std::string_view s_;
  const std::map<std::string, int>* rules_;
  size_t i_ = 0;
};

}  // namespace

struct FullMatcher::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Result<std::string> gbnf_expression_to_pcre(std::string_view expression) {
  ARBOR_ASSIGN_OR_RETURN(std::string body, BodyTranslator(expression, nullptr).run());
  return "(?:" + body + ")";
}

Result<std::string> gbnf_grammar_to_pcre(std::string_view grammar) {
  std::vector<std::pair<std::string, std::string>> rules;
  size_t pos = 0;
  while (pos < grammar.size()) {
    size_t end = grammar.find('\n', pos);
    if (end == std::string_view::npos) end = grammar.size();
    const std::string_view line = grammar.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t sep = line.find(" ::= ");
    if (sep == std::string_view::npos) return invalid_argument("no ::= in line: ", line);
    rules.emplace_back(std::string(line.substr(0, sep)), std::string(line.substr(sep + 5)));
  }
  std::map<std::string, int> index;
  for (size_t i = 0; i < rules.size(); ++i) {
    if (!index.emplace(rules[i].first, static_cast<int>(i)).second) {
      return invalid_argument("rule '", rules[i].first, "' defined twice");
    }
  }
  if (index.count("root") == 0) return invalid_argument("no root rule");
  std::string out = "(?(DEFINE)";
  for (size_t i = 0; i < rules.size(); ++i) {
    ARBOR_ASSIGN_OR_RETURN(std::string body, BodyTranslator(rules[i].second, &index).run());
    out += "(?<r" + std::to_string(i) + ">" + body + ")";
  }
  return out + ")(?&r" + std::to_string(index.at("root")) + ")";
}

Result<FullMatcher> FullMatcher::compile(std::string_view pattern, bool ecmascript) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  uint32_t options = PCRE2_UTF | PCRE2_DOLLAR_ENDONLY;
  if (ecmascript) {
    options |= PCRE2_ALT_BSUX;
    pcre2_set_compile_extra_options(ctx, PCRE2_EXTRA_ALT_BSUX);
  }
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &offset, ctx);
  pcre2_compile_context_free(ctx);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("PCRE2 rejects '", pattern, "' at offset ", offset, ": ",
                            reinterpret_cast<const char*>(msg));
  }
  FullMatcher m;
  auto c = std::make_shared<Code>();
  c->code = code;
  m.code_ = std::move(c);
  m.pattern_ = std::string(pattern);
  return m;
}

Result<FullMatcher> FullMatcher::from_regex(std::string_view pattern) {
  return compile(pattern, false);
}

Result<FullMatcher> FullMatcher::from_ecmascript_regex(std::string_view pattern) {
  return compile(pattern, true);
}

Result<FullMatcher> FullMatcher::from_gbnf_grammar(std::string_view grammar) {
  ARBOR_ASSIGN_OR_RETURN(std::string pattern, gbnf_grammar_to_pcre(grammar));
  return from_regex(pattern);
}

Result<FullMatcher> FullMatcher::from_gbnf_expression(std::string_view expression) {
  ARBOR_ASSIGN_OR_RETURN(std::string pattern, gbnf_expression_to_pcre(expression));
  return from_regex(pattern);
}

bool FullMatcher::matches(std::string_view text) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(ctx, 100000000);
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, ctx);
  pcre2_match_context_free(ctx);
  pcre2_match_data_free(md);
  if (rc >= 0) return true;
  if (rc != PCRE2_ERROR_NOMATCH) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    ADD_FAILURE() << "PCRE2 match error " << reinterpret_cast<const char*>(msg) << " for text '"
                  << text << "' and pattern " << pattern_;
  }
  return false;
}

}  // namespace arbor::test
