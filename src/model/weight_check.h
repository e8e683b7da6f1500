// Finite-weight checks. A single NaN or Inf in a weight poisons every logit that depends on it;
// the engine then fails the requests that meet it (non-finite logits, HTTP 500), but a model
// that cannot be right is better refused at load, naming the tensor.
//
//   at every load (LlamaModel::from_file): the F32 vectors (norms, biases) and the classifier;
//   `arbor serve --check-weights` / check_all_weights: every tensor, with progress.
#pragma once

#include "base/status.h"
#include "gguf/gguf.h"

namespace arbor::model {

// ok, or kInvalidArgument naming the tensor, the row and column and the value of its first
// non-finite weight. Decodes the tensor row by row with gguf::dequantize_row (every type it
// reads; the integer codes of quantised types are finite, their scales may not be).
Status check_finite_tensor(const gguf::GgufFile& file, const gguf::TensorInfo& t);

// Every tensor of `file`, with a progress bar on stderr.
Status check_all_weights(const gguf::GgufFile& file);

}  // namespace arbor::model
