#include "grammar/token_masks.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <numeric>

#include "base/check.h"

namespace arbor::grammar {
namespace {

// Whole-mask cache budget per grammar.
constexpr size_t kMaxCacheBytes = size_t{64} << 20;

int32_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int32_t>(i);
}

// Ids with non-empty bytes sorted by them, and the lcp of each with the previous.
template <typename BytesOf>
void sort_by_bytes(int32_t n, BytesOf bytes_of, std::vector<int32_t>& ids,
                   std::vector<int32_t>& lcp) {
  ids.clear();
  for (int32_t i = 0; i < n; ++i) {
    if (!bytes_of(i).empty()) ids.push_back(i);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const std::string_view x = bytes_of(a), y = bytes_of(b);
    return x != y ? x < y : a < b;
  });
  lcp.assign(ids.size(), 0);
  for (size_t j = 1; j < ids.size(); ++j)
    lcp[j] = common_prefix(bytes_of(ids[j - 1]), bytes_of(ids[j]));
}

enum class Verdict : uint8_t { kAccepted, kRejected, kUncertain };

// Runs every token of `ids` (sorted by bytes, lcp as sort_by_bytes gives) from `start`, reusing
// the stack sets of the common prefix with the previous token, and calls on(id, verdict, pops).
// kUncertain: the token failed, but the bottom frame's rule could complete after one or more of
// its bytes (only with a kUnknownParent bottom); pops lists those byte counts (>= 1, increasing;
// empty for other verdicts). A token that fails at byte d decides every following token that
// shares its first d + 1 bytes.
class TokenWalk {
 public:
  template <typename BytesOf, typename On>
  void run(StackStepper& stepper, StackArena& arena, const StackSet& start,
           std::span<const int32_t> ids, std::span<const int32_t> lcp, BytesOf bytes_of, On on) {
    if (sets_.empty()) sets_.resize(1);
    sets_[0] = start;
    popped_.assign(1, 0);
    size_t valid = 1;  // sets_[0, valid) hold the previous token's prefix states
    for (size_t j = 0; j < ids.size();) {
      const std::string_view b = bytes_of(ids[j]);
      size_t d = std::min(static_cast<size_t>(lcp[j]), valid - 1);
      if (sets_.size() < b.size() + 1) sets_.resize(b.size() + 1);
      if (popped_.size() < b.size() + 1) popped_.resize(b.size() + 1);
      bool ok = true;
      for (; d < b.size(); ++d) {
        if (!stepper.step(arena, sets_[d], static_cast<uint8_t>(b[d]), sets_[d + 1])) {
          ok = false;
          break;
        }
        popped_[d + 1] = popped_[d] || sets_[d + 1].pops_unknown;
      }
      valid = d + 1;
      const Verdict v = ok           ? Verdict::kAccepted
                        : popped_[d] ? Verdict::kUncertain
                                     : Verdict::kRejected;
      pops_.clear();
      if (v == Verdict::kUncertain) {
        for (size_t i = 1; i <= d; ++i) {
          if (sets_[i].pops_unknown) pops_.push_back(static_cast<int32_t>(i));
        }
      }
      on(ids[j], v, std::span<const int32_t>(pops_));
      ++j;
      if (!ok) {
        while (j < ids.size() && static_cast<size_t>(lcp[j]) > d) {
          on(ids[j++], v, std::span<const int32_t>(pops_));
        }
      }
    }
  }

 private:
  std::vector<StackSet> sets_;
  std::vector<uint8_t> popped_;
  std::vector<int32_t> pops_;
};

thread_local TokenWalk g_walk;

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes, std::vector<int32_t> end_ids)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)) {
  std::sort(end_ids_.begin(), end_ids_.end());
  end_ids_.erase(std::unique(end_ids_.begin(), end_ids_.end()), end_ids_.end());
  for (int32_t e : end_ids_) {
    ARBOR_CHECK(e >= 0 && e < size()) << "end id " << e << " outside the vocabulary";
    bytes_[static_cast<size_t>(e)].clear();
  }
  sort_by_bytes(size(), [&](int32_t i) { return this->bytes(i); }, sorted_, lcp_);
}

TokenBitmask& TokenBitmask::operator|=(const TokenBitmask& o) {
  ARBOR_CHECK_EQ(size_, o.size_);
  for (size_t i = 0; i < words_.size(); ++i) words_[i] |= o.words_[i];
  return *this;
}

int32_t TokenBitmask::count() const {
  int32_t n = 0;
  for (uint64_t w : words_) n += std::popcount(w);
  return n;
}

bool TokenBitmask::none() const {
  return std::all_of(words_.begin(), words_.end(), [](uint64_t w) { return w == 0; });
}

void apply_mask(const TokenBitmask& mask, std::span<float> logits) {
  ARBOR_CHECK_EQ(static_cast<size_t>(mask.size()), logits.size());
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  const std::span<const uint64_t> words = mask.words();
  for (size_t w = 0; w < words.size(); ++w) {
    uint64_t off = ~words[w];
    if (off == 0) continue;
    const size_t base = w * 64;
    if (words[w] == 0 && base + 64 <= logits.size()) {  // most words of a tight mask: one fill
      std::fill_n(logits.begin() + static_cast<ptrdiff_t>(base), 64, kMinusInf);
      continue;
    }
    while (off != 0) {
      const size_t i = base + static_cast<size_t>(std::countr_zero(off));
      if (i >= logits.size()) break;
      logits[i] = kMinusInf;
      off &= off - 1;
    }
  }
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Automaton> automaton,
                                 std::shared_ptr<const TokenVocabulary> vocab)
    : automaton_(std::move(automaton)),
      vocab_(std::move(vocab)),
      states_(static_cast<size_t>(automaton_->num_states())),
      stepper_(*automaton_),
      result_(vocab_->size()) {}

void CompiledGrammar::build_state(int32_t state) {
  StateTokens& st = states_[static_cast<size_t>(state)];
  st.built = true;
  st.accepted = TokenBitmask(vocab_->size());
  scratch_arena_.clear();
  StackSet start;
  start.tops = {scratch_arena_.intern(state, kUnknownParent)};
  const TokenVocabulary& v = *vocab_;
  std::vector<std::pair<std::string_view, int32_t>> rests;  // (bytes after a pop, token)
  g_walk.run(stepper_, scratch_arena_, start, v.sorted(), v.sorted_lcp(),
             [&](int32_t id) { return v.bytes(id); },
             [&](int32_t id, Verdict verdict, std::span<const int32_t> pops) {
               if (verdict == Verdict::kAccepted) st.accepted.set(id);
               for (int32_t d : pops) {
                 rests.emplace_back(v.bytes(id).substr(static_cast<size_t>(d)), id);
               }
             });
  // Group the tokens by remainder: the caller's stack decides a remainder once for all of them.
  std::sort(rests.begin(), rests.end());
  for (size_t i = 0; i < rests.size(); ++i) {
    if (i == 0 || rests[i].first != rests[i - 1].first) {
      st.rest_lcp.push_back(st.rests.empty() ? 0 : common_prefix(st.rests.back(), rests[i].first));
      st.rests.push_back(rests[i].first);
      st.rest_begin.push_back(static_cast<int32_t>(st.rest_tokens.size()));
    }
    st.rest_tokens.push_back(rests[i].second);
  }
  st.rest_begin.push_back(static_cast<int32_t>(st.rest_tokens.size()));
  ++stats_.states_built;
}

void CompiledGrammar::compute(Matcher& matcher, TokenBitmask& out) {
  out.clear();
  const TokenVocabulary& v = *vocab_;
  const StackSet& cur = matcher.current();
  {
    std::vector<int32_t> work;
    StackSet caller;
    std::vector<int32_t> rest_ids;
    for (int32_t f : cur.tops) {
      const int32_t s = matcher.arena().state(f);
      StateTokens& st = states_[static_cast<size_t>(s)];
      if (!st.built) build_state(s);
      out |= st.accepted;
      const int32_t parent = matcher.arena().parent(f);
      if (st.rests.empty() || parent < 0) continue;  // the root completing ends the output
      // The rule of `f` completes partway through these tokens: the caller's stack (the
      // parent frame, expanded) must take the rest.
      work.assign(1, parent);
      matcher.stepper().expand(matcher.arena(), work, caller);
      rest_ids.resize(st.rests.size());
      std::iota(rest_ids.begin(), rest_ids.end(), 0);
      stats_.uncertain_checked += static_cast<int64_t>(st.rests.size());
      g_walk.run(matcher.stepper(), matcher.arena(), caller, rest_ids, st.rest_lcp,
                 [&](int32_t i) { return st.rests[static_cast<size_t>(i)]; },
                 [&](int32_t i, Verdict verdict, std::span<const int32_t>) {
                   if (verdict != Verdict::kAccepted) return;
                   for (int32_t k = st.rest_begin[static_cast<size_t>(i)];
                        k < st.rest_begin[static_cast<size_t>(i) + 1]; ++k) {
                     out.set(st.rest_tokens[static_cast<size_t>(k)]);
                   }
                 });
    }
  }
  if (cur.can_end) {
    for (int32_t e : v.end_ids()) out.set(e);
  }
}

const TokenBitmask& CompiledGrammar::mask(Matcher& matcher) {
  ++stats_.masks;
  const std::vector<int32_t> key_ints = matcher.state_key();
  std::string key(reinterpret_cast<const char*>(key_ints.data()),
                  key_ints.size() * sizeof(int32_t));
  if (const auto it = cache_.find(key); it != cache_.end()) {
    ++stats_.cache_hits;
    return it->second;
  }
  const size_t entry_bytes = static_cast<size_t>(vocab_->size()) / 8 + 64;
  if ((cache_.size() + 1) * entry_bytes > kMaxCacheBytes) cache_.clear();
  auto [it, inserted] = cache_.try_emplace(std::move(key), vocab_->size());
  compute(matcher, it->second);
  return it->second;
}

const TokenBitmask* CompiledGrammar::keyed_mask(const std::string& key) const {
  const auto it = keyed_.find(key);
  return it == keyed_.end() ? nullptr : &it->second;
}

const TokenBitmask& CompiledGrammar::keyed_insert(std::string key, TokenBitmask mask) {
  const size_t entry_bytes = static_cast<size_t>(vocab_->size()) / 8 + 64;
  if ((keyed_.size() + 1) * entry_bytes > kMaxCacheBytes / 4) keyed_.clear();
  return keyed_.insert_or_assign(std::move(key), std::move(mask)).first->second;
}

GrammarState::GrammarState(std::shared_ptr<CompiledGrammar> grammar)
    : grammar_(std::move(grammar)),
      matcher_(grammar_->automaton()),
      ended_mask_(grammar_->vocab().size()) {
  for (int32_t e : grammar_->vocab().end_ids()) ended_mask_.set(e);
}

namespace {
bool is_end(const TokenVocabulary& v, int32_t token) {
  return std::binary_search(v.end_ids().begin(), v.end_ids().end(), token);
}
}  // namespace

bool GrammarState::allows(int32_t token) {
  const TokenVocabulary& v = grammar_->vocab();
  if (token < 0 || token >= v.size()) return false;
  if (is_end(v, token)) return ended() || matcher_.can_end();
  if (ended()) return false;
  const std::string_view b = v.bytes(token);
  return !b.empty() && matcher_.accepts(b);
}

bool GrammarState::accept(int32_t token) {
  const TokenVocabulary& v = grammar_->vocab();
  if (token < 0 || token >= v.size()) return false;
  if (is_end(v, token)) {
    if (!ended() && !matcher_.can_end()) return false;
    tokens_.push_back({.ended = true});
    return true;
  }
  if (ended()) return false;
  const std::string_view b = v.bytes(token);
  if (b.empty() || !matcher_.accept(b)) return false;
  tokens_.push_back({.ended = false});
  return true;
}

bool GrammarState::accept_bytes(std::string_view bytes) {
  if (ended() || !matcher_.accept(bytes)) return false;
  tokens_.push_back({.ended = false});
  return true;
}

bool GrammarState::accepts_bytes(std::string_view bytes) {
  return !ended() && matcher_.accepts(bytes);
}

void GrammarState::rollback(size_t n) {
  ARBOR_CHECK_LE(n, tokens_.size());
  for (size_t i = 0; i < n; ++i) {
    if (!tokens_.back().ended) matcher_.rollback(1);
    tokens_.pop_back();
  }
}

const TokenBitmask& GrammarState::mask() {
  if (ended()) return ended_mask_;
  return grammar_->mask(matcher_);
}

}  // namespace arbor::grammar
