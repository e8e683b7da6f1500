#include "grammar/json_schema_to_gbnf.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/gbnf_text.h"
#include "grammar/json_gbnf_rules.h"
#include "grammar/json_number_gbnf.h"
#include "grammar/regex_to_gbnf.h"

namespace arbor::grammar {

namespace {

using Json = nlohmann::ordered_json;
using internal::SharedRule;

constexpr int kMaxDepth = 128;
// key_not_in() recurses once per code point of a declared name.
constexpr size_t kMaxExcludedKeyLength = 256;
constexpr char kQuote[] = "\"\\\"\"";  // GBNF for one '"'

// Which instance type a validation keyword constrains; kAny for the type-independent ones.
enum class Family { kAny, kObject, kArray, kString, kNumber };

const std::map<std::string_view, Family>& validation_keywords() {
  static const std::map<std::string_view, Family> kKeywords = {
      {"type", Family::kAny},          {"enum", Family::kAny},
      {"const", Family::kAny},         {"anyOf", Family::kAny},
      {"oneOf", Family::kAny},         {"allOf", Family::kAny},
      {"$ref", Family::kAny},          {"properties", Family::kObject},
      {"required", Family::kObject},   {"additionalProperties", Family::kObject},
      {"items", Family::kArray},       {"prefixItems", Family::kArray},
      {"minItems", Family::kArray},    {"maxItems", Family::kArray},
      {"minLength", Family::kString},  {"maxLength", Family::kString},
      {"pattern", Family::kString},    {"format", Family::kString},
      {"minimum", Family::kNumber},    {"maximum", Family::kNumber},
      {"exclusiveMinimum", Family::kNumber}, {"exclusiveMaximum", Family::kNumber},
  };
  return kKeywords;
}

bool is_ignored_keyword(std::string_view key) {
  static const std::set<std::string_view> kIgnored = {
      "title",    "description", "default",    "examples",  "$schema",     "$id",
      "$comment", "deprecated",  "readOnly",   "writeOnly", "$defs",       "definitions",
  };
  return kIgnored.count(key) > 0;
}

std::string show(const std::string& path) { return path.empty() ? "/" : path; }

std::string pointer_token(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string sanitize(std::string_view s) {
  std::string out;
  for (char c : s) out += is_gbnf_rule_name(std::string_view(&c, 1)) ? c : '-';
  return out;
}

// GBNF literal for UTF-8 text that nlohmann produced (dump() output is valid UTF-8).
std::string utf8_literal(const std::string& text) {
  std::optional<std::u32string> cps = decode_utf8(text);
  ARBOR_CHECK(cps.has_value()) << "invalid UTF-8 from the JSON library";
  return gbnf_literal(*cps);
}

// `expr` made optional: expr? for a single group, ( expr )? otherwise.
std::string optional_of(const std::string& expr) {
  if (gbnf_strip_outer_group(expr) != expr) return expr + "?";
  return "( " + expr + " )?";
}

bool json_has_type(const Json& v, std::string_view type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "string") return v.is_string();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    return v.is_number_float() && std::isfinite(v.get<double>()) &&
           std::floor(v.get<double>()) == v.get<double>();
  }
  return false;
}

std::optional<SharedRule> format_rule(std::string_view format) {
  if (format == "date") return SharedRule::kDate;
  if (format == "time") return SharedRule::kTime;
  if (format == "date-time") return SharedRule::kDateTime;
  if (format == "uuid") return SharedRule::kUuid;
  if (format == "email") return SharedRule::kEmail;
  if (format == "ipv4") return SharedRule::kIpv4;
  return std::nullopt;
}

// Names of declared properties, as a trie over code points, for additional-property keys that
// must differ from every one of them.
struct KeyTrie {
  bool terminal = false;
  std::map<char32_t, std::unique_ptr<KeyTrie>> children;

  void insert(std::u32string_view name) {
    KeyTrie* node = this;
    for (char32_t c : name) {
      std::unique_ptr<KeyTrie>& child = node->children[c];
      if (!child) child = std::make_unique<KeyTrie>();
      node = child.get();
    }
    node->terminal = true;
  }
};

// Code points an additional-property key uses: no escapes, so the raw text is the name itself.
CodepointSet plain_key_chars() {
  CodepointSet s = CodepointSet::range(0x20, kMaxCodepoint);
  CodepointSet special = CodepointSet::single('"');
  special.add('\\', '\\');
  return s.minus(special);
}

// Key contents (after the prefix leading to `node`) that spell no name in the trie.
std::string key_not_in(const KeyTrie& node) {
  const CodepointSet plain = plain_key_chars();
  CodepointSet taken;
  for (const auto& [c, child] : node.children) taken.add(c, c);
  std::vector<std::string> alts;
  const CodepointSet other = plain.minus(taken);
  if (!other.empty()) {
    alts.push_back(gbnf_sequence({gbnf_char_class(other), gbnf_char_class(plain) + "*"}));
  }
  for (const auto& [c, child] : node.children) {
    alts.push_back(gbnf_sequence({gbnf_literal(std::u32string(1, c)), key_not_in(*child)}));
  }
  const std::string group = gbnf_group(alts);
  return node.terminal ? group : optional_of(group);
}

class SchemaConverter {
 public:
  SchemaConverter(const Json& root, const JsonGrammarOptions& options)
      : root_(root), options_(options) {
    for (int i = 0; i < internal::kNumSharedRules; ++i) {
      names_.insert(std::string(internal::shared_rule_name(static_cast<SharedRule>(i))));
    }
    // `root` stays reserved when the value has another name: the caller defines it.
    if (options_.root_rule != "root") names_.insert("root");
    reserve(options_.root_rule);
  }

  Result<std::string> convert() {
    const std::string& root = options_.root_rule;
    ref_rules_[""] = root;
    unguarded_refs_.insert("");
    ARBOR_ASSIGN_OR_RETURN(std::string body, visit(root_, "", root));
    define(root, std::move(body));
    return render();
  }

  std::string free_object() {
    define(options_.root_rule, shared(SharedRule::kObject));
    return render();
  }

 private:
  struct Member {
    std::string kv;
    bool required = false;
  };

  // --- rules ---
  std::string reserve(const std::string& hint) {
    std::string name = hint;
    for (int i = 2; names_.count(name) > 0; ++i) name = hint + "-" + std::to_string(i);
    names_.insert(name);
    rule_index_[name] = rules_.size();
    rules_.emplace_back(name, "");
    return name;
  }
  void define(const std::string& name, std::string body) {
    rules_[rule_index_.at(name)].second = gbnf_strip_outer_group(body);
  }
  // A new rule `hint` ::= body, or the existing rule with the same body.
  std::string add_rule(const std::string& hint, const std::string& body) {
    const std::string stripped = gbnf_strip_outer_group(body);
    auto it = rule_by_body_.find(stripped);
    if (it != rule_by_body_.end()) return it->second;
    const std::string name = reserve(hint);
    define(name, stripped);
    rule_by_body_[stripped] = name;
    return name;
  }
  std::string shared(SharedRule rule) {
    if (!used_[static_cast<int>(rule)]) {
      used_[static_cast<int>(rule)] = true;
      for (SharedRule dep : internal::shared_rule_dependencies(rule, options_.whitespace)) {
        shared(dep);
      }
    }
    return std::string(internal::shared_rule_name(rule));
  }
  std::string ws() {
    return options_.whitespace == JsonWhitespace::kFlexible ? shared(SharedRule::kWs) : "";
  }
  std::string render() const {
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    for (int i = 0; i < internal::kNumSharedRules; ++i) {
      if (!used_[i]) continue;
      const auto rule = static_cast<SharedRule>(i);
      out += std::string(internal::shared_rule_name(rule)) + " ::= " +
             internal::shared_rule_body(rule, options_.whitespace) + "\n";
    }
    return out;
  }

  // --- schemas ---
  Result<std::string> visit(const Json& schema, const std::string& path, const std::string& hint);
  Result<std::string> value_rule(const Json& schema, const std::string& path,
                                 const std::string& hint);
  Result<std::string> guarded_value_rule(const Json& schema, const std::string& path,
                                         const std::string& hint);
  Result<std::string> visit_ref(const Json& schema, const std::string& path);
  Result<std::string> visit_combinator(const Json& schema, const std::string& key,
                                       const std::string& path, const std::string& hint);
  Result<std::string> visit_enum(const Json& schema, const std::vector<std::string>& keys,
                                 const std::string& path);
  Result<std::vector<std::string>> read_types(const Json& schema, const std::string& path);
  Result<std::string> visit_types(const Json& schema, const std::vector<std::string>& keys,
                                  const std::string& path, const std::string& hint);
  Result<std::string> visit_type(const std::string& type, const Json& schema,
                                 const std::string& path, const std::string& hint);
  Result<std::string> visit_string(const Json& schema, const std::string& path,
                                   const std::string& hint);
  Result<std::string> visit_integer(const Json& schema, const std::string& path);
  Result<std::string> visit_number(const Json& schema, const std::string& path);
  Result<std::string> visit_object(const Json& schema, const std::string& path,
                                   const std::string& hint);
  Result<std::string> additional_member(const Json& schema, const Json* additional,
                                        const std::string& path, const std::string& hint);
  std::string object_body(const std::vector<Member>& members, const std::string& additional);
  Result<std::string> visit_array(const Json& schema, const std::string& path,
                                  const std::string& hint);
  std::string array_elements(size_t j, const std::vector<std::string>& prefix,
                             const std::string& rest, uint64_t min, std::optional<uint64_t> max);

  const Json& root_;
  JsonGrammarOptions options_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in reservation order; root first
  std::map<std::string, size_t> rule_index_;
  std::set<std::string> names_;
  std::map<std::string, std::string> rule_by_body_;
  std::map<std::string, std::string> ref_rules_;  // JSON pointer -> rule name
  // References being expanded since the last object or array: meeting one again is a cycle
  // that would consume nothing.
  std::set<std::string> unguarded_refs_;
  std::array<bool, internal::kNumSharedRules> used_{};
  int depth_ = 0;
};

// Reads a non-negative integer keyword (2.0 counts as 2).
Result<std::optional<uint64_t>> read_count(const Json& schema, const char* key,
                                           const std::string& path) {
  auto it = schema.find(key);
  if (it == schema.end()) return std::optional<uint64_t>();
  if (it->is_number_unsigned()) return std::optional<uint64_t>(it->get<uint64_t>());
  if (it->is_number_integer() && it->get<int64_t>() >= 0) {
    return std::optional<uint64_t>(static_cast<uint64_t>(it->get<int64_t>()));
  }
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (v >= 0 && v < 9007199254740992.0 && std::floor(v) == v) {
      return std::optional<uint64_t>(static_cast<uint64_t>(v));
    }
  }
  return invalid_argument("keyword '", key, "' at ", show(path),
                          " must be a non-negative integer");
}

// Reads a numeric keyword as long double (exact for every int64 and double).
Result<std::optional<long double>> read_bound(const Json& schema, const char* key,
                                              const std::string& path) {
  auto it = schema.find(key);
  if (it == schema.end()) return std::optional<long double>();
  if (it->is_number_unsigned()) return std::optional<long double>(it->get<uint64_t>());
  if (it->is_number_integer()) return std::optional<long double>(it->get<int64_t>());
  if (it->is_number_float() && std::isfinite(it->get<double>())) {
    return std::optional<long double>(it->get<double>());
  }
  return invalid_argument("keyword '", key, "' at ", show(path), " must be a number");
}

Result<std::string> SchemaConverter::visit(const Json& schema, const std::string& path,
                                           const std::string& hint) {
  if (depth_ >= kMaxDepth) {
    return invalid_argument("JSON Schema at ", show(path), " is nested more than ", kMaxDepth,
                            " levels deep");
  }
  struct DepthGuard {
    int* d;
    explicit DepthGuard(int* depth) : d(depth) { ++*d; }
    ~DepthGuard() { --*d; }
  } guard(&depth_);
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return shared(SharedRule::kValue);
    return invalid_argument("schema at ", show(path), " is false: it accepts no value");
  }
  if (!schema.is_object()) {
    return invalid_argument("schema at ", show(path), " must be an object or a boolean");
  }
  std::vector<std::string> keys;
  for (const auto& [key, value] : schema.items()) {
    if (is_ignored_keyword(key)) continue;
    if (validation_keywords().count(key) == 0) {
      return invalid_argument("unsupported JSON Schema keyword '", key, "' at ", show(path));
    }
    keys.push_back(key);
  }
  auto has = [&](std::string_view k) {
    return std::find(keys.begin(), keys.end(), k) != keys.end();
  };
  for (const char* alone : {"$ref", "anyOf", "oneOf", "allOf"}) {
    if (!has(alone)) continue;
    for (const std::string& k : keys) {
      if (k == alone) continue;
      return invalid_argument("JSON Schema keyword '", k, "' at ", show(path),
                              " cannot be combined with '", alone, "'");
    }
    if (std::string_view(alone) == "$ref") return visit_ref(schema, path);
    return visit_combinator(schema, alone, path, hint);
  }
  if (has("enum") || has("const")) return visit_enum(schema, keys, path);
  return visit_types(schema, keys, path, hint);
}

Result<std::string> SchemaConverter::value_rule(const Json& schema, const std::string& path,
                                                const std::string& hint) {
  ARBOR_ASSIGN_OR_RETURN(std::string expr, visit(schema, path, hint));
  if (is_gbnf_rule_name(expr)) return expr;
  return add_rule(hint, expr);
}

Result<std::string> SchemaConverter::guarded_value_rule(const Json& schema,
                                                        const std::string& path,
                                                        const std::string& hint) {
  std::set<std::string> saved = std::move(unguarded_refs_);
  unguarded_refs_.clear();
  Result<std::string> r = value_rule(schema, path, hint);
  unguarded_refs_ = std::move(saved);
  return r;
}

Result<std::string> SchemaConverter::visit_ref(const Json& schema, const std::string& path) {
  const Json& ref = schema.at("$ref");
  if (!ref.is_string()) {
    return invalid_argument("keyword '$ref' at ", show(path), " must be a string");
  }
  const std::string target = ref.get<std::string>();
  if (target.empty() || target[0] != '#' || (target.size() > 1 && target[1] != '/')) {
    return invalid_argument("unsupported $ref '", target, "' at ", show(path),
                            ": only local JSON pointers ('#', '#/$defs/NAME') are supported");
  }
  const std::string pointer = target.substr(1);
  Json::json_pointer ptr;
  try {
    ptr = Json::json_pointer(pointer);
  } catch (const nlohmann::json::exception&) {
    return invalid_argument("$ref '", target, "' at ", show(path), " is not a valid JSON pointer");
  }
  if (!root_.contains(ptr)) {
    return invalid_argument("$ref '", target, "' at ", show(path), " does not resolve");
  }
  if (auto it = ref_rules_.find(pointer); it != ref_rules_.end()) {
    if (unguarded_refs_.count(pointer) > 0) {
      return invalid_argument("$ref '", target, "' at ", show(path),
                              " closes a reference cycle that passes through no object or array");
    }
    return it->second;
  }
  // "#/$defs/Address" becomes rule Address; other pointers are spelled out.
  const bool in_defs = pointer.rfind("/$defs/", 0) == 0 || pointer.rfind("/definitions/", 0) == 0;
  const std::string hint = in_defs && ptr.parent_pointer().parent_pointer().empty()
                               ? sanitize(ptr.back())
                               : sanitize(pointer.substr(1));
  const std::string name = reserve(hint.empty() ? "def" : hint);
  ref_rules_[pointer] = name;
  unguarded_refs_.insert(pointer);
  ARBOR_ASSIGN_OR_RETURN(std::string body, visit(root_.at(ptr), pointer, name));
  unguarded_refs_.erase(pointer);
  define(name, body);
  return name;
}

Result<std::string> SchemaConverter::visit_combinator(const Json& schema, const std::string& key,
                                                      const std::string& path,
                                                      const std::string& hint) {
  const Json& list = schema.at(key);
  if (!list.is_array() || list.empty()) {
    return invalid_argument("keyword '", key, "' at ", show(path),
                            " must be a non-empty array of schemas");
  }
  if (key == "allOf") {
    if (list.size() != 1) {
      return invalid_argument("keyword 'allOf' at ", show(path), " has ", list.size(),
                              " schemas; only a single schema is supported");
    }
    return visit(list[0], path + "/allOf/0", hint);
  }
  std::vector<std::string> alts;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].is_boolean() && !list[i].get<bool>()) continue;
    const std::string sub_path = path + "/" + key + "/" + std::to_string(i);
    ARBOR_ASSIGN_OR_RETURN(std::string alt,
                           value_rule(list[i], sub_path, hint + "-" + std::to_string(i)));
    if (std::find(alts.begin(), alts.end(), alt) == alts.end()) alts.push_back(alt);
  }
  if (alts.empty()) {
    return invalid_argument("every schema of '", key, "' at ", show(path), " is false");
  }
  return gbnf_group(alts);
}

Result<std::vector<std::string>> SchemaConverter::read_types(const Json& schema,
                                                             const std::string& path) {
  const Json& type = schema.at("type");
  std::vector<std::string> names;
  if (type.is_string()) {
    names.push_back(type.get<std::string>());
  } else if (type.is_array() && !type.empty()) {
    for (const Json& t : type) {
      if (!t.is_string()) names.push_back("");  // reported below
      else names.push_back(t.get<std::string>());
    }
  } else {
    return invalid_argument("keyword 'type' at ", show(path),
                            " must be a type name or a non-empty array of type names");
  }
  static const std::set<std::string> kTypes = {"string", "number", "integer", "boolean",
                                               "null",   "object", "array"};
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (kTypes.count(n) == 0) {
      return invalid_argument("unknown type '", n, "' at ", show(path));
    }
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  // number already covers integers.
  if (std::find(out.begin(), out.end(), "number") != out.end()) {
    out.erase(std::remove(out.begin(), out.end(), "integer"), out.end());
  }
  return out;
}

Result<std::string> SchemaConverter::visit_enum(const Json& schema,
                                                const std::vector<std::string>& keys,
                                                const std::string& path) {
  const bool has_enum = schema.contains("enum");
  for (const std::string& k : keys) {
    if (k == "type" || k == "enum" || k == "const") continue;
    return invalid_argument("JSON Schema keyword '", k, "' at ", show(path),
                            " cannot be combined with '", has_enum ? "enum" : "const", "'");
  }
  std::vector<const Json*> values;
  if (has_enum) {
    const Json& list = schema.at("enum");
    if (!list.is_array() || list.empty()) {
      return invalid_argument("keyword 'enum' at ", show(path), " must be a non-empty array");
    }
    for (const Json& v : list) values.push_back(&v);
  }
  if (schema.contains("const")) {
    const Json& c = schema.at("const");
    if (!has_enum) values.push_back(&c);
    values.erase(std::remove_if(values.begin(), values.end(),
                                [&](const Json* v) { return !(*v == c); }),
                 values.end());
  }
  if (schema.contains("type")) {
    ARBOR_ASSIGN_OR_RETURN(std::vector<std::string> types, read_types(schema, path));
    values.erase(std::remove_if(values.begin(), values.end(),
                                [&](const Json* v) {
                                  return std::none_of(types.begin(), types.end(),
                                                      [&](const std::string& t) {
                                                        return json_has_type(*v, t);
                                                      });
                                }),
                 values.end());
  }
  if (values.empty()) {
    return invalid_argument("no value of '", has_enum ? "enum" : "const", "' at ", show(path),
                            " satisfies the other keywords");
  }
  std::vector<std::string> alts;
  for (const Json* v : values) {
    std::string lit = utf8_literal(v->dump());
    if (std::find(alts.begin(), alts.end(), lit) == alts.end()) alts.push_back(std::move(lit));
  }
  return gbnf_group(alts);
}

Result<std::string> SchemaConverter::visit_types(const Json& schema,
                                                 const std::vector<std::string>& keys,
                                                 const std::string& path,
                                                 const std::string& hint) {
  std::vector<std::string> types;
  if (schema.contains("type")) {
    ARBOR_ASSIGN_OR_RETURN(types, read_types(schema, path));
  } else {
    // The types whose keywords appear, in a fixed order.
    const std::pair<Family, const char*> kOrder[] = {{Family::kObject, "object"},
                                                     {Family::kArray, "array"},
                                                     {Family::kString, "string"},
                                                     {Family::kNumber, "number"}};
    for (const auto& [family, name] : kOrder) {
      const bool used = std::any_of(keys.begin(), keys.end(), [&](const std::string& k) {
        return validation_keywords().at(k) == family;
      });
      if (used) types.push_back(name);
    }
    if (types.empty()) return shared(SharedRule::kValue);
  }
  std::vector<std::string> alts;
  for (const std::string& t : types) {
    ARBOR_ASSIGN_OR_RETURN(std::string alt, visit_type(t, schema, path, hint));
    alts.push_back(std::move(alt));
  }
  return gbnf_group(alts);
}

Result<std::string> SchemaConverter::visit_type(const std::string& type, const Json& schema,
                                                const std::string& path,
                                                const std::string& hint) {
  if (type == "null") return shared(SharedRule::kNull);
  if (type == "boolean") return shared(SharedRule::kBoolean);
  if (type == "string") return visit_string(schema, path, hint);
  if (type == "integer") return visit_integer(schema, path);
  if (type == "number") return visit_number(schema, path);
  if (type == "object") return visit_object(schema, path, hint);
  return visit_array(schema, path, hint);
}

Result<std::string> SchemaConverter::visit_string(const Json& schema, const std::string& path,
                                                  const std::string& hint) {
  const char* present[4] = {};
  int n = 0;
  for (const char* k : {"format", "pattern", "minLength", "maxLength"}) {
    if (schema.contains(k)) present[n++] = k;
  }
  // format and pattern each stand alone; minLength and maxLength go together.
  if (n >= 2 && std::string_view(present[0]) != "minLength") {
    return invalid_argument("JSON Schema keyword '", present[0], "' at ", show(path),
                            " cannot be combined with '", present[1], "'");
  }
  if (schema.contains("format")) {
    const Json& f = schema.at("format");
    std::optional<SharedRule> rule;
    if (f.is_string()) rule = format_rule(f.get<std::string>());
    if (!rule) {
      return invalid_argument("unsupported string format ", f.dump(), " at ", show(path));
    }
    return gbnf_sequence({kQuote, shared(*rule), kQuote});
  }
  if (schema.contains("pattern")) {
    const Json& p = schema.at("pattern");
    if (!p.is_string()) {
      return invalid_argument("keyword 'pattern' at ", show(path), " must be a string");
    }
    RegexGbnfOptions regex_options;
    regex_options.target = RegexTarget::kJsonStringContent;
    regex_options.define_rule = [&](const std::string& body) {
      return add_rule(hint + "-repeat", body);
    };
    Result<std::string> expr = regex_to_gbnf_expression(p.get<std::string>(), regex_options);
    if (!expr.ok()) {
      return invalid_argument("keyword 'pattern' at ", show(path), ": ",
                              expr.status().message());
    }
    const std::string inner = *expr == "\"\"" ? "" : *expr;
    return gbnf_sequence({kQuote, inner, kQuote});
  }
  ARBOR_ASSIGN_OR_RETURN(std::optional<uint64_t> min, read_count(schema, "minLength", path));
  ARBOR_ASSIGN_OR_RETURN(std::optional<uint64_t> max, read_count(schema, "maxLength", path));
  if (!min && !max) return shared(SharedRule::kString);
  if (min && max && *min > *max) {
    return invalid_argument("minLength ", *min, " at ", show(path), " is greater than maxLength ",
                            *max);
  }
  Result<std::string> rep = gbnf_repeat(shared(SharedRule::kChar), min.value_or(0), max);
  if (!rep.ok()) {
    return invalid_argument("string length bounds at ", show(path), ": ", rep.status().message());
  }
  return gbnf_sequence({kQuote, *rep, kQuote});
}

Result<std::string> SchemaConverter::visit_integer(const Json& schema, const std::string& path) {
  ARBOR_ASSIGN_OR_RETURN(std::optional<long double> min, read_bound(schema, "minimum", path));
  ARBOR_ASSIGN_OR_RETURN(std::optional<long double> xmin,
                         read_bound(schema, "exclusiveMinimum", path));
  ARBOR_ASSIGN_OR_RETURN(std::optional<long double> max, read_bound(schema, "maximum", path));
  ARBOR_ASSIGN_OR_RETURN(std::optional<long double> xmax,
                         read_bound(schema, "exclusiveMaximum", path));
  std::optional<long double> lo;
  std::optional<long double> hi;
  if (min) lo = std::ceil(*min);
  if (xmin) lo = std::max(lo.value_or(-INFINITY), std::floor(*xmin) + 1);
  if (max) hi = std::floor(*max);
  if (xmax) hi = std::min(hi.value_or(INFINITY), std::ceil(*xmax) - 1);
  if (!lo && !hi) return shared(SharedRule::kInteger);
  constexpr long double kLimit = static_cast<long double>(INT64_MAX);
  for (const std::optional<long double>& b : {lo, hi}) {
    if (b && (*b > kLimit || *b < -kLimit)) {
      return invalid_argument("integer bound ", static_cast<double>(*b), " at ", show(path),
                              " is outside the 64-bit range");
    }
  }
  int64_t lo_i = 0;
  int64_t hi_i = 0;
  if (lo) lo_i = static_cast<int64_t>(*lo);
  if (hi) hi_i = static_cast<int64_t>(*hi);
  if (!lo) lo_i = hi_i < -kMaxUnboundedInteger ? -INT64_MAX : -kMaxUnboundedInteger;
  if (!hi) hi_i = lo_i > kMaxUnboundedInteger ? INT64_MAX : kMaxUnboundedInteger;
  if (lo_i > hi_i) {
    return invalid_argument("no integer satisfies the bounds at ", show(path), " (lowest ", lo_i,
                            ", highest ", hi_i, ")");
  }
  return integer_range_gbnf(lo_i, hi_i);
}

Result<std::string> SchemaConverter::visit_number(const Json& schema, const std::string& path) {
  std::optional<NumberBound> lower;
  std::optional<NumberBound> upper;
  for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    ARBOR_ASSIGN_OR_RETURN(std::optional<long double> v, read_bound(schema, key, path));
    if (!v) continue;
    if (std::floor(*v) != *v || std::fabs(*v) > 9007199254740992.0L) {
      return invalid_argument("bound '", key, "' ", schema.at(key).dump(), " at ", show(path),
                              " is not supported for type number: only integer bounds within "
                              "2^53 are");
    }
    const std::string_view k = key;
    const NumberBound b{static_cast<int64_t>(*v), k == "minimum" || k == "maximum"};
    if (k == "minimum" || k == "exclusiveMinimum") {
      // The tighter of the two; at equal values the exclusive one.
      if (!lower || b.value > lower->value || (b.value == lower->value && !b.inclusive)) {
        lower = b;
      }
    } else if (!upper || b.value < upper->value || (b.value == upper->value && !b.inclusive)) {
      upper = b;
    }
  }
  if (!lower && !upper) return shared(SharedRule::kNumber);
  Result<std::string> r = number_range_gbnf(lower, upper);
  if (!r.ok()) return invalid_argument("no number satisfies the bounds at ", show(path));
  return r;
}

Result<std::string> SchemaConverter::visit_object(const Json& schema, const std::string& path,
                                                  const std::string& hint) {
  static const Json kNoProperties = Json::object();
  const Json* props = &kNoProperties;
  if (schema.contains("properties")) {
    props = &schema.at("properties");
    if (!props->is_object()) {
      return invalid_argument("keyword 'properties' at ", show(path), " must be an object");
    }
  }
  std::set<std::string> required;
  if (schema.contains("required")) {
    const Json& req = schema.at("required");
    const bool ok = req.is_array() && std::all_of(req.begin(), req.end(),
                                                  [](const Json& r) { return r.is_string(); });
    if (!ok) {
      return invalid_argument("keyword 'required' at ", show(path),
                              " must be an array of strings");
    }
    for (const Json& r : req) {
      const std::string name = r.get<std::string>();
      if (!props->contains(name)) {
        return invalid_argument("required property '", name, "' at ", show(path),
                                " is not declared in 'properties'");
      }
      required.insert(name);
    }
  }
  std::vector<Member> members;
  for (const auto& [name, sub] : props->items()) {
    const bool req = required.count(name) > 0;
    if (sub.is_boolean() && !sub.get<bool>()) {
      if (req) {
        return invalid_argument("required property '", name, "' at ", show(path),
                                " has the schema false");
      }
      continue;
    }
    ARBOR_ASSIGN_OR_RETURN(std::string value,
                           guarded_value_rule(sub, path + "/properties/" + pointer_token(name),
                                              hint + "-" + sanitize(name)));
    const std::string key = utf8_literal(Json(name).dump() + ":");
    members.push_back({gbnf_sequence({key, ws(), value}), req});
  }
  const Json* additional = schema.contains("additionalProperties")
                               ? &schema.at("additionalProperties") : nullptr;
  ARBOR_ASSIGN_OR_RETURN(std::string extra, additional_member(*props, additional, path, hint));
  return object_body(members, extra);
}

// The GBNF for one additional property ("" when none are allowed).
Result<std::string> SchemaConverter::additional_member(const Json& props, const Json* additional,
                                                       const std::string& path,
                                                       const std::string& hint) {
  if (additional == nullptr || (additional->is_boolean() && !additional->get<bool>())) {
    return std::string();
  }
  if (!additional->is_boolean() && !additional->is_object()) {
    return invalid_argument("keyword 'additionalProperties' at ", show(path),
                            " must be a boolean or a schema");
  }
  std::string value;
  if (additional->is_object()) {
    ARBOR_ASSIGN_OR_RETURN(value, guarded_value_rule(*additional, path + "/additionalProperties",
                                                     hint + "-additional"));
  } else {
    value = shared(SharedRule::kValue);
  }
  std::string key;
  if (props.empty()) {
    key = shared(SharedRule::kString);
  } else {
    KeyTrie trie;
    for (const auto& [name, sub] : props.items()) {
      std::optional<std::u32string> cps = decode_utf8(name);
      if (!cps) continue;  // not spellable either
      const bool plain = std::all_of(cps->begin(), cps->end(), [](char32_t c) {
        return c >= 0x20 && c != '"' && c != '\\';
      });
      // A name that needs an escape can never be spelled by a key without escapes.
      if (!plain) continue;
      if (cps->size() > kMaxExcludedKeyLength) {
        return invalid_argument("property name at ", show(path), " is longer than ",
                                kMaxExcludedKeyLength,
                                " characters, which additionalProperties does not support");
      }
      trie.insert(*cps);
    }
    key = add_rule(hint + "-additional-key", gbnf_sequence({kQuote, key_not_in(trie), kQuote}));
  }
  return gbnf_sequence({key, "\":\"", ws(), value});
}

// "{" members "}" where `members` keep their order, optional ones may be left out, and the
// additional property (if any) repeats after them; commas only between present members.
std::string SchemaConverter::object_body(const std::vector<Member>& members,
                                         const std::string& additional) {
  const std::string comma = gbnf_sequence({"\",\"", ws()});
  const std::string more_additional =
      additional.empty() ? "" : "( " + gbnf_sequence({comma, additional}) + " )*";
  // Members j.. after at least one member has been written.
  auto rest = [&](size_t j) {
    std::vector<std::string> parts;
    for (size_t k = j; k < members.size(); ++k) {
      const std::string part = gbnf_sequence({comma, members[k].kv});
      parts.push_back(members[k].required ? part : optional_of(part));
    }
    parts.push_back(more_additional);
    return gbnf_sequence(parts);
  };
  // The first written member is member j: every member before it is optional.
  std::vector<std::string> alts;
  bool any_required = false;
  for (size_t j = 0; j < members.size() && !any_required; ++j) {
    alts.push_back(gbnf_sequence({members[j].kv, rest(j + 1)}));
    any_required = members[j].required;
  }
  if (!any_required && !additional.empty()) {
    alts.push_back(gbnf_sequence({additional, more_additional}));
  }
  const std::string open = gbnf_sequence({"\"{\"", ws()});
  if (alts.empty()) return gbnf_sequence({open, "\"}\""});
  const std::string inner = gbnf_group(alts);
  if (any_required) return gbnf_sequence({open, inner, ws(), "\"}\""});
  return gbnf_sequence({open, optional_of(gbnf_sequence({inner, ws()})), "\"}\""});
}

Result<std::string> SchemaConverter::visit_array(const Json& schema, const std::string& path,
                                                 const std::string& hint) {
  const Json* items = schema.contains("items") ? &schema.at("items") : nullptr;
  if (items != nullptr && items->is_array()) {
    return invalid_argument("keyword 'items' at ", show(path),
                            " is an array (the draft-4 tuple form); use 'prefixItems'");
  }
  if (items != nullptr && !items->is_boolean() && !items->is_object()) {
    return invalid_argument("keyword 'items' at ", show(path), " must be a schema");
  }
  ARBOR_ASSIGN_OR_RETURN(std::optional<uint64_t> min_items, read_count(schema, "minItems", path));
  ARBOR_ASSIGN_OR_RETURN(std::optional<uint64_t> max, read_count(schema, "maxItems", path));
  const uint64_t min = min_items.value_or(0);
  if (max && min > *max) {
    return invalid_argument("minItems ", min, " at ", show(path), " is greater than maxItems ",
                            *max);
  }
  std::vector<std::string> prefix;
  if (schema.contains("prefixItems")) {
    const Json& list = schema.at("prefixItems");
    if (!list.is_array()) {
      return invalid_argument("keyword 'prefixItems' at ", show(path),
                              " must be an array of schemas");
    }
    for (size_t i = 0; i < list.size() && (!max || i < *max); ++i) {
      if (list[i].is_boolean() && !list[i].get<bool>()) {
        max = i;  // no element can sit at position i
        break;
      }
      ARBOR_ASSIGN_OR_RETURN(std::string e,
                             guarded_value_rule(list[i], path + "/prefixItems/" +
                                                std::to_string(i), hint + "-" + std::to_string(i)));
      prefix.push_back(std::move(e));
    }
  }
  std::string rest;
  if (items == nullptr || (items->is_boolean() && items->get<bool>())) {
    rest = shared(SharedRule::kValue);
  } else if (items->is_object()) {
    ARBOR_ASSIGN_OR_RETURN(rest, guarded_value_rule(*items, path + "/items", hint + "-item"));
  }
  std::optional<uint64_t> capacity = max;
  if (rest.empty() && (!capacity || *capacity > prefix.size())) capacity = prefix.size();
  if (capacity && min > *capacity) {
    return invalid_argument("minItems ", min, " at ", show(path), " cannot be met: at most ",
                            *capacity, " elements are allowed");
  }
  if (max && *max > 1000000) {
    return invalid_argument("maxItems ", *max, " at ", show(path),
                            " exceeds the supported limit 1000000");
  }
  if (min > 1000000) {
    return invalid_argument("minItems ", min, " at ", show(path),
                            " exceeds the supported limit 1000000");
  }
  const std::string open = gbnf_sequence({"\"[\"", ws()});
  if (capacity && *capacity == 0) return gbnf_sequence({open, "\"]\""});
  const std::string elements = array_elements(0, prefix, rest, min, capacity);
  if (min >= 1) return gbnf_sequence({open, elements, ws(), "\"]\""});
  return gbnf_sequence({open, optional_of(gbnf_sequence({elements, ws()})), "\"]\""});
}

// Elements j.. of an array whose element j is present: the prefix schemas first, then `rest`
// ("" when items is false) repeated; between `min` and `max` elements in all.
std::string SchemaConverter::array_elements(size_t j, const std::vector<std::string>& prefix,
                                            const std::string& rest, uint64_t min,
                                            std::optional<uint64_t> max) {
  const std::string comma = gbnf_sequence({"\",\"", ws()});
  if (j >= prefix.size()) {
    const uint64_t lo = min > j + 1 ? min - j - 1 : 0;
    std::optional<uint64_t> hi;
    if (max) hi = *max - j - 1;
    Result<std::string> more = gbnf_repeat("( " + gbnf_sequence({comma, rest}) + " )", lo, hi);
    ARBOR_CHECK(more.ok()) << more.status().to_string();  // counts checked by the caller
    return gbnf_sequence({rest, *more});
  }
  const std::string& element = prefix[j];
  if (max && j + 1 >= *max) return element;
  if (j + 1 >= prefix.size() && rest.empty()) return element;
  const std::string next = gbnf_sequence({comma, array_elements(j + 1, prefix, rest, min, max)});
  return gbnf_sequence({element, min > j + 1 ? next : optional_of(next)});
}

}  // namespace

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                        const JsonGrammarOptions& options) {
  try {
    return SchemaConverter(schema, options).convert();
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("JSON Schema could not be read: ", e.what());
  }
}

Result<std::string> json_schema_to_gbnf(const nlohmann::json& schema,
                                        const JsonGrammarOptions& options) {
  try {
    return json_schema_to_gbnf(nlohmann::ordered_json(schema), options);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("JSON Schema could not be read: ", e.what());
  }
}

Result<std::string> free_json_gbnf(const JsonGrammarOptions& options) {
  static const Json kEmpty;
  return SchemaConverter(kEmpty, options).free_object();
}

}  // namespace arbor::grammar
