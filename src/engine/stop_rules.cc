#include "engine/stop_rules.h"

#include <algorithm>

namespace arbor::engine {

std::vector<int32_t> default_stop_token_ids(const tokenizer::Tokenizer& tokenizer) {
  std::vector<int32_t> ids = tokenizer.eog_ids();
  if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace arbor::engine
