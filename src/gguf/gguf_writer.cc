// GgufWriter: metadata editing, tensor layout and serialisation.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "base/progress.h"
#include "gguf/gguf.h"

namespace arbor::gguf {

namespace {

constexpr std::string_view kAlignmentKey = "general.alignment";

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

template <typename T>
void put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

void put_string(std::string* out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out->append(s);
}

void put_value(std::string* out, const Value& v) {
  switch (v.type) {
    case ValueType::kUint8: return put(out, std::get<uint8_t>(v.data));
    case ValueType::kInt8: return put(out, std::get<int8_t>(v.data));
    case ValueType::kUint16: return put(out, std::get<uint16_t>(v.data));
    case ValueType::kInt16: return put(out, std::get<int16_t>(v.data));
    case ValueType::kUint32: return put(out, std::get<uint32_t>(v.data));
    case ValueType::kInt32: return put(out, std::get<int32_t>(v.data));
    case ValueType::kFloat32: return put(out, std::get<float>(v.data));
    case ValueType::kBool: return put<uint8_t>(out, std::get<bool>(v.data) ? 1 : 0);
    case ValueType::kString: return put_string(out, std::get<std::string>(v.data));
    case ValueType::kUint64: return put(out, std::get<uint64_t>(v.data));
    case ValueType::kInt64: return put(out, std::get<int64_t>(v.data));
    case ValueType::kFloat64: return put(out, std::get<double>(v.data));
    case ValueType::kArray: {
      const Array& a = std::get<Array>(v.data);
      put<uint32_t>(out, static_cast<uint32_t>(a.elem_type));
      put<uint64_t>(out, a.items.size());
      for (const Value& item : a.items) {
        ARBOR_CHECK(item.type == a.elem_type)
            << "array of " << value_type_name(a.elem_type) << " holds a "
            << value_type_name(item.type);
        put_value(out, item);
      }
      return;
    }
  }
  ARBOR_CHECK(false) << "unknown value type " << static_cast<uint32_t>(v.type);
}

// A Value's variant alternative must match its declared type, or it would be written wrongly.
void check_value(const Value& v) {
  const size_t expected = [&] {
    switch (v.type) {
      case ValueType::kUint8: return size_t{0};
      case ValueType::kInt8: return size_t{1};
      case ValueType::kUint16: return size_t{2};
      case ValueType::kInt16: return size_t{3};
      case ValueType::kUint32: return size_t{4};
      case ValueType::kInt32: return size_t{5};
      case ValueType::kFloat32: return size_t{6};
      case ValueType::kBool: return size_t{7};
      case ValueType::kString: return size_t{8};
      case ValueType::kArray: return size_t{9};
      case ValueType::kUint64: return size_t{10};
      case ValueType::kInt64: return size_t{11};
      case ValueType::kFloat64: return size_t{12};
    }
    return std::variant_npos;
  }();
  ARBOR_CHECK_EQ(v.data.index(), expected) << "Value of type " << value_type_name(v.type);
  if (v.type == ValueType::kArray) {
    for (const Value& item : std::get<Array>(v.data).items) check_value(item);
  }
}

}  // namespace

GgufWriter GgufWriter::from_file(const GgufFile& file) {
  GgufWriter w;
  w.version_ = file.version();
  w.alignment_ = file.alignment();
  w.metadata_ = file.metadata();
  for (const TensorInfo& t : file.tensors()) {
    auto p = std::make_unique<PendingTensor>();
    p->name = t.name;
    p->type = t.type;
    p->dims = t.dims;
    p->data = t.bytes();
    p->nbytes = t.size_bytes;
    p->offset = t.offset;
    p->fixed_offset = true;
    w.tensors_.push_back(std::move(p));
  }
  w.pad_end_ = file.file_bytes().size() % file.alignment() == 0;
  return w;
}

void GgufWriter::set_version(uint32_t version) {
  ARBOR_CHECK(version == 2 || version == 3) << "GGUF version " << version;
  version_ = version;
}

void GgufWriter::set_alignment(uint64_t alignment) {
  ARBOR_CHECK(alignment > 0 && alignment <= UINT32_MAX && std::has_single_bit(alignment))
      << "alignment " << alignment << " is not a power of two";
  alignment_ = alignment;
  if (alignment != kDefaultAlignment || find(kAlignmentKey) != nullptr) {
    set(std::string(kAlignmentKey), Value::u32(static_cast<uint32_t>(alignment)));
  }
}

void GgufWriter::set(std::string key, Value value) {
  check_value(value);
  if (key == kAlignmentKey) {
    ARBOR_CHECK(value.type == ValueType::kUint32) << "general.alignment must be a u32";
    const uint32_t a = std::get<uint32_t>(value.data);
    ARBOR_CHECK(a > 0 && std::has_single_bit(a)) << "alignment " << a << " is not a power of two";
    alignment_ = a;
  }
  for (KeyValue& kv : metadata_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  metadata_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::remove(std::string_view key) {
  std::erase_if(metadata_, [&](const KeyValue& kv) { return kv.key == key; });
  if (key == kAlignmentKey) alignment_ = kDefaultAlignment;
}

const Value* GgufWriter::find(std::string_view key) const {
  for (const KeyValue& kv : metadata_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

void GgufWriter::add_tensor(std::unique_ptr<PendingTensor> t) {
  ARBOR_CHECK_LE(t->name.size(), kGgmlMaxNameLength) << "tensor name '" << t->name << "'";
  ARBOR_CHECK(t->dims.size() >= 1 && t->dims.size() <= kGgmlMaxDims)
      << "tensor '" << t->name << "' has " << t->dims.size() << " dims";
  const auto nbytes = ggml_nbytes(t->type, t->dims);
  ARBOR_CHECK(nbytes.has_value()) << "tensor '" << t->name << "' has invalid dims for "
                                  << ggml_type_name(t->type);
  if (!t->generate) ARBOR_CHECK_EQ(t->data.size(), *nbytes) << "tensor '" << t->name << "'";
  t->nbytes = *nbytes;
  for (const auto& other : tensors_) {
    ARBOR_CHECK(other->name != t->name) << "duplicate tensor name '" << t->name << "'";
  }
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor_owned(std::string name, GgmlType type, std::vector<int64_t> dims,
                                  std::vector<uint8_t> data) {
  auto t = std::make_unique<PendingTensor>();
  t->name = std::move(name);
  t->type = type;
  t->dims = std::move(dims);
  t->owned = std::move(data);
  t->data = t->owned;
  add_tensor(std::move(t));
}

void GgufWriter::add_tensor_ref(std::string name, GgmlType type, std::vector<int64_t> dims,
                                std::span<const uint8_t> data) {
  auto t = std::make_unique<PendingTensor>();
  t->name = std::move(name);
  t->type = type;
  t->dims = std::move(dims);
  t->data = data;
  add_tensor(std::move(t));
}

void GgufWriter::add_tensor_generated(std::string name, GgmlType type, std::vector<int64_t> dims,
                                      TensorGenerator generate) {
  auto t = std::make_unique<PendingTensor>();
  t->name = std::move(name);
  t->type = type;
  t->dims = std::move(dims);
  t->generate = std::move(generate);
  add_tensor(std::move(t));
}

std::vector<uint64_t> GgufWriter::plan_offsets() const {
  // Tensors with fixed offsets (from_file) keep them; the rest follow the last fixed one.
  uint64_t next = 0;
  for (const auto& t : tensors_) {
    if (t->fixed_offset) {
      ARBOR_CHECK_EQ(t->offset % alignment_, 0u) << "tensor '" << t->name << "'";
      next = std::max(next, align_up(t->offset + t->nbytes, alignment_));
    }
  }
  std::vector<uint64_t> offsets;
  offsets.reserve(tensors_.size());
  for (const auto& t : tensors_) {
    if (t->fixed_offset) {
      offsets.push_back(t->offset);
    } else {
      offsets.push_back(next);
      next = align_up(next + t->nbytes, alignment_);
    }
  }
  return offsets;
}

std::string GgufWriter::encode_meta(const std::vector<uint64_t>& offsets) const {
  std::string out = "GGUF";
  put<uint32_t>(&out, version_);
  put<uint64_t>(&out, tensors_.size());
  put<uint64_t>(&out, metadata_.size());
  for (const KeyValue& kv : metadata_) {
    put_string(&out, kv.key);
    put<uint32_t>(&out, static_cast<uint32_t>(kv.value.type));
    put_value(&out, kv.value);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = *tensors_[i];
    put_string(&out, t.name);
    put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<int64_t>(&out, d);
    put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    put<uint64_t>(&out, offsets[i]);
  }
  return out;
}

namespace {

// Indices of tensors in the order their data appears in the file.
std::vector<size_t> data_order(const std::vector<uint64_t>& offsets) {
  std::vector<size_t> order(offsets.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return offsets[a] < offsets[b]; });
  return order;
}

}  // namespace

// fn(the tensor's bytes): its data, or what its generator makes (checked against its size).
template <class Fn>
bool GgufWriter::with_bytes(const PendingTensor& t, const Fn& fn, Status* error) {
  if (!t.generate) return fn(t.data);
  Result<std::vector<uint8_t>> bytes = t.generate();
  if (!bytes.ok()) {
    *error = bytes.status().with_context(str_cat("tensor '", t.name, "'"));
    return false;
  }
  ARBOR_CHECK_EQ(bytes->size(), t.nbytes) << "generated tensor '" << t.name << "'";
  return fn(std::span<const uint8_t>(*bytes));
}

std::string GgufWriter::serialize() const {
  const std::vector<uint64_t> offsets = plan_offsets();
  std::string out = encode_meta(offsets);
  if (!tensors_.empty()) {
    out.resize(align_up(out.size(), alignment_), '\0');
    const uint64_t data_start = out.size();
    for (size_t i : data_order(offsets)) {
      ARBOR_CHECK_GE(data_start + offsets[i], out.size()) << "overlapping tensors";
      out.resize(data_start + offsets[i], '\0');
      Status error;
      const bool ok = with_bytes(*tensors_[i], [&](std::span<const uint8_t> data) {
        out.append(reinterpret_cast<const char*>(data.data()), data.size());
        return true;
      }, &error);
      ARBOR_CHECK(ok) << error.to_string();
    }
  }
  if (pad_end_) out.resize(align_up(out.size(), alignment_), '\0');
  return out;
}

namespace {

class FileSink {
 public:
  explicit FileSink(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {}
  ~FileSink() {
    if (f_ != nullptr) std::fclose(f_);
  }
  bool is_open() const { return f_ != nullptr; }
  uint64_t size() const { return size_; }
  bool write(const void* p, size_t n) {
    size_ += n;
    return n == 0 || std::fwrite(p, 1, n, f_) == n;
  }
  bool zeros(uint64_t n) {
    static const char kZeros[4096] = {};
    while (n > 0) {
      const size_t k = std::min<uint64_t>(n, sizeof(kZeros));
      if (!write(kZeros, k)) return false;
      n -= k;
    }
    return true;
  }
  bool close() {
    const bool ok = std::fflush(f_) == 0 && std::fclose(f_) == 0;
    f_ = nullptr;
    return ok;
  }

 private:
  std::string path_;
  std::FILE* f_;
  uint64_t size_ = 0;
};

}  // namespace

Status GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  const std::vector<uint64_t> offsets = plan_offsets();
  bool ok = true;
  Status generator_error;
  {
    FileSink sink(tmp);
    if (!sink.is_open()) return io_error("cannot create ", tmp, ": ", std::strerror(errno));
    const std::string meta = encode_meta(offsets);
    ok = sink.write(meta.data(), meta.size());
    if (!tensors_.empty()) {
      ok = ok && sink.zeros(align_up(sink.size(), alignment_) - sink.size());
      const uint64_t data_start = sink.size();
      ProgressBar bar("writing " + path, tensors_.size(), "tensors");
      for (size_t i : data_order(offsets)) {
        ARBOR_CHECK_GE(data_start + offsets[i], sink.size()) << "overlapping tensors";
        ok = ok && sink.zeros(data_start + offsets[i] - sink.size());
        ok = ok && with_bytes(*tensors_[i], [&](std::span<const uint8_t> data) {
          return sink.write(data.data(), data.size());
        }, &generator_error);
        bar.add(1);
      }
      bar.finish();
    }
    if (pad_end_) ok = ok && sink.zeros(align_up(sink.size(), alignment_) - sink.size());
    ok = sink.close() && ok;
  }
  if (!ok) {
    const int err = errno;
    std::remove(tmp.c_str());
    if (!generator_error.ok()) return generator_error;
    return io_error("cannot write ", tmp, ": ", std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return io_error("cannot rename ", tmp, " to ", path, ": ", std::strerror(err));
  }
  return ok_status();
}

}  // namespace arbor::gguf
