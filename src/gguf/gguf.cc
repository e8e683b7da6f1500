// GGUF reader (GgufFile::parse/open). Getters are in gguf_value.cc, the writer in gguf_writer.cc.
#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>

#include "gguf/gguf.h"
#include "gguf/internal.h"

namespace arbor::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kUint8: return "u8";
    case ValueType::kInt8: return "i8";
    case ValueType::kUint16: return "u16";
    case ValueType::kInt16: return "i16";
    case ValueType::kUint32: return "u32";
    case ValueType::kInt32: return "i32";
    case ValueType::kFloat32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "u64";
    case ValueType::kInt64: return "i64";
    case ValueType::kFloat64: return "f64";
  }
  return "unknown";
}

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Parser

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;
// Smallest encodings, used to bound counts by the bytes left before allocating anything.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;               // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim, type, offset
// Containers grow as items actually parse: a decoded Value is ~48 bytes, so reserving a
// corrupt count up front could still ask for ~50x the file size.
constexpr uint64_t kInitialReserve = 4096;

bool is_valid_value_type(uint32_t raw) { return raw <= static_cast<uint32_t>(ValueType::kFloat64); }

// Bytes of one encoded scalar, or of the smallest possible string/array.
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kBool: return 1;
    case ValueType::kUint16: case ValueType::kInt16: return 2;
    case ValueType::kUint32: case ValueType::kInt32: case ValueType::kFloat32: return 4;
    case ValueType::kUint64: case ValueType::kInt64: case ValueType::kFloat64: return 8;
    case ValueType::kString: return 8;
    case ValueType::kArray: return 4 + 8;
  }
  return 1;
}

}  // namespace

class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, const std::string& name, GgufFile* out)
      : bytes_(bytes), name_(name), out_(out) {}

  Status parse();

 private:
  template <typename... Args>
  Status fail_at(uint64_t offset, const Args&... args) const {
    return data_loss(name_, ": at offset ", offset, ": ", args...);
  }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  Status read(T* v, std::string_view what) {
    if (remaining() < sizeof(T)) {
      return fail_at(pos_, "file ends while reading ", what, " (", sizeof(T), " bytes needed, ",
                     remaining(), " left)");
    }
    std::memcpy(v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return ok_status();
  }
  Status read_string(std::string* s, std::string_view what);
  Status read_value(ValueType type, int depth, Value* out);
  Status read_array(int depth, Value* out);
  Status parse_header(uint64_t* n_tensors, uint64_t* n_kv);
  Status parse_metadata(uint64_t n_kv);
  Status parse_alignment(const std::vector<uint64_t>& kv_offsets);
  Status parse_tensor_info(std::vector<uint64_t>* info_offsets);
  Status parse_tensor_infos(uint64_t n_tensors);
  Status check_tensor_data(const std::vector<uint64_t>& info_offsets);

  std::span<const uint8_t> bytes_;
  const std::string& name_;
  GgufFile* out_;
  uint64_t pos_ = 0;
};

Status GgufParser::read_string(std::string* s, std::string_view what) {
  const uint64_t start = pos_;
  uint64_t len = 0;
  ARBOR_RETURN_IF_ERROR(read(&len, what));
  if (len > remaining()) {
    return fail_at(start, what, " has length ", len, " but only ", remaining(),
                   " bytes are left in the file");
  }
  s->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
  pos_ += len;
  return ok_status();
}

Status GgufParser::read_array(int depth, Value* out) {
  const uint64_t start = pos_;
  if (depth >= kMaxArrayNesting) {
    return fail_at(start, "arrays nested deeper than ", kMaxArrayNesting, " levels");
  }
  uint32_t raw_type = 0;
  uint64_t count = 0;
  ARBOR_RETURN_IF_ERROR(read(&raw_type, "array element type"));
  if (!is_valid_value_type(raw_type)) {
    return fail_at(start, "unknown array element type ", raw_type);
  }
  ARBOR_RETURN_IF_ERROR(read(&count, "array length"));
  const auto elem_type = static_cast<ValueType>(raw_type);
  const uint64_t min_bytes = min_value_bytes(elem_type);
  if (count > remaining() / min_bytes) {
    return fail_at(start, "array of ", count, " ", value_type_name(elem_type),
                   " needs at least ", min_bytes, " bytes each but only ", remaining(),
                   " bytes are left in the file");
  }
  if (count > kMaxArrayLength) {
    return fail_at(start, "array of ", count, " items is longer than the limit of ",
                   kMaxArrayLength);
  }
  Array array;
  array.elem_type = elem_type;
  array.items.reserve(std::min(count, kInitialReserve));
  for (uint64_t i = 0; i < count; ++i) {
    ARBOR_RETURN_IF_ERROR(read_value(elem_type, depth + 1, &array.items.emplace_back()));
  }
  out->type = ValueType::kArray;
  out->data = std::move(array);
  return ok_status();
}

Status GgufParser::read_value(ValueType type, int depth, Value* out) {
  out->type = type;
  switch (type) {
#define ARBOR_GGUF_SCALAR_(kind, T)                         \
  case ValueType::kind: {                                   \
    T v{};                                                  \
    ARBOR_RETURN_IF_ERROR(read(&v, value_type_name(type))); \
    out->data = v;                                          \
    return ok_status();                                     \
  }
    ARBOR_GGUF_SCALAR_(kUint8, uint8_t)
    ARBOR_GGUF_SCALAR_(kInt8, int8_t)
    ARBOR_GGUF_SCALAR_(kUint16, uint16_t)
    ARBOR_GGUF_SCALAR_(kInt16, int16_t)
    ARBOR_GGUF_SCALAR_(kUint32, uint32_t)
    ARBOR_GGUF_SCALAR_(kInt32, int32_t)
    ARBOR_GGUF_SCALAR_(kFloat32, float)
    ARBOR_GGUF_SCALAR_(kUint64, uint64_t)
    ARBOR_GGUF_SCALAR_(kInt64, int64_t)
    ARBOR_GGUF_SCALAR_(kFloat64, double)
#undef ARBOR_GGUF_SCALAR_
    case ValueType::kBool: {
      const uint64_t at = pos_;
      uint8_t b = 0;
      ARBOR_RETURN_IF_ERROR(read(&b, "bool"));
      // Only 0 and 1 are booleans; anything else would not survive a rewrite byte for byte.
      if (b > 1) return fail_at(at, "bool value ", static_cast<int>(b), " is not 0 or 1");
      out->data = b == 1;
      return ok_status();
    }
    case ValueType::kString: {
      std::string s;
      ARBOR_RETURN_IF_ERROR(read_string(&s, "string value"));
      out->data = std::move(s);
      return ok_status();
    }
    case ValueType::kArray:
      return read_array(depth, out);
  }
  return fail_at(pos_, "unknown value type ", static_cast<uint32_t>(type));
}

Status GgufParser::parse_header(uint64_t* n_tensors, uint64_t* n_kv) {
  if (bytes_.size() < kHeaderBytes) {
    return fail_at(0, "file has ", bytes_.size(), " bytes, a GGUF header needs ", kHeaderBytes);
  }
  if (std::memcmp(bytes_.data(), kMagic, 4) != 0) {
    const uint8_t* m = bytes_.data();
    return fail_at(0, "bad magic: expected 47 47 55 46 (\"GGUF\"), got ",
                   str_cat(std::hex, +m[0], " ", +m[1], " ", +m[2], " ", +m[3]));
  }
  pos_ = 4;
  uint32_t version = 0;
  ARBOR_RETURN_IF_ERROR(read(&version, "version"));
  if (version != 2 && version != 3) {
    if ((version & 0xffff) == 0 && version != 0) {
      return fail_at(4, "GGUF version ", version, " looks byte-swapped (a big-endian file?)");
    }
    return fail_at(4, "GGUF version ", version, " is not supported (only 2 and 3)");
  }
  out_->version_ = version;
  ARBOR_RETURN_IF_ERROR(read(n_tensors, "n_tensors"));
  ARBOR_RETURN_IF_ERROR(read(n_kv, "n_kv"));
  if (*n_kv > remaining() / kMinKvBytes) {
    return fail_at(16, "n_kv = ", *n_kv, " needs at least ", kMinKvBytes,
                   " bytes per key but only ", remaining(), " bytes follow the header");
  }
  if (*n_tensors > remaining() / kMinTensorInfoBytes) {
    return fail_at(8, "n_tensors = ", *n_tensors, " needs at least ", kMinTensorInfoBytes,
                   " bytes per tensor info but only ", remaining(),
                   " bytes follow the header");
  }
  return ok_status();
}

Status GgufParser::parse_metadata(uint64_t n_kv) {
  std::vector<uint64_t> kv_offsets;
  kv_offsets.reserve(std::min(n_kv, kInitialReserve));
  out_->metadata_.reserve(std::min(n_kv, kInitialReserve));
  for (uint64_t i = 0; i < n_kv; ++i) {
    kv_offsets.push_back(pos_);
    KeyValue& kv = out_->metadata_.emplace_back();
    ARBOR_RETURN_IF_ERROR(read_string(&kv.key, "key"));
    const uint64_t type_at = pos_;
    uint32_t raw_type = 0;
    ARBOR_RETURN_IF_ERROR(read(&raw_type, "value type"));
    if (!is_valid_value_type(raw_type)) {
      return fail_at(type_at, "key '", internal::printable(kv.key), "' has unknown value type ", raw_type);
    }
    ARBOR_RETURN_IF_ERROR(read_value(static_cast<ValueType>(raw_type), 0, &kv.value));
    if (!out_->key_index_.emplace(kv.key, i).second) {
      return fail_at(kv_offsets[i], "duplicate key '", internal::printable(kv.key), "'");
    }
  }
  return parse_alignment(kv_offsets);
}

Status GgufParser::parse_alignment(const std::vector<uint64_t>& kv_offsets) {
  const auto it = out_->key_index_.find("general.alignment");
  if (it == out_->key_index_.end()) {
    out_->alignment_ = kDefaultAlignment;
    return ok_status();
  }
  const Value& v = out_->metadata_[it->second].value;
  const uint64_t at = kv_offsets[it->second];
  if (v.type != ValueType::kUint32) {
    return fail_at(at, "general.alignment has type ", value_type_name(v.type), ", expected u32");
  }
  const uint32_t a = std::get<uint32_t>(v.data);
  if (a == 0 || !std::has_single_bit(a)) {
    return fail_at(at, "general.alignment = ", a, " is not a power of two");
  }
  out_->alignment_ = a;
  return ok_status();
}

Status GgufParser::parse_tensor_info(std::vector<uint64_t>* info_offsets) {
  const uint64_t start = pos_;
  info_offsets->push_back(start);
  TensorInfo t;
  ARBOR_RETURN_IF_ERROR(read_string(&t.name, "tensor name"));
  if (t.name.size() > kGgmlMaxNameLength) {
    return fail_at(start, "tensor name of ", t.name.size(), " bytes is longer than ",
                   kGgmlMaxNameLength);
  }
  uint32_t n_dims = 0;
  ARBOR_RETURN_IF_ERROR(read(&n_dims, "n_dims"));
  if (n_dims == 0 || n_dims > kGgmlMaxDims) {
    return fail_at(start, "tensor '", internal::printable(t.name), "' has n_dims = ", n_dims, " (must be 1 to ",
                   kGgmlMaxDims, ")");
  }
  t.dims.resize(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    ARBOR_RETURN_IF_ERROR(read(&t.dims[d], "tensor dim"));
    if (t.dims[d] <= 0) {
      return fail_at(start, "tensor '", internal::printable(t.name), "' has dim ", d, " = ", t.dims[d],
                     " (must be positive)");
    }
  }
  uint32_t raw_type = 0;
  ARBOR_RETURN_IF_ERROR(read(&raw_type, "tensor type"));
  const auto traits = ggml_type_traits(raw_type);
  if (!traits) return fail_at(start, "tensor '", internal::printable(t.name), "' has unknown ggml type ", raw_type);
  t.type = traits->type;
  ARBOR_RETURN_IF_ERROR(read(&t.offset, "tensor offset"));
  if (t.dims[0] % traits->block_size != 0) {
    return fail_at(start, "tensor '", internal::printable(t.name), "' has row length ", t.dims[0],
                   ", not a multiple of the ", traits->name, " block size ", traits->block_size);
  }
  const auto nbytes = ggml_nbytes(t.type, t.dims);
  if (!nbytes) return fail_at(start, "tensor '", internal::printable(t.name), "' is too large (size overflows)");
  t.size_bytes = *nbytes;
  if (!out_->tensor_index_.emplace(t.name, out_->tensors_.size()).second) {
    return fail_at(start, "duplicate tensor name '", internal::printable(t.name), "'");
  }
  out_->tensors_.push_back(std::move(t));
  return ok_status();
}

Status GgufParser::parse_tensor_infos(uint64_t n_tensors) {
  if (n_tensors > remaining() / kMinTensorInfoBytes) {
    return fail_at(pos_, "n_tensors = ", n_tensors, " needs at least ", kMinTensorInfoBytes,
                   " bytes per tensor info but only ", remaining(), " bytes are left");
  }
  std::vector<uint64_t> info_offsets;
  info_offsets.reserve(std::min(n_tensors, kInitialReserve));
  out_->tensors_.reserve(std::min(n_tensors, kInitialReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    ARBOR_RETURN_IF_ERROR(parse_tensor_info(&info_offsets));
  }
  const uint64_t a = out_->alignment_;
  out_->data_offset_ = (pos_ + a - 1) / a * a;
  return check_tensor_data(info_offsets);
}

Status GgufParser::check_tensor_data(const std::vector<uint64_t>& info_offsets) {
  auto& tensors = out_->tensors_;
  if (tensors.empty()) return ok_status();
  const uint64_t data_offset = out_->data_offset_;
  if (data_offset > bytes_.size()) {
    return fail_at(pos_, "data section should start at ", data_offset, " but the file has ",
                   bytes_.size(), " bytes");
  }
  const uint64_t data_size = bytes_.size() - data_offset;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorInfo& t = tensors[i];
    if (t.offset % out_->alignment_ != 0) {
      return fail_at(info_offsets[i], "tensor '", internal::printable(t.name), "' has offset ", t.offset,
                     ", not a multiple of the alignment ", out_->alignment_);
    }
    if (t.offset > data_size || t.size_bytes > data_size - t.offset) {
      return fail_at(info_offsets[i], "tensor '", internal::printable(t.name), "' data [", t.offset, ", ",
                     t.offset + t.size_bytes, ") runs past the end of the data section (",
                     data_size, " bytes)");
    }
    t.data = bytes_.data() + data_offset + t.offset;
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return tensors[x].offset < tensors[y].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors[order[k - 1]];
    const TensorInfo& cur = tensors[order[k]];
    if (cur.offset < prev.offset + prev.size_bytes) {
      return fail_at(info_offsets[order[k]], "tensor '", internal::printable(cur.name), "' at offset ", cur.offset,
                     " overlaps tensor '", internal::printable(prev.name), "' [", prev.offset, ", ",
                     prev.offset + prev.size_bytes, ")");
    }
  }
  return ok_status();
}

Status GgufParser::parse() {
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  ARBOR_RETURN_IF_ERROR(parse_header(&n_tensors, &n_kv));
  ARBOR_RETURN_IF_ERROR(parse_metadata(n_kv));
  return parse_tensor_infos(n_tensors);
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
  GgufFile file;
  file.name_ = name;
  file.bytes_ = bytes;
  GgufParser parser(bytes, name, &file);
  const Status s = parser.parse();
  if (!s.ok()) return s;
  return file;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  auto mapping = std::make_shared<MappedFile>(std::move(mapped).value());
  auto file = parse(mapping->bytes(), path);
  if (!file.ok()) return file.status();
  file->mapping_ = std::move(mapping);
  return file;
}

}  // namespace arbor::gguf
