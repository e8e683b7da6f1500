#include "convert/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

namespace arbor::convert {

namespace {

using Json = nlohmann::json;

// A header larger than this is not a real checkpoint (the largest seen are a few MB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

struct DtypeInfo {
  StDtype dtype;
  std::string_view name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {StDtype::kBool, "BOOL", 1},      {StDtype::kU8, "U8", 1},          {StDtype::kI8, "I8", 1},
    {StDtype::kF8E4M3, "F8_E4M3", 1}, {StDtype::kF8E5M2, "F8_E5M2", 1}, {StDtype::kI16, "I16", 2},
    {StDtype::kU16, "U16", 2},        {StDtype::kF16, "F16", 2},        {StDtype::kBF16, "BF16", 2},
    {StDtype::kI32, "I32", 4},        {StDtype::kU32, "U32", 4},        {StDtype::kF32, "F32", 4},
    {StDtype::kI64, "I64", 8},        {StDtype::kU64, "U64", 8},        {StDtype::kF64, "F64", 8},
};

const DtypeInfo& dtype_info(StDtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  ARBOR_CHECK(false) << "unknown safetensors dtype " << static_cast<int>(dtype);
  return kDtypes[0];
}

// Parses one tensor entry of the header; `buffer_size` is the size of the byte buffer.
Result<StTensor> parse_entry(const std::string& key, const Json& entry,
                             std::span<const uint8_t> buffer) {
  const uint64_t buffer_size = buffer.size();
  if (!entry.is_object()) return data_loss("tensor '", key, "': entry is not a JSON object");
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return data_loss("tensor '", key, "': missing or non-string \"dtype\"");
  }
  StTensor t;
  t.name = key;
  auto dtype = parse_st_dtype(dtype_it->get<std::string>());
  if (!dtype.ok()) return dtype.status().with_context(str_cat("tensor '", key, "'"));
  t.dtype = *dtype;
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return data_loss("tensor '", key, "': missing or non-array \"shape\"");
  }
  uint64_t elements = 1;
  for (const auto& d : *shape_it) {
    if (!d.is_number_unsigned())
      return data_loss("tensor '", key, "': shape entry ", d.dump(),
                       " is not a non-negative integer");
    const uint64_t v = d.get<uint64_t>();
    if (v > (uint64_t{1} << 40) || (v != 0 && elements > (uint64_t{1} << 60) / v)) {
      return data_loss("tensor '", key, "': shape ", shape_it->dump(), " overflows");
    }
    elements *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return data_loss("tensor '", key, "': \"data_offsets\" must be two non-negative integers");
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end)
    return data_loss("tensor '", key, "': data_offsets [", begin, ", ", end, "] are reversed");
  if (end > buffer_size) {
    return data_loss("tensor '", key, "': data_offsets end ", end, " is past the end of the ",
                     buffer_size, "-byte data buffer");
  }
  const uint64_t want = elements * st_dtype_size(t.dtype);
  if (end - begin != want) {
    return data_loss("tensor '", key, "': shape ", shape_it->dump(), " of ", st_dtype_name(t.dtype),
                     " needs ", want, " bytes but data_offsets [", begin, ", ", end, "] hold ",
                     end - begin);
  }
  t.bytes = buffer.subspan(begin, end - begin);
  return t;
}

Status check_no_overlap(const std::vector<StTensor>& tensors, const uint8_t* buffer) {
  std::vector<const StTensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const StTensor* a, const StTensor* b) { return a->bytes.data() < b->bytes.data(); });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto* prev = order[i - 1];
    const auto* cur = order[i];
    if (prev->bytes.empty() || cur->bytes.empty()) continue;
    if (prev->bytes.data() + prev->bytes.size() > cur->bytes.data()) {
      const auto begin_of = [buffer](const StTensor* t) { return t->bytes.data() - buffer; };
      return data_loss("tensors '", prev->name, "' [", begin_of(prev), ", ",
                       begin_of(prev) + static_cast<ptrdiff_t>(prev->bytes.size()), ") and '",
                       cur->name, "' [", begin_of(cur), ", ...) overlap");
    }
  }
  return ok_status();
}

Result<Json> parse_header_json(std::span<const uint8_t> bytes, uint64_t* header_len) {
  if (bytes.size() < 8)
    return data_loss("file has ", bytes.size(), " bytes, fewer than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return data_loss("header length ", n, " exceeds the ", bytes.size() - 8,
                     " bytes after the length field");
  }
  *header_len = n;
  Json header = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(n),
                            nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return data_loss("header (", n, " bytes) is not valid JSON");
  if (!header.is_object()) return data_loss("header is not a JSON object");
  return header;
}

Status parse_metadata(const Json& entry, std::map<std::string, std::string>* out) {
  if (!entry.is_object()) return data_loss("\"__metadata__\" is not a JSON object");
  for (const auto& [k, v] : entry.items()) {
    if (!v.is_string()) return data_loss("\"__metadata__\" value for '", k, "' is not a string");
    (*out)[k] = v.get<std::string>();
  }
  return ok_status();
}

}  // namespace

std::string_view st_dtype_name(StDtype dtype) { return dtype_info(dtype).name; }
size_t st_dtype_size(StDtype dtype) { return dtype_info(dtype).size; }

Result<StDtype> parse_st_dtype(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  return data_loss("unknown safetensors dtype \"", name, "\"");
}

int64_t StTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<SafetensorsFile> SafetensorsFile::parse(std::span<const uint8_t> bytes,
                                               const std::string& name) {
  SafetensorsFile f;
  f.path_ = std::make_unique<std::string>(name);
  uint64_t header_len = 0;
  auto header = parse_header_json(bytes, &header_len);
  if (!header.ok()) return header.status().with_context(name);
  const auto buffer = bytes.subspan(8 + header_len);
  for (const auto& [key, entry] : header->items()) {
    if (key == "__metadata__") {
      auto st = parse_metadata(entry, &f.metadata_);
      if (!st.ok()) return st.with_context(name);
      continue;
    }
    auto t = parse_entry(key, entry, buffer);
    if (!t.ok()) return t.status().with_context(name);
    t->file = f.path_.get();
    f.tensors_.push_back(std::move(*t));
  }
  auto st = check_no_overlap(f.tensors_, buffer.data());
  if (!st.ok()) return st.with_context(name);
  return f;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  ARBOR_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  auto mapping = std::make_shared<MappedFile>(std::move(mapped));
  ARBOR_ASSIGN_OR_RETURN(SafetensorsFile f, parse(mapping->bytes(), path));
  f.mapping_ = std::move(mapping);
  return f;
}

const StTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

// Reads the index's weight_map: tensor name -> shard file name.
Result<std::map<std::string, std::string>> read_index(const std::string& path) {
  ARBOR_ASSIGN_OR_RETURN(std::string text, read_file(path));
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) return data_loss(path, ": not a JSON object");
  const auto it = index.find("weight_map");
  if (it == index.end() || !it->is_object())
    return data_loss(path, ": missing \"weight_map\" object");
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : it->items()) {
    if (!file.is_string())
      return data_loss(path, ": weight_map entry '", name, "' is not a string");
    const std::string shard = file.get<std::string>();
    if (shard.find('/') != std::string::npos || shard == "..") {
      return data_loss(path, ": weight_map entry '", name, "' names '", shard,
                       "' outside the directory");
    }
    map[name] = shard;
  }
  if (map.empty()) return data_loss(path, ": weight_map is empty");
  return map;
}

}  // namespace

Result<SafetensorsModel> SafetensorsModel::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsModel model;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shard_names;
  if (fs::exists(index_path)) {
    ARBOR_ASSIGN_OR_RETURN(weight_map, read_index(index_path.string()));
    for (const auto& [name, shard] : weight_map) shard_names.insert(shard);
  } else if (fs::exists(single_path)) {
    shard_names.insert("model.safetensors");
  } else {
    return not_found(dir, ": neither model.safetensors nor model.safetensors.index.json exists");
  }
  model.files_.reserve(shard_names.size());
  for (const auto& shard : shard_names) {
    ARBOR_ASSIGN_OR_RETURN(SafetensorsFile f,
                           SafetensorsFile::open((fs::path(dir) / shard).string()));
    model.files_.push_back(std::move(f));
  }
  for (const auto& f : model.files_) {
    const std::string shard = fs::path(f.path()).filename().string();
    for (const auto& t : f.tensors()) {
      if (!weight_map.empty()) {
        const auto it = weight_map.find(t.name);
        if (it == weight_map.end() || it->second != shard) {
          return data_loss(f.path(), ": tensor '", t.name,
                           "' is not mapped to this shard by the index");
        }
      }
      if (!model.by_name_.emplace(t.name, &t).second) {
        return data_loss(f.path(), ": tensor '", t.name, "' also appears in another shard");
      }
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!model.by_name_.contains(name)) {
      return data_loss(index_path.string(), ": tensor '", name, "' is mapped to ", shard,
                       " but that file does not contain it");
    }
  }
  return model;
}

const StTensor* SafetensorsModel::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const StTensor*> SafetensorsModel::tensors() const {
  std::vector<const StTensor*> out;
  for (const auto& [name, t] : by_name_) out.push_back(t);
  return out;
}

std::map<std::string, std::string> SafetensorsModel::metadata() const {
  std::map<std::string, std::string> out;
  for (const auto& f : files_) out.insert(f.metadata().begin(), f.metadata().end());
  return out;
}

}  // namespace arbor::convert
