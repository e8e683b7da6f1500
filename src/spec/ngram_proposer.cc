#include "spec/ngram_proposer.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::spec {

NgramIndex::NgramIndex(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {
  ARBOR_CHECK(1 <= min_n && min_n <= max_n) << "min_n " << min_n << ", max_n " << max_n;
}

size_t NgramIndex::memory_bytes() const {
  return tokens_.capacity() * sizeof(int32_t) + latest_end_.memory_bytes();
}

uint64_t NgramIndex::key(int32_t end, int32_t n) const {
  uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(n + 1);
  for (int32_t i = end - n; i < end; ++i) {
    h ^= static_cast<uint32_t>(tokens_[i]);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h == FlatMap::kEmptyKey ? h - 1 : h;
}

void NgramIndex::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    // The n-grams ending at the old end gain a following token: they become matchable.
    const int32_t end = num_tokens();
    for (int32_t n = min_n_; n <= std::min(max_n_, end); ++n) {
      latest_end_.insert_or_assign(key(end, n), end);
    }
    tokens_.push_back(t);
  }
}

int32_t NgramIndex::latest_match_end(int32_t n) const {
  const int32_t len = num_tokens();
  if (n < min_n_ || n > max_n_ || len <= n) return -1;
  const int32_t* end = latest_end_.find(key(len, n));
  if (end == nullptr) return -1;
  const bool same =
      std::equal(tokens_.begin() + (*end - n), tokens_.begin() + *end, tokens_.end() - n);
  return same ? *end : -1;
}

void NgramIndex::continuation(int32_t n, int32_t max_tokens, std::vector<int32_t>& out) const {
  out.clear();
  const int32_t end = max_tokens > 0 ? latest_match_end(n) : -1;
  if (end < 0) return;
  const int32_t len = num_tokens();
  const int32_t period = len - end;  // >= 1: the match ends before the sequence does
  for (int32_t j = 0; j < max_tokens; ++j) {
    out.push_back(end + j < len ? tokens_[end + j] : out[j - period]);
  }
}

void NgramIndex::propose(int32_t max_tokens, std::vector<int32_t>& out) const {
  out.clear();
  for (int32_t n = max_n_; n >= min_n_ && out.empty(); --n) continuation(n, max_tokens, out);
}

NgramProposer::NgramProposer(NgramProposerOptions options) : options_(options) {
  ARBOR_CHECK(1 <= options_.min_n && options_.min_n <= options_.max_n && options_.max_n <= 32)
      << "ngram proposer: min_n " << options_.min_n << ", max_n " << options_.max_n;
  ARBOR_CHECK_GE(options_.num_speculative_tokens, 0);
}

NgramIndex& NgramProposer::sync(const DraftRequest& request) {
  auto it = indexes_.try_emplace(request.request_id, options_.min_n, options_.max_n).first;
  NgramIndex& index = it->second;
  const auto seen = static_cast<size_t>(index.num_tokens());
  ARBOR_CHECK_GE(request.token_ids.size(), seen)
      << "request " << request.request_id << ": committed tokens shrank without forget()";
  ARBOR_CHECK(seen == 0 || request.token_ids[seen - 1] == index.tokens()[seen - 1])
      << "request " << request.request_id << ": committed tokens changed without forget()";
  index.append(request.token_ids.subspan(seen));
  return index;
}

void NgramProposer::candidates(const DraftRequest& request, int32_t max_branches,
                               std::vector<DraftCandidate>& out) {
  out.clear();
  const int32_t max_tokens = std::min(options_.num_speculative_tokens, request.max_depth);
  if (max_branches <= 0 || max_tokens <= 0) return;
  const NgramIndex& index = sync(request);
  std::vector<int32_t> draft;
  for (int32_t n = options_.max_n; n >= options_.min_n; --n) {
    index.continuation(n, max_tokens, draft);
    if (draft.empty()) continue;
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const DraftCandidate& c) { return c.token_ids == draft; });
    if (seen) continue;
    out.push_back(DraftCandidate{draft, static_cast<double>(n)});
    if (static_cast<int32_t>(out.size()) == max_branches) return;
  }
}

void NgramProposer::forget(RequestId id, std::span<const int32_t> token_ids,
                           int32_t num_prompt_tokens) {
  indexes_.erase(id);
}

}  // namespace arbor::spec
