#include "support/json_schema_validator.h"

#include <cmath>
#include <map>
#include <set>
#include <string_view>
#include <vector>

#include "support/gbnf_matcher.h"

namespace arbor::test {

namespace {

using nlohmann::json;
using Violation = std::optional<std::string>;

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t pos = s.find(sep, start);
    parts.emplace_back(s.substr(start, pos == std::string_view::npos ? s.npos : pos - start));
    if (pos == std::string_view::npos) return parts;
    start = pos + 1;
  }
}

bool all_digits(std::string_view s) {
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return !s.empty();
}

int to_int(std::string_view s) {
  int v = 0;
  for (char c : s) v = v * 10 + (c - '0');
  return v;
}

bool is_leap(int year) { return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0; }

bool valid_date(std::string_view s) {
  if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
  const std::string_view y = s.substr(0, 4), m = s.substr(5, 2), d = s.substr(8, 2);
  if (!all_digits(y) || !all_digits(m) || !all_digits(d)) return false;
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const int month = to_int(m);
  const int day = to_int(d);
  if (month < 1 || month > 12 || day < 1) return false;
  const int days = kDays[month - 1] + (month == 2 && is_leap(to_int(y)) ? 1 : 0);
  return day <= days;
}

bool regex_full_match(const std::string& pattern, const std::string& text) {
  static std::map<std::string, FullMatcher>* cache = new std::map<std::string, FullMatcher>();
  auto it = cache->find(pattern);
  if (it == cache->end()) {
    Result<FullMatcher> m = FullMatcher::from_ecmascript_regex(pattern);
    if (!m.ok()) return false;
    it = cache->emplace(pattern, std::move(m).value()).first;
  }
  return it->second.matches(text);
}

bool valid_time(const std::string& s) {
  static const std::string kHour = "([01][0-9]|2[0-3])";
  static const std::string kTime =
      kHour + ":[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]" + kHour + ":[0-5][0-9])";
  return regex_full_match(kTime, s);
}

bool valid_email(std::string_view s) {
  const std::vector<std::string> at = split(s, '@');
  if (at.size() != 2) return false;
  for (const std::string& atom : split(at[0], '.')) {
    if (atom.empty()) return false;
    for (char c : atom) {
      const bool allowed = isalnum(static_cast<unsigned char>(c)) ||
                           std::string_view("_%+-").find(c) != std::string_view::npos;
      if (!allowed) return false;
    }
  }
  const std::vector<std::string> labels = split(at[1], '.');
  if (labels.size() < 2) return false;
  for (const std::string& label : labels) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
  }
  return true;
}

bool valid_ipv4(std::string_view s) {
  const std::vector<std::string> parts = split(s, '.');
  if (parts.size() != 4) return false;
  for (const std::string& p : parts) {
    if (!all_digits(p) || p.size() > 3 || (p.size() > 1 && p[0] == '0') || to_int(p) > 255) {
      return false;
    }
  }
  return true;
}

bool valid_format(const std::string& format, const std::string& s) {
  if (format == "date") return valid_date(s);
  if (format == "time") return valid_time(s);
  if (format == "date-time") {
    return s.size() > 11 && s[10] == 'T' && valid_date(s.substr(0, 10)) &&
           valid_time(s.substr(11));
  }
  if (format == "uuid") {
    return regex_full_match("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                            "[0-9a-fA-F]{12}", s);
  }
  if (format == "email") return valid_email(s);
  if (format == "ipv4") return valid_ipv4(s);
  return false;
}

size_t codepoint_count(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

long double as_number(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return v.get<int64_t>();
  return v.get<double>();
}

bool has_type(const json& v, const std::string& type) {
  if (type == "integer") {
    return v.is_number() && std::floor(as_number(v)) == as_number(v);
  }
  static const std::map<std::string, json::value_t> kKinds = {
      {"null", json::value_t::null},     {"boolean", json::value_t::boolean},
      {"string", json::value_t::string}, {"object", json::value_t::object},
      {"array", json::value_t::array}};
  if (type == "number") return v.is_number();
  auto it = kKinds.find(type);
  return it != kKinds.end() && v.type() == it->second;
}

std::string show(const std::string& at) { return at.empty() ? "/" : at; }

std::string token(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

class Validator {
 public:
  explicit Validator(const json& root) : root_(root) {}

  Violation check(const json& v, const json& schema, const std::string& at, int depth) {
    if (depth > 200) return "at " + show(at) + ": schema recursion too deep";
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return std::nullopt;
      return "at " + show(at) + ": the schema false accepts nothing";
    }
    if (!schema.is_object()) return "schema is neither an object nor a boolean";
    static const std::set<std::string> kKnown = {
        "title", "description", "default", "examples", "$schema", "$id", "$comment",
        "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "type", "enum", "const",
        "anyOf", "oneOf", "allOf", "$ref", "properties", "required", "additionalProperties",
        "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
        "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (const auto& [key, unused] : schema.items()) {
      if (kKnown.count(key) == 0) return "unsupported keyword '" + key + "'";
    }
    for (auto part : {&Validator::check_generic, &Validator::check_combinators,
                      &Validator::check_scalar, &Validator::check_object,
                      &Validator::check_array}) {
      if (Violation bad = (this->*part)(v, schema, at, depth)) return bad;
    }
    return std::nullopt;
  }

 private:
  Violation check_generic(const json& v, const json& s, const std::string& at, int depth) {
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"].get<std::string>();
      if (ref.empty() || ref[0] != '#') return "unsupported $ref " + ref;
      const json::json_pointer ptr(ref.substr(1));
      if (!root_.contains(ptr)) return "unresolved $ref " + ref;
      if (Violation bad = check(v, root_.at(ptr), at, depth + 1)) return bad;
    }
    if (s.contains("type")) {
      std::vector<std::string> types;
      if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
      else for (const json& t : s["type"]) types.push_back(t.get<std::string>());
      bool any = false;
      for (const std::string& t : types) any = any || has_type(v, t);
      if (!any) return "at " + show(at) + ": " + v.dump() + " is not of type " + s["type"].dump();
    }
    if (s.contains("enum")) {
      bool found = false;
      for (const json& e : s["enum"]) found = found || e == v;
      if (!found) return "at " + show(at) + ": " + v.dump() + " is not in enum";
    }
    if (s.contains("const") && !(s["const"] == v)) {
      return "at " + show(at) + ": " + v.dump() + " is not the const " + s["const"].dump();
    }
    return std::nullopt;
  }

  Violation check_combinators(const json& v, const json& s, const std::string& at, int depth) {
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      bool any = false;
      for (const json& sub : s[key]) any = any || !check(v, sub, at, depth + 1).has_value();
      if (!any) return "at " + show(at) + ": matches no schema of " + key;
    }
    if (s.contains("allOf")) {
      for (const json& sub : s["allOf"]) {
        if (Violation bad = check(v, sub, at, depth + 1)) return bad;
      }
    }
    return std::nullopt;
  }

  Violation check_scalar(const json& v, const json& s, const std::string& at, int) {
    const std::string where = "at " + show(at) + ": ";
    if (v.is_string()) {
      const std::string str = v.get<std::string>();
      const size_t n = codepoint_count(str);
      if (s.contains("minLength") && n < s["minLength"].get<uint64_t>()) {
        return where + "length " + std::to_string(n) + " is less than minLength";
      }
      if (s.contains("maxLength") && n > s["maxLength"].get<uint64_t>()) {
        return where + "length " + std::to_string(n) + " is greater than maxLength";
      }
      if (s.contains("pattern") && !regex_full_match(s["pattern"].get<std::string>(), str)) {
        return where + v.dump() + " does not match pattern " + s["pattern"].dump();
      }
      if (s.contains("format") && !valid_format(s["format"].get<std::string>(), str)) {
        return where + v.dump() + " is not a valid " + s["format"].get<std::string>();
      }
    }
    if (v.is_number()) {
      const long double x = as_number(v);
      auto bound = [&](const char* key) { return as_number(s[key]); };
      if (s.contains("minimum") && x < bound("minimum")) {
        return where + v.dump() + " is less than minimum " + s["minimum"].dump();
      }
      if (s.contains("maximum") && x > bound("maximum")) {
        return where + v.dump() + " is greater than maximum " + s["maximum"].dump();
      }
      if (s.contains("exclusiveMinimum") && x <= bound("exclusiveMinimum")) {
        return where + v.dump() + " is not greater than exclusiveMinimum " +
               s["exclusiveMinimum"].dump();
      }
      if (s.contains("exclusiveMaximum") && x >= bound("exclusiveMaximum")) {
        return where + v.dump() + " is not less than exclusiveMaximum " +
               s["exclusiveMaximum"].dump();
      }
    }
    return std::nullopt;
  }

  // Whether `s` describes objects: only such a schema limits properties.
  static bool describes_objects(const json& s) {
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      return true;
    }
    if (!s.contains("type")) return false;
    const json& t = s["type"];
    if (t.is_string()) return t.get<std::string>() == "object";
    for (const json& name : t) {
      if (name == "object") return true;
    }
    return false;
  }

  Violation check_object(const json& v, const json& s, const std::string& at, int depth) {
    if (!v.is_object() || !describes_objects(s)) return std::nullopt;
    const json props = s.contains("properties") ? s["properties"] : json::object();
    if (s.contains("required")) {
      for (const json& r : s["required"]) {
        if (!v.contains(r.get<std::string>())) {
          return "at " + show(at) + ": required property '" + r.get<std::string>() +
                 "' is missing";
        }
      }
    }
    // Absent additionalProperties means false.
    const json additional = s.contains("additionalProperties") ? s["additionalProperties"]
                                                               : json(false);
    for (const auto& [key, value] : v.items()) {
      const std::string child = at + "/" + token(key);
      const bool declared = props.contains(key);
      if (!declared && additional.is_boolean() && !additional.get<bool>()) {
        return "at " + show(at) + ": property '" + key + "' is not allowed";
      }
      const json& sub = declared ? props[key] : additional;
      if (Violation bad = check(value, sub, child, depth + 1)) return bad;
    }
    return std::nullopt;
  }

  Violation check_array(const json& v, const json& s, const std::string& at, int depth) {
    if (!v.is_array()) return std::nullopt;
    const size_t n = v.size();
    if (s.contains("minItems") && n < s["minItems"].get<uint64_t>()) {
      return "at " + show(at) + ": " + std::to_string(n) + " items, fewer than minItems";
    }
    if (s.contains("maxItems") && n > s["maxItems"].get<uint64_t>()) {
      return "at " + show(at) + ": " + std::to_string(n) + " items, more than maxItems";
    }
    const size_t num_prefix = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < n; ++i) {
      const std::string child = at + "/" + std::to_string(i);
      const json* sub = nullptr;
      if (i < num_prefix) {
        sub = &s["prefixItems"][i];
      } else if (s.contains("items")) {
        sub = &s["items"];
      }
      if (sub == nullptr) continue;
      if (Violation bad = check(v[i], *sub, child, depth + 1)) return bad;
    }
    return std::nullopt;
  }

  const json& root_;
};

}  // namespace

std::optional<std::string> validate_json(const nlohmann::json& value,
                                         const nlohmann::json& schema) {
  try {
    return Validator(schema).check(value, schema, "", 0);
  } catch (const nlohmann::json::exception& e) {
    return std::string("malformed schema: ") + e.what();
  }
}

}  // namespace arbor::test
