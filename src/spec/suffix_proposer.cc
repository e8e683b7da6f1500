#include "spec/suffix_proposer.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace arbor::spec {

SuffixProposer::SuffixProposer(SuffixProposerOptions options)
    : options_(options), global_(std::max(options.max_depth, 1)) {
  ARBOR_CHECK_GE(options_.max_depth, 1);
  ARBOR_CHECK_GE(options_.num_speculative_tokens, 0);
  ARBOR_CHECK(options_.max_spec_factor >= 0.0 && options_.max_spec_offset >= 0.0)
      << "max_spec_factor " << options_.max_spec_factor << ", max_spec_offset "
      << options_.max_spec_offset;
  ARBOR_CHECK(options_.min_token_prob >= 0.0 && options_.min_token_prob <= 1.0)
      << "min_token_prob " << options_.min_token_prob;
  ARBOR_CHECK_GE(options_.global_max_tokens, 0);
}

const SuffixTrie* SuffixProposer::request_trie(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SuffixTrie& SuffixProposer::sync(const DraftRequest& request) {
  std::unique_ptr<SuffixTrie>& trie = requests_[request.request_id];
  if (trie == nullptr) {
    trie = std::make_unique<SuffixTrie>(options_.max_depth);
    trie->open_sequence();
  }
  const std::span<const int32_t> seen_tokens = trie->open_tokens();
  const size_t seen = seen_tokens.size();
  ARBOR_CHECK_GE(request.token_ids.size(), seen)
      << "request " << request.request_id << ": committed tokens shrank without forget()";
  ARBOR_CHECK(seen == 0 || request.token_ids[seen - 1] == seen_tokens[seen - 1])
      << "request " << request.request_id << ": committed tokens changed without forget()";
  for (int32_t t : request.token_ids.subspan(seen)) trie->append(t);
  return *trie;
}

int32_t SuffixProposer::max_tokens_for_match(int32_t m, int32_t max_tokens) const {
  const double cap = std::floor(options_.max_spec_factor * m + options_.max_spec_offset);
  return static_cast<int32_t>(std::min(static_cast<double>(max_tokens), cap));
}

template <typename Visit>
void SuffixProposer::for_each_match(const SuffixTrie& own, std::span<const int32_t> context,
                                    Visit&& visit) {
  const auto n = static_cast<int32_t>(context.size());
  for (int32_t m = std::min(options_.max_depth, n); m >= 1; --m) {
    if (!visit(own, own.open_suffix(m), m)) break;
  }
  if (global_.num_tokens() == 0) return;
  // A string is in the trie only if its suffixes are, so the matches are m = 1..M.
  global_matches_.clear();
  for (int32_t m = 1; m <= std::min(options_.max_depth, n); ++m) {
    const std::optional<SuffixTrie::Position> p = global_.find(context.last(m));
    if (!p) break;
    global_matches_.push_back(*p);
  }
  for (auto m = static_cast<int32_t>(global_matches_.size()); m >= 1; --m) {
    if (!visit(global_, global_matches_[m - 1], m)) break;
  }
}

double SuffixProposer::best_draft(const SuffixTrie& own, const DraftRequest& request,
                                  std::vector<int32_t>& out) {
  const int32_t max_tokens = std::min(options_.num_speculative_tokens, request.max_depth);
  double best = 0.0;
  out.clear();
  for_each_match(
      own, request.token_ids, [&](const SuffixTrie& trie, SuffixTrie::Position p, int32_t m) {
        const int32_t limit = max_tokens_for_match(m, max_tokens);
        // A draft scores at most its length; shorter matches have no larger cap.
        if (limit <= best) return false;
        const double score = trie.continue_greedy(p, limit, options_.min_token_prob, scratch_);
        if (score > best) {
          best = score;
          out = scratch_;
        }
        return true;
      });
  return best;
}

void SuffixProposer::candidates(const DraftRequest& request, int32_t max_branches,
                                std::vector<DraftCandidate>& out) {
  out.clear();
  const int32_t max_tokens = std::min(options_.num_speculative_tokens, request.max_depth);
  if (max_branches <= 0 || max_tokens <= 0) return;
  const SuffixTrie& own = sync(request);
  if (max_branches == 1) {
    DraftCandidate best;
    best.score = best_draft(own, request, best.token_ids);
    if (!best.token_ids.empty()) out.push_back(std::move(best));
    return;
  }
  std::vector<DraftCandidate> all;
  for_each_match(
      own, request.token_ids, [&](const SuffixTrie& trie, SuffixTrie::Position p, int32_t m) {
        const int32_t limit = max_tokens_for_match(m, max_tokens);
        if (limit <= 0) return false;
        const double score = trie.continue_greedy(p, limit, options_.min_token_prob, scratch_);
        if (!scratch_.empty()) all.push_back(DraftCandidate{scratch_, score});
        return true;
      });
  std::stable_sort(all.begin(), all.end(), [](const DraftCandidate& a, const DraftCandidate& b) {
    return a.score > b.score;
  });
  for (DraftCandidate& c : all) {
    const bool seen = std::any_of(out.begin(), out.end(), [&](const DraftCandidate& o) {
      return o.token_ids == c.token_ids;
    });
    if (seen) continue;
    out.push_back(std::move(c));
    if (static_cast<int32_t>(out.size()) == max_branches) break;
  }
}

void SuffixProposer::forget(RequestId id, std::span<const int32_t> token_ids,
                            int32_t num_prompt_tokens) {
  requests_.erase(id);
  const int64_t budget = options_.global_max_tokens;
  if (budget == 0) return;
  ARBOR_CHECK(0 <= num_prompt_tokens && static_cast<size_t>(num_prompt_tokens) <= token_ids.size())
      << "num_prompt_tokens " << num_prompt_tokens << " of " << token_ids.size() << " tokens";
  std::span<const int32_t> seq =
      options_.global_index_prompts ? token_ids : token_ids.subspan(num_prompt_tokens);
  if (static_cast<int64_t>(seq.size()) > budget) seq = seq.last(static_cast<size_t>(budget));
  if (seq.empty()) return;
  while (global_.num_tokens() + static_cast<int64_t>(seq.size()) > budget) {
    global_.remove_oldest_sequence();
  }
  global_.open_sequence();
  for (int32_t t : seq) global_.append(t);
  global_.close_sequence();
}

}  // namespace arbor::spec
