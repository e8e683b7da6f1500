#include "grammar/matcher.h"

#include <algorithm>
#include <utility>

#include "base/check.h"

namespace arbor::grammar {
namespace {

// Frames kept before a Matcher copies out the ones its history still uses.
constexpr size_t kGarbageThreshold = size_t{1} << 18;

}  // namespace

int32_t StackArena::intern(int32_t state, int32_t parent) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent);
  const auto [it, inserted] = ids_.emplace(key, static_cast<int32_t>(frames_.size()));
  if (inserted) frames_.push_back(Frame{state, parent});
  return it->second;
}

void StackStepper::expand(StackArena& arena, std::vector<int32_t>& work, StackSet& out) {
  if (++generation_ == 0) {
    std::fill(stamp_.begin(), stamp_.end(), 0);
    generation_ = 1;
  }
  out.tops.clear();
  out.can_end = false;
  out.pops_unknown = false;
  auto mark = [&](int32_t f) {
    const auto i = static_cast<size_t>(f);
    if (i >= stamp_.size()) stamp_.resize(std::max(i + 1, stamp_.size() * 2), 0);
    if (stamp_[i] == generation_) return false;
    stamp_[i] = generation_;
    return true;
  };
  size_t kept = 0;
  for (int32_t f : work) {
    if (mark(f)) work[kept++] = f;
  }
  work.resize(kept);
  while (!work.empty()) {
    const int32_t f = work.back();
    work.pop_back();
    const int32_t s = arena.state(f);
    const int32_t parent = arena.parent(f);
    const auto si = static_cast<size_t>(s);
    if (a_->has_bytes[si]) out.tops.push_back(f);
    for (const RuleCall& c : a_->calls[si]) {
      const int32_t ret = arena.intern(c.return_state, parent);
      const int32_t top = arena.intern(a_->start(c.rule), ret);
      if (mark(top)) work.push_back(top);
    }
    if (a_->is_final[si]) {
      if (parent == kNoParent) {
        out.can_end = true;
      } else if (parent == kUnknownParent) {
        out.pops_unknown = true;
      } else if (mark(parent)) {
        work.push_back(parent);
      }
    }
  }
  std::sort(out.tops.begin(), out.tops.end());
}

bool StackStepper::step(StackArena& arena, const StackSet& in, uint8_t byte, StackSet& out) {
  work_.clear();
  for (int32_t f : in.tops) {
    const int32_t t = a_->step(arena.state(f), byte);
    if (t >= 0) work_.push_back(arena.intern(t, arena.parent(f)));
  }
  if (work_.empty()) {
    out.tops.clear();
    out.can_end = false;
    out.pops_unknown = false;
    return false;
  }
  expand(arena, work_, out);
  return !out.dead();
}

bool StackStepper::accepts(StackArena& arena, const StackSet& in, std::string_view bytes) {
  const StackSet* cur = &in;
  for (size_t i = 0; i < bytes.size(); ++i) {
    StackSet& next = tmp_[i & 1];
    if (!step(arena, *cur, static_cast<uint8_t>(bytes[i]), next)) return false;
    cur = &next;
  }
  return true;
}

Matcher::Matcher(std::shared_ptr<const Automaton> automaton)
    : automaton_(std::move(automaton)), stepper_(*automaton_), gc_threshold_(kGarbageThreshold) {
  std::vector<int32_t> work = {arena_.intern(automaton_->start(automaton_->root_rule), kNoParent)};
  StackSet start;
  stepper_.expand(arena_, work, start);
  history_.push_back(std::move(start));
}

bool Matcher::accept(std::string_view bytes) {
  StackSet cur = current(), next;
  for (char c : bytes) {
    if (!stepper_.step(arena_, cur, static_cast<uint8_t>(c), next)) return false;
    std::swap(cur, next);
  }
  history_.push_back(std::move(cur));
  if (arena_.size() > gc_threshold_) collect_garbage();
  return true;
}

void Matcher::rollback(size_t n) {
  ARBOR_CHECK_LE(n, num_accepted());
  history_.resize(history_.size() - n);
}

bool Matcher::accepts(std::string_view bytes) { return stepper_.accepts(arena_, current(), bytes); }

std::vector<int32_t> Matcher::state_key() const {
  std::vector<std::vector<int32_t>> stacks;
  for (int32_t f : current().tops) {
    std::vector<int32_t>& s = stacks.emplace_back();
    for (int32_t x = f; x >= 0; x = arena_.parent(x)) s.push_back(arena_.state(x));
  }
  std::sort(stacks.begin(), stacks.end());
  std::vector<int32_t> key;
  for (const auto& s : stacks) {
    key.insert(key.end(), s.begin(), s.end());
    key.push_back(-1);
  }
  key.push_back(current().can_end ? -3 : -2);
  return key;
}

// Copies the frames the history still reaches into a fresh arena.
void Matcher::collect_garbage() {
  StackArena fresh;
  std::unordered_map<int32_t, int32_t> moved;
  std::vector<int32_t> chain;
  auto move_frame = [&](int32_t f) {
    chain.clear();
    for (int32_t x = f; x >= 0 && !moved.contains(x); x = arena_.parent(x)) chain.push_back(x);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const int32_t p = arena_.parent(*it);
      moved[*it] = fresh.intern(arena_.state(*it), p >= 0 ? moved.at(p) : p);
    }
    return moved.at(f);
  };
  for (StackSet& set : history_) {
    for (int32_t& f : set.tops) f = move_frame(f);
    std::sort(set.tops.begin(), set.tops.end());
  }
  arena_ = std::move(fresh);
  // Deep stacks keep many frames alive: collect again only when the arena has doubled.
  gc_threshold_ = std::max(kGarbageThreshold, 2 * arena_.size());
}

}  // namespace arbor::grammar
