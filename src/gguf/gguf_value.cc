// Value helpers, value_to_string and GgufFile's typed getters.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <type_traits>

#include "gguf/gguf.h"
#include "gguf/internal.h"

namespace arbor::gguf {

std::string internal::printable(std::string_view s, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  if (n < s.size()) out += str_cat("... (", s.size(), " bytes)");
  return out;
}

Value Value::string_array(const std::vector<std::string>& v) {
  Array a{ValueType::kString, {}};
  a.items.reserve(v.size());
  for (const std::string& s : v) a.items.push_back(Value::str(s));
  return {ValueType::kArray, std::move(a)};
}

Value Value::f32_array(const std::vector<float>& v) {
  Array a{ValueType::kFloat32, {}};
  a.items.reserve(v.size());
  for (float f : v) a.items.push_back(Value::f32(f));
  return {ValueType::kArray, std::move(a)};
}

Value Value::i32_array(const std::vector<int32_t>& v) {
  Array a{ValueType::kInt32, {}};
  a.items.reserve(v.size());
  for (int32_t i : v) a.items.push_back(Value::i32(i));
  return {ValueType::kArray, std::move(a)};
}

Value Value::array(ValueType elem_type, std::vector<Value> items) {
  for (const Value& item : items) {
    ARBOR_CHECK(item.type == elem_type)
        << "array of " << value_type_name(elem_type) << " given a " << value_type_name(item.type);
  }
  return {ValueType::kArray, Array{elem_type, std::move(items)}};
}

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  out += internal::printable(s, std::string::npos);
  out += '"';
  return out;
}

// An integer value of any width, as sign and magnitude.
struct Integer {
  bool negative = false;
  uint64_t magnitude = 0;
};

template <typename T>
Integer make_integer(T v) {
  if constexpr (std::is_signed_v<T>) {
    if (v < 0) return {true, static_cast<uint64_t>(-(static_cast<int64_t>(v) + 1)) + 1};
  }
  return {false, static_cast<uint64_t>(v)};
}

std::optional<Integer> as_integer(const Value& v) {
  switch (v.type) {
    case ValueType::kUint8: return make_integer(std::get<uint8_t>(v.data));
    case ValueType::kInt8: return make_integer(std::get<int8_t>(v.data));
    case ValueType::kUint16: return make_integer(std::get<uint16_t>(v.data));
    case ValueType::kInt16: return make_integer(std::get<int16_t>(v.data));
    case ValueType::kUint32: return make_integer(std::get<uint32_t>(v.data));
    case ValueType::kInt32: return make_integer(std::get<int32_t>(v.data));
    case ValueType::kUint64: return make_integer(std::get<uint64_t>(v.data));
    case ValueType::kInt64: return make_integer(std::get<int64_t>(v.data));
    case ValueType::kFloat32: case ValueType::kFloat64: case ValueType::kBool:
    case ValueType::kString: case ValueType::kArray:
      return std::nullopt;
  }
  return std::nullopt;
}

std::string integer_string(Integer i) {
  return i.negative ? str_cat("-", i.magnitude) : str_cat(i.magnitude);
}

// Converts to T if the value is an integer within T's range.
template <typename T>
std::optional<T> integer_to(const Value& v) {
  const auto i = as_integer(v);
  if (!i) return std::nullopt;
  if (i->negative) {
    if constexpr (std::is_signed_v<T>) {
      const uint64_t max_neg = static_cast<uint64_t>(-(std::numeric_limits<T>::min() + 1)) + 1;
      if (i->magnitude > max_neg) return std::nullopt;
      return static_cast<T>(-static_cast<T>(i->magnitude - 1) - 1);
    } else {
      return std::nullopt;
    }
  }
  if (i->magnitude > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
  return static_cast<T>(i->magnitude);
}

std::string float_string(double d) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.9g", d);
  return buf;
}

}  // namespace

std::string value_to_string(const Value& v, size_t max_items) {
  if (auto i = as_integer(v)) return integer_string(*i);
  switch (v.type) {
    case ValueType::kFloat32: return float_string(std::get<float>(v.data));
    case ValueType::kFloat64: return float_string(std::get<double>(v.data));
    case ValueType::kBool: return std::get<bool>(v.data) ? "true" : "false";
    case ValueType::kString: return quote(std::get<std::string>(v.data));
    case ValueType::kArray: {
      const Array& a = std::get<Array>(v.data);
      std::string out = "[";
      const size_t shown = std::min(max_items, a.items.size());
      for (size_t k = 0; k < shown; ++k) {
        if (k > 0) out += ", ";
        out += value_to_string(a.items[k], max_items);
      }
      if (shown < a.items.size()) out += str_cat(", ... (", a.items.size(), " items)");
      return out + "]";
    }
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kUint16:
    case ValueType::kInt16: case ValueType::kUint32: case ValueType::kInt32:
    case ValueType::kUint64: case ValueType::kInt64:
      break;  // handled by as_integer above
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Getters

const Value* GgufFile::find(std::string_view key) const {
  const auto it = key_index_.find(std::string(key));
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status missing(const std::string& file, std::string_view key) {
  return not_found(file, ": key '", key, "' not found");
}

Status wrong_type(const std::string& file, std::string_view key, const Value& v,
                  std::string_view expected) {
  return invalid_argument(file, ": key '", key, "' has type ", value_type_name(v.type),
                          " (value ", value_to_string(v, 4), "), expected ", expected);
}

template <typename T>
Result<T> get_integer(const GgufFile& f, std::string_view key, std::string_view expected) {
  const Value* v = f.find(key);
  if (v == nullptr) return missing(f.name(), key);
  const auto out = integer_to<T>(*v);
  if (!out) return wrong_type(f.name(), key, *v, expected);
  return *out;
}

const Array* find_array(const GgufFile& f, std::string_view key, Status* error) {
  const Value* v = f.find(key);
  if (v == nullptr) {
    *error = missing(f.name(), key);
    return nullptr;
  }
  if (v->type != ValueType::kArray) {
    *error = wrong_type(f.name(), key, *v, "array");
    return nullptr;
  }
  return &std::get<Array>(v->data);
}

}  // namespace

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(name_, key);
  if (v->type != ValueType::kString) return wrong_type(name_, key, *v, "string");
  return std::get<std::string>(v->data);
}

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  return get_integer<uint32_t>(*this, key, "an integer in [0, 4294967295]");
}

Result<uint64_t> GgufFile::get_u64(std::string_view key) const {
  return get_integer<uint64_t>(*this, key, "a non-negative integer");
}

Result<int64_t> GgufFile::get_i64(std::string_view key) const {
  return get_integer<int64_t>(*this, key, "an integer that fits in i64");
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(name_, key);
  if (v->type == ValueType::kFloat32) return std::get<float>(v->data);
  if (v->type == ValueType::kFloat64) return static_cast<float>(std::get<double>(v->data));
  return wrong_type(name_, key, *v, "f32 or f64");
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(name_, key);
  if (v->type != ValueType::kBool) return wrong_type(name_, key, *v, "bool");
  return std::get<bool>(v->data);
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  Status error;
  const Array* a = find_array(*this, key, &error);
  if (a == nullptr) return error;
  if (a->elem_type != ValueType::kString) {
    return invalid_argument(name_, ": key '", key, "' is an array of ",
                            value_type_name(a->elem_type), ", expected an array of string");
  }
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const Value& item : a->items) out.push_back(std::get<std::string>(item.data));
  return out;
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  Status error;
  const Array* a = find_array(*this, key, &error);
  if (a == nullptr) return error;
  std::vector<float> out;
  out.reserve(a->items.size());
  for (const Value& item : a->items) {
    if (item.type == ValueType::kFloat32) {
      out.push_back(std::get<float>(item.data));
    } else if (item.type == ValueType::kFloat64) {
      out.push_back(static_cast<float>(std::get<double>(item.data)));
    } else {
      return invalid_argument(name_, ": key '", key, "' is an array of ",
                              value_type_name(a->elem_type), ", expected an array of f32");
    }
  }
  return out;
}

Result<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
  Status error;
  const Array* a = find_array(*this, key, &error);
  if (a == nullptr) return error;
  std::vector<int32_t> out;
  out.reserve(a->items.size());
  for (size_t k = 0; k < a->items.size(); ++k) {
    const Value& item = a->items[k];
    const auto v = integer_to<int32_t>(item);
    if (!v) {
      return invalid_argument(name_, ": key '", key, "' item ", k, " (",
                              value_type_name(item.type), " ", value_to_string(item, 4),
                              ") is not an integer that fits in i32");
    }
    out.push_back(*v);
  }
  return out;
}

}  // namespace arbor::gguf
