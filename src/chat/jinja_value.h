// Value: the data model of the Jinja interpreter (jinja.h).
//
// A Value is what a Python object is to Jinja2: undefined, none, bool, int, float, string, list,
// dict, a template macro, or a callable (a global function such as range, or a method bound to
// its object, as `d.items` without a call yields in Jinja2). Lists and dicts are shared by
// reference like Python objects (copying a Value copies a pointer); dicts keep insertion order, as
// Python dicts do, so `tojson` and `items()` print keys in the order they were written. Dict keys
// are values (strings, numbers, none, tuples) compared with Python's ==, so 1, 1.0 and true are
// one key. A dict flagged as a namespace is the only object whose attributes
// `{% set ns.x = ... %}` may assign.
//
// Python distinctions that templates can observe are kept as flags:
//   * a list may print as a tuple (`(1, 2)`), and is then not equal to the list [1, 2];
//   * a list may be a one-shot iterator (what map/select/reject/selectattr/rejectattr/unique/items
//     and reverse return in Jinja2): always truthy, no length, not JSON-serialisable, and empty
//     once iterated (see Value::consume());
//   * a string may be markup-safe (`|safe`, `|e`: markupsafe.Markup), so that `+` with a plain
//     string HTML-escapes the plain one, as Markup.__add__ does.
//
// Strings are UTF-8 bytes; `length`, indexing and slicing of strings count code points, as Python
// does. Case mapping (upper/lower/title/capitalize) is ASCII only.
//
// Thread safety: a Value tree is not synchronised; one render owns its values.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace arbor::chat::jinja {

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<Value, Value>>;  // insertion-ordered (key, value)

struct MacroNode;     // defined in jinja_ast.h
struct MacroClosure;  // the scopes a macro was defined in; defined in jinja.cc

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kMacro,
    kCallable,
  };

  Value() = default;                                                  // undefined
  Value(bool b) : kind_(Kind::kBool), int_(b ? 1 : 0) {}              // NOLINT
  Value(int i) : kind_(Kind::kInt), int_(i) {}                        // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}                    // NOLINT
  Value(double d) : kind_(Kind::kFloat), float_(d) {}                 // NOLINT
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}  // NOLINT
  Value(const char* s) : kind_(Kind::kString), str_(s) {}             // NOLINT
  Value(std::string_view s) : kind_(Kind::kString), str_(s) {}        // NOLINT

  static Value none();
  static Value list(ValueList items = {});
  // A list that prints as a Python tuple: `(1, 2)` literals, dict items() pairs.
  static Value tuple(ValueList items);
  // A one-shot iterator over `items` (a Python generator or list_reverseiterator).
  static Value iterator(ValueList items);
  // A string marked safe (markupsafe.Markup).
  static Value markup(std::string s);
  static Value dict(ValueDict items = {});
  static Value namespace_dict(ValueDict items = {});
  // A macro, with the scopes it was defined in (null: the template's top level).
  static Value macro(const MacroNode* node, std::shared_ptr<const MacroClosure> closure = nullptr);
  // A global function (`range`), or the method `name` bound to `self` (`'a'.upper`, `d.items`).
  static Value callable(std::string name, const Value* self = nullptr);
  // Converts JSON. Objects keep the key order of the JSON type: sorted for nlohmann::json,
  // insertion (the client's) order for nlohmann::ordered_json.
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python numbers include bool.
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  // An int or a bool (Python's int includes bool).
  bool is_integral() const { return is_int() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return is_string() && flag_ == Flag::kMarkup; }
  // Lists, tuples and iterators.
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return is_list() && flag_ == Flag::kTuple; }
  bool is_iterator() const { return is_list() && flag_ == Flag::kIterator; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return is_dict() && flag_ == Flag::kNamespace; }
  // A dict that is a Python Mapping (a namespace is not one).
  bool is_mapping() const { return is_dict() && flag_ != Flag::kNamespace; }
  bool is_macro() const { return kind_ == Kind::kMacro; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return is_float() ? static_cast<int64_t>(float_) : int_; }
  double as_float() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_; }
  // Precondition: is_list() / is_dict(). For an iterator, items() is everything it held,
  // consumed or not: use consume() to iterate it.
  ValueList& items() const { return *list_; }
  ValueDict& entries() const { return *dict_; }
  const MacroNode* macro_node() const { return macro_; }
  const MacroClosure* macro_closure() const { return closure_.get(); }
  // Precondition: is_callable(). The function or method name, and the bound object (undefined
  // for a global).
  const std::string& callable_name() const { return str_; }
  const Value& bound_self() const { return *self_; }

  // For an iterator: the items not yet consumed, which are consumed now; with `limit`, at most
  // that many. For anything else: precondition violated (use items()).
  ValueList consume(size_t limit = SIZE_MAX) const;

  // Dict lookup by key (Python ==); nullptr when absent or not a dict.
  const Value* find(std::string_view key) const;
  const Value* find_key(const Value& key) const;
  // Inserts or replaces a dict entry. Precondition: is_dict().
  void set(std::string_view key, Value v) const;
  void set_key(const Value& key, Value v) const;

  // Python truthiness; undefined is false, an iterator is true.
  bool truthy() const;
  // Python str(): what `{{ value }}` prints (undefined prints nothing, none prints "None").
  std::string str() const;
  // Python repr(): strings quoted, used inside list/dict printing.
  std::string repr() const;
  // Python ==, with 1 == 1.0 == True and element-wise containers.
  bool equals(const Value& other) const;
  // Jinja type name for messages: "string", "list", ...
  std::string_view type_name() const;

 private:
  enum class Flag : uint8_t { kNone, kTuple, kIterator, kMarkup, kNamespace };

  Kind kind_ = Kind::kUndefined;
  Flag flag_ = Flag::kNone;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string str_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<size_t> cursor_;  // an iterator's next unconsumed item
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Value> self_;
  const MacroNode* macro_ = nullptr;
  std::shared_ptr<const MacroClosure> closure_;
};

// Number of Unicode code points in UTF-8 `s` (continuation bytes are not counted).
size_t utf8_length(std::string_view s);
// Byte offsets of each code point start, plus s.size() at the end.
std::vector<size_t> utf8_offsets(std::string_view s);
// Python float repr: shortest round-trip digits, always with a '.' or exponent.
std::string format_float(double d);
// markupsafe.escape of a plain string: & < > " ' become entities.
std::string html_escape(std::string_view s);

}  // namespace arbor::chat::jinja
