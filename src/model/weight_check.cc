#include "model/weight_check.h"

#include <cmath>
#include <vector>

#include "base/progress.h"
#include "gguf/quants.h"

namespace arbor::model {

Status check_finite_tensor(const gguf::GgufFile& file, const gguf::TensorInfo& t) {
  if (t.dims.empty() || t.num_elements() == 0) return ok_status();
  const int64_t cols = t.dims[0];
  const int64_t rows = t.num_elements() / cols;
  const size_t row_bytes = t.size_bytes / static_cast<size_t>(rows);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    ARBOR_RETURN_IF_ERROR(gguf::dequantize_row(t.type, t.data + static_cast<size_t>(r) * row_bytes,
                                               row.data(), cols));
    for (int64_t c = 0; c < cols; ++c) {
      if (std::isfinite(row[c])) continue;
      return invalid_argument(file.name(), ": tensor ", t.name, " (", gguf::ggml_type_name(t.type),
                              ") holds a non-finite weight (", row[c], ") at row ", r, ", column ",
                              c, "; the model cannot produce valid logits");
    }
  }
  return ok_status();
}

Status check_all_weights(const gguf::GgufFile& file) {
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file.tensors()) total += t.size_bytes;
  ProgressBar bar("checking weights", total, "B");
  for (const gguf::TensorInfo& t : file.tensors()) {
    ARBOR_RETURN_IF_ERROR(check_finite_tensor(file, t));
    bar.add(t.size_bytes);
  }
  bar.finish();
  return ok_status();
}

}  // namespace arbor::model
