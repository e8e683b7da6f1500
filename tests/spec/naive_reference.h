// Plain reference implementations of the proposers' documented semantics for the tests:
// brute-force scans over the tokens, no indexes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace arbor::spec::naive {

// NgramProposer: longest n first, the latest earlier occurrence, overlap copy.
inline std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int32_t min_n,
                                        int32_t max_n, int32_t max_tokens) {
  std::vector<int32_t> out;
  const auto len = static_cast<int32_t>(tokens.size());
  if (max_tokens <= 0) return out;
  for (int32_t n = max_n; n >= min_n; --n) {
    for (int32_t end = len - 1; end >= n; --end) {
      if (!std::equal(tokens.begin() + (end - n), tokens.begin() + end, tokens.end() - n)) {
        continue;
      }
      for (int32_t j = 0; j < max_tokens; ++j) {
        out.push_back(end + j < len ? tokens[end + j] : out[j - (len - end)]);
      }
      return out;
    }
  }
  return out;
}

using Sequences = std::vector<std::vector<int32_t>>;

// Occurrences of s in the sequences (the suffix trie's count), for |s| <= max_depth.
inline int64_t count(const Sequences& seqs, std::span<const int32_t> s) {
  int64_t c = 0;
  for (const std::vector<int32_t>& q : seqs) {
    for (size_t i = 0; i + s.size() <= q.size(); ++i) {
      if (std::equal(s.begin(), s.end(), q.begin() + i)) ++c;
    }
  }
  return c;
}

struct SuffixParams {
  int32_t max_depth;
  double max_spec_factor;
  double max_spec_offset;
  double min_token_prob;
  int32_t vocab_size;  // tokens are in [0, vocab_size)
};

// SuffixTrie::continue_greedy by counting.
inline double continue_greedy(const Sequences& seqs, std::vector<int32_t> s, int32_t max_tokens,
                              const SuffixParams& p, std::vector<int32_t>& out) {
  out.clear();
  double prob = 1.0;
  double score = 0.0;
  while (static_cast<int32_t>(out.size()) < max_tokens &&
         static_cast<int32_t>(s.size()) < p.max_depth) {
    const int64_t c = count(seqs, s);
    int32_t best_token = -1;
    int64_t best_count = 0;
    for (int32_t t = 0; t < p.vocab_size; ++t) {
      s.push_back(t);
      const int64_t ct = count(seqs, s);
      s.pop_back();
      if (ct > best_count) {
        best_count = ct;
        best_token = t;
      }
    }
    if (best_count == 0) break;
    const double ratio = static_cast<double>(best_count) / static_cast<double>(c);
    if (prob * ratio < p.min_token_prob) break;
    prob *= ratio;
    score += prob;
    out.push_back(best_token);
    s.push_back(best_token);
  }
  return score;
}

// SuffixProposer's chain draft: every match length of the context in its own tokens, then in
// the global sequences, longer first; the strictly highest score wins.
inline std::vector<int32_t> suffix_draft(std::span<const int32_t> context, const Sequences& global,
                                         int32_t max_tokens, const SuffixParams& p) {
  std::vector<int32_t> best;
  double best_score = 0.0;
  if (max_tokens <= 0) return best;
  const Sequences own{std::vector<int32_t>(context.begin(), context.end())};
  const auto n = static_cast<int32_t>(context.size());
  for (const Sequences* seqs : {&own, &global}) {
    int32_t longest = 0;
    while (longest < std::min(p.max_depth, n) && count(*seqs, context.last(longest + 1)) > 0) {
      ++longest;
    }
    for (int32_t m = longest; m >= 1; --m) {
      const double cap = std::floor(p.max_spec_factor * m + p.max_spec_offset);
      const auto limit = static_cast<int32_t>(std::min<double>(max_tokens, cap));
      std::vector<int32_t> draft;
      const auto suffix = context.last(m);
      const double score = continue_greedy(
          *seqs, std::vector<int32_t>(suffix.begin(), suffix.end()), limit, p, draft);
      if (score > best_score) {
        best_score = score;
        best = draft;
      }
    }
  }
  return best;
}

// The global trie's retained sequences under SuffixProposer::forget's rules.
struct GlobalSequences {
  int64_t budget;
  bool index_prompts;
  Sequences seqs;  // oldest first
  int64_t num_tokens = 0;

  void add(std::span<const int32_t> tokens, int32_t num_prompt_tokens) {
    if (budget == 0) return;
    std::span<const int32_t> s = index_prompts ? tokens : tokens.subspan(num_prompt_tokens);
    if (static_cast<int64_t>(s.size()) > budget) s = s.last(static_cast<size_t>(budget));
    if (s.empty()) return;
    while (num_tokens + static_cast<int64_t>(s.size()) > budget) {
      num_tokens -= static_cast<int64_t>(seqs.front().size());
      seqs.erase(seqs.begin());
    }
    seqs.emplace_back(s.begin(), s.end());
    num_tokens += static_cast<int64_t>(s.size());
  }
};

}  // namespace arbor::spec::naive
