#include "router/prefix_index.h"

namespace arbor::router {

std::vector<kv::BlockHash> prompt_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                               std::string_view cache_salt) {
  std::vector<kv::BlockHash> chain;
  if (block_size <= 0) return chain;
  const size_t blocks = tokens.size() / static_cast<size_t>(block_size);
  chain.reserve(blocks);
  kv::BlockHash parent = kv::kRootParentHash;
  for (size_t i = 0; i < blocks; ++i) {
    parent = kv::hash_block_tokens(
        parent, tokens.subspan(i * static_cast<size_t>(block_size), static_cast<size_t>(block_size)),
        kv::BlockHashExtraKeys{.cache_salt = cache_salt}, i == 0);
    chain.push_back(parent);
  }
  return chain;
}

Status CachedBlockSet::apply(std::span<const kv::KvEvent> events) {
  for (const kv::KvEvent& e : events) {
    if (e.stored) {
      if (!hashes_.insert(e.hash).second) {
        return data_loss("the replica stored a block hash it had already stored");
      }
      if (max_blocks_ > 0 && size() > max_blocks_) {
        return data_loss("the replica's cache would hold ", size(), " blocks, its pool has ",
                         max_blocks_);
      }
    } else if (hashes_.erase(e.hash) != 1) {
      return data_loss("the replica removed a block hash it had not stored");
    }
  }
  return ok_status();
}

int64_t CachedBlockSet::matched(std::span<const kv::BlockHash> chain) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) && hashes_.contains(chain[static_cast<size_t>(n)])) {
    ++n;
  }
  return n;
}

void RoutedBlockSet::add(std::span<const kv::BlockHash> chain) {
  for (const kv::BlockHash& h : chain) {
    auto it = where_.find(h);
    if (it != where_.end()) {
      order_.splice(order_.end(), order_, it->second);
      continue;
    }
    order_.push_back(h);
    where_.emplace(h, std::prev(order_.end()));
  }
  while (static_cast<int64_t>(where_.size()) > max_blocks_ && !order_.empty()) {
    where_.erase(order_.front());
    order_.pop_front();
  }
}

int64_t RoutedBlockSet::matched(std::span<const kv::BlockHash> chain) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) && where_.contains(chain[static_cast<size_t>(n)])) {
    ++n;
  }
  return n;
}

}  // namespace arbor::router
