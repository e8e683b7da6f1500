// What a GGUF file needs that arbor lacks: the answer `arbor gguf-info` prints, so a user learns
// every missing piece at once instead of the first load error.
#pragma once

#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace arbor::model {

// Problems that keep LlamaModel::load from running `file`, each a sentence naming what is
// missing or wrong: the architecture (with the supported list), weight types the kernels lack
// (each type once, with a count and an example tensor), then the first config or tensor error
// of a load. Empty when the model loads. Reads metadata and tensor headers only (no weights are
// checked for finiteness or packed).
std::vector<std::string> unsupported_features(const gguf::GgufFile& file);

}  // namespace arbor::model
