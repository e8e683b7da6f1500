#include "spec/ngram_proposer.h"

#include <algorithm>

#include "base/status.h"

namespace arbor::spec {

NgramProposer::NgramProposer(NgramOptions options) : options_(options) {
  ARBOR_CHECK(options_.min_n >= 1 && options_.max_n >= options_.min_n)
      << "n-gram sizes " << options_.min_n << ".." << options_.max_n;
}

uint64_t NgramProposer::hash(std::span<const int32_t> ngram) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ ngram.size();
  for (int32_t t : ngram) {
    h ^= static_cast<uint32_t>(t);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

// Indexes every n-gram that ends (exclusive) at a position in (num_indexed, num_tokens - 1]:
// all but the final n-gram, which is the query and must find an *earlier* occurrence.
void NgramProposer::index(State& st, std::span<const int32_t> tokens) {
  const auto n_tokens = static_cast<int64_t>(tokens.size());
  for (int64_t end = std::max<int64_t>(st.num_indexed, 1); end < n_tokens; ++end) {
    for (int32_t n = options_.min_n; n <= options_.max_n; ++n) {
      if (end < n) break;
      st.last_end[n - options_.min_n][hash(tokens.subspan(end - n, n))] = end;
    }
  }
  st.num_indexed = std::max<int64_t>(st.num_indexed, n_tokens);
}

std::vector<int32_t> NgramProposer::propose_one(const ProposalRequest& r) {
  State& st = states_[r.request_id];
  if (st.last_end.empty()) st.last_end.resize(options_.max_n - options_.min_n + 1);
  index(st, r.token_ids);
  std::vector<int32_t> out;
  const auto n_tokens = static_cast<int64_t>(r.token_ids.size());
  if (r.max_num_tokens <= 0) return out;
  for (int32_t n = std::min<int64_t>(options_.max_n, n_tokens - 1); n >= options_.min_n; --n) {
    const std::span<const int32_t> suffix = r.token_ids.subspan(n_tokens - n, n);
    const auto& map = st.last_end[n - options_.min_n];
    auto it = map.find(hash(suffix));
    if (it == map.end()) continue;
    const int64_t end = it->second;
    if (!std::equal(suffix.begin(), suffix.end(), r.token_ids.begin() + (end - n))) continue;
    const int64_t count = std::min<int64_t>(r.max_num_tokens, n_tokens - end);
    out.assign(r.token_ids.begin() + end, r.token_ids.begin() + end + count);
    return out;
  }
  return out;
}

void NgramProposer::propose(std::span<const ProposalRequest> requests,
                            std::vector<std::vector<int32_t>>& out) {
  out.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) out[i] = propose_one(requests[i]);
}

void NgramProposer::forget(RequestId id, std::span<const int32_t>, int32_t) {
  states_.erase(id);
}

}  // namespace arbor::spec
