// `arbor gguf-info FILE [--json] [--max-items N]`: a GGUF file's header, how arbor reads its
// tokenizer (model, pre-tokenizer, size, or why arbor cannot load it), every metadata key with
// its type and value (long arrays abbreviated to their first items), the tensor table, totals
// per type, and whether arbor runs the file (model + tokenizer) or what it lacks.
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "gguf/gguf.h"
#include "model/llama_model.h"
#include "model/support_check.h"
#include "tokenizer/tokenizer.h"

namespace arbor::cli {
namespace cmd_gguf_info {  // named, not anonymous: the commands share unity sources

using gguf::GgufFile;
using gguf::Value;
using gguf::ValueType;

struct Options {
  std::string path;
  bool json = false;
  size_t max_items = 8;
};

std::string type_string(const Value& v) {
  if (v.type != ValueType::kArray) return std::string(gguf::value_type_name(v.type));
  const auto& a = std::get<gguf::Array>(v.data);
  return str_cat("array[", gguf::value_type_name(a.elem_type), "; ", a.items.size(), "]");
}

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += str_cat(i ? ", " : "", dims[i]);
  return out + "]";
}

struct TypeTotal {
  uint64_t tensors = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
};

std::map<std::string, TypeTotal> totals_by_type(const GgufFile& f) {
  std::map<std::string, TypeTotal> totals;
  for (const auto& t : f.tensors()) {
    TypeTotal& tt = totals[std::string(gguf::ggml_type_name(t.type))];
    ++tt.tensors;
    tt.elements += static_cast<uint64_t>(t.num_elements());
    tt.bytes += t.size_bytes;
  }
  return totals;
}

// The tokenizer as arbor loads it; nullopt when the file has no tokenizer.ggml.model.
std::optional<Result<std::unique_ptr<tokenizer::Tokenizer>>> load_tokenizer(const GgufFile& f) {
  if (f.find("tokenizer.ggml.model") == nullptr) return std::nullopt;
  return tokenizer::Tokenizer::from_gguf(f);
}

void print_text(const GgufFile& f, size_t max_items) {
  std::printf("file: %s (%zu bytes)\n", f.name().c_str(), f.file_bytes().size());
  std::printf("GGUF version %u, alignment %llu, %zu metadata keys, %zu tensors, data at %llu\n",
              f.version(), static_cast<unsigned long long>(f.alignment()), f.metadata().size(),
              f.tensors().size(), static_cast<unsigned long long>(f.data_offset()));
  if (const auto tok = load_tokenizer(f)) {
    std::printf("tokenizer: %s\n", tok->ok() ? (**tok)->summary().c_str()
                                             : ("not loadable by arbor: " +
                                                tok->status().to_string()).c_str());
  }
  std::printf("\nmetadata:\n");
  for (const auto& kv : f.metadata()) {
    std::printf("  %-40s %-18s %s\n", kv.key.c_str(), type_string(kv.value).c_str(),
                gguf::value_to_string(kv.value, max_items).c_str());
  }
  std::printf("\ntensors:\n  %5s %-40s %-8s %-24s %12s %12s\n", "#", "name", "type", "dims",
              "offset", "bytes");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& t = f.tensors()[i];
    std::printf("  %5zu %-40s %-8s %-24s %12llu %12llu\n", i, t.name.c_str(),
                std::string(gguf::ggml_type_name(t.type)).c_str(), dims_string(t.dims).c_str(),
                static_cast<unsigned long long>(t.offset),
                static_cast<unsigned long long>(t.size_bytes));
  }
  std::printf("\ntotals:\n");
  TypeTotal all;
  for (const auto& [name, tt] : totals_by_type(f)) {
    std::printf("  %-8s %6llu tensors %14llu elements %14llu bytes\n", name.c_str(),
                static_cast<unsigned long long>(tt.tensors),
                static_cast<unsigned long long>(tt.elements),
                static_cast<unsigned long long>(tt.bytes));
    all.tensors += tt.tensors;
    all.elements += tt.elements;
    all.bytes += tt.bytes;
  }
  std::printf("  %-8s %6llu tensors %14llu elements %14llu bytes\n", "all",
              static_cast<unsigned long long>(all.tensors),
              static_cast<unsigned long long>(all.elements),
              static_cast<unsigned long long>(all.bytes));
}

// What arbor lacks to run the file (empty: it runs), and the model's summary when it loads.
struct Support {
  std::vector<std::string> missing;
  std::string summary;
};

Support check_support(const GgufFile& f) {
  Support s;
  s.missing = model::unsupported_features(f);
  if (auto tok = tokenizer::Tokenizer::from_gguf(f); !tok.ok()) {
    s.missing.push_back("tokenizer: " + tok.status().message());
  }
  if (s.missing.empty()) {
    if (auto c = model::ModelConfig::from_gguf(f); c.ok()) s.summary = c->summary();
  }
  return s;
}

void print_support(const Support& s) {
  if (s.missing.empty()) {
    std::printf("\narbor: runs this file (%s)\n", s.summary.c_str());
    return;
  }
  std::printf("\narbor: cannot run this file; it needs:\n");
  for (const std::string& m : s.missing) std::printf("  - %s\n", m.c_str());
}

nlohmann::json value_json(const Value& v, size_t max_items) {
  switch (v.type) {
    case ValueType::kUint8: return std::get<uint8_t>(v.data);
    case ValueType::kInt8: return std::get<int8_t>(v.data);
    case ValueType::kUint16: return std::get<uint16_t>(v.data);
    case ValueType::kInt16: return std::get<int16_t>(v.data);
    case ValueType::kUint32: return std::get<uint32_t>(v.data);
    case ValueType::kInt32: return std::get<int32_t>(v.data);
    case ValueType::kUint64: return std::get<uint64_t>(v.data);
    case ValueType::kInt64: return std::get<int64_t>(v.data);
    case ValueType::kFloat32: return std::get<float>(v.data);
    case ValueType::kFloat64: return std::get<double>(v.data);
    case ValueType::kBool: return std::get<bool>(v.data);
    // Invalid UTF-8 is replaced by U+FFFD when dumping (error_handler_t::replace).
    case ValueType::kString: return std::get<std::string>(v.data);
    case ValueType::kArray: {
      const auto& a = std::get<gguf::Array>(v.data);
      nlohmann::json items = nlohmann::json::array();
      for (size_t i = 0; i < a.items.size() && (max_items == 0 || i < max_items); ++i) {
        items.push_back(value_json(a.items[i], max_items));
      }
      return {{"elem_type", gguf::value_type_name(a.elem_type)},
              {"length", a.items.size()},
              {"items", std::move(items)}};
    }
  }
  return nullptr;
}

void print_json(const GgufFile& f, size_t max_items) {
  nlohmann::json j;
  j["file"] = f.name();
  j["file_bytes"] = f.file_bytes().size();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["data_offset"] = f.data_offset();
  if (const auto tok = load_tokenizer(f)) {
    if (tok->ok()) {
      const tokenizer::Tokenizer& t = ***tok;
      j["tokenizer"] = {{"summary", t.summary()},     {"model", t.model_name()},
                        {"pre", t.pre_name()},        {"vocab_size", t.vocab_size()},
                        {"bos_id", t.bos_id()},       {"eos_id", t.eos_id()},
                        {"add_bos", t.add_bos()}};
    } else {
      j["tokenizer"] = {{"error", tok->status().to_string()}};
    }
  }
  j["metadata"] = nlohmann::json::array();
  for (const auto& kv : f.metadata()) {
    j["metadata"].push_back({{"key", kv.key},
                             {"type", gguf::value_type_name(kv.value.type)},
                             {"value", value_json(kv.value, max_items)}});
  }
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : f.tensors()) {
    j["tensors"].push_back({{"name", t.name},
                            {"type", gguf::ggml_type_name(t.type)},
                            {"dims", t.dims},
                            {"offset", t.offset},
                            {"bytes", t.size_bytes}});
  }
  uint64_t bytes = 0;
  for (const auto& [name, tt] : totals_by_type(f)) {
    j["totals"]["by_type"][name] = {
        {"tensors", tt.tensors}, {"elements", tt.elements}, {"bytes", tt.bytes}};
    bytes += tt.bytes;
  }
  j["totals"]["tensors"] = f.tensors().size();
  j["totals"]["bytes"] = bytes;
  const Support s = check_support(f);
  j["arbor"] = {{"supported", s.missing.empty()}, {"missing", s.missing}};
  if (!s.summary.empty()) j["arbor"]["summary"] = s.summary;
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

Status run(const Options& opts) {
  auto file = GgufFile::open(opts.path);
  if (!file.ok()) return file.status();
  if (opts.json) {
    print_json(*file, opts.max_items);
  } else {
    print_text(*file, opts.max_items == 0 ? SIZE_MAX : opts.max_items);
    print_support(check_support(*file));
  }
  return ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "gguf-info",
      "Print a GGUF file's metadata and tensors, how arbor reads its tokenizer, and whether "
      "arbor runs it (or what it lacks)");
  auto opts = std::make_shared<Options>();
  sub->add_option("file", opts->path, "GGUF file")->required();
  sub->add_flag("--json", opts->json, "Print JSON instead of text");
  sub->add_option("--max-items", opts->max_items, "Array items shown per array (0 = all)")
      ->capture_default_str();
  sub->callback([opts] { exit_on_error(run(*opts)); });
}
ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
