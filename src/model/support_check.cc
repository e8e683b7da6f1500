#include "model/support_check.h"

#include <map>

#include "kernels/matmul.h"
#include "model/arch.h"
#include "model/llama_model.h"

namespace arbor::model {

std::vector<std::string> unsupported_features(const gguf::GgufFile& file) {
  std::vector<std::string> problems;
  Result<std::string> arch = file.get_string("general.architecture");
  if (!arch.ok()) {
    problems.push_back(arch.status().message());
  } else if (find_arch(*arch) == nullptr) {
    problems.push_back(str_cat("architecture \"", *arch, "\" (arbor runs: ",
                               supported_arch_names(), ")"));
  }
  std::map<gguf::GgmlType, std::pair<int, std::string>> types;  // count, first tensor
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.dims.size() < 2 || kernels::matmul_supported(t.type)) continue;
    auto& [count, first] = types[t.type];
    if (count++ == 0) first = t.name;
  }
  for (const auto& [type, c] : types) {
    problems.push_back(str_cat("weight type ", gguf::ggml_type_name(type), " (", c.first,
                               " tensors, e.g. ", c.second, ")"));
  }
  if (!problems.empty()) return problems;
  gguf::GgufFile copy = file;  // shares the mapping
  auto model = LlamaModel::from_file(std::move(copy), {.pack_for_cpu = false});
  if (!model.ok()) problems.push_back(model.status().message());
  return problems;
}

}  // namespace arbor::model
