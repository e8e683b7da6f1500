// Running an Automaton over bytes: the set of parse stacks a prefix of text leaves open.
//
// A stack is a chain of frames (state, parent): the top frame's state is a state of the
// innermost rule; every frame below holds the return state of its caller. Frames are interned
// in a StackArena, so equal stacks are one frame id and a StackSet is a sorted vector of ids.
// A StackSet keeps only tops that can consume a byte; calls and completions are followed
// eagerly (expand), recording whether the root rule can complete (can_end).
//
// Thread-safety: none; a Matcher belongs to one request on the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"

namespace arbor::grammar {

// Parent of the bottom frame of a request's stack.
inline constexpr int32_t kNoParent = -1;
// Parent of the bottom frame when the stack below is not known (token-mask precomputation:
// completing that frame's rule "pops into the unknown").
inline constexpr int32_t kUnknownParent = -2;

class StackArena {
 public:
  int32_t intern(int32_t state, int32_t parent);
  int32_t state(int32_t frame) const { return frames_[static_cast<size_t>(frame)].state; }
  int32_t parent(int32_t frame) const { return frames_[static_cast<size_t>(frame)].parent; }
  size_t size() const { return frames_.size(); }
  void clear() {
    frames_.clear();
    ids_.clear();
  }

 private:
  struct Frame {
    int32_t state;
    int32_t parent;
  };
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> ids_;
};

struct StackSet {
  std::vector<int32_t> tops;  // sorted frame ids whose state has a byte edge
  bool can_end = false;       // the root rule can complete: the text so far is in the language
  bool pops_unknown = false;  // a kUnknownParent frame's rule can complete here

  bool dead() const { return tops.empty() && !can_end && !pops_unknown; }
};

// The stepping rules, over any arena.
class StackStepper {
 public:
  explicit StackStepper(const Automaton& automaton) : a_(&automaton) {}

  // `out` = the frames in `work` (and what they reach through calls and completions), expanded.
  void expand(StackArena& arena, std::vector<int32_t>& work, StackSet& out);
  // `out` = `in` after one byte; false when no stack can take it (then `out` is dead).
  bool step(StackArena& arena, const StackSet& in, uint8_t byte, StackSet& out);
  // Whether every byte of `bytes` can be consumed from `in`.
  bool accepts(StackArena& arena, const StackSet& in, std::string_view bytes);

  const Automaton& automaton() const { return *a_; }

 private:
  const Automaton* a_;
  std::vector<uint32_t> stamp_;  // [arena size] generation a frame was last seen in
  uint32_t generation_ = 0;
  std::vector<int32_t> work_;
  StackSet tmp_[2];
};

// A request's parse: the stack set after each accepted chunk of bytes (one per token), so
// that speculative tokens can be rolled back.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Automaton> automaton);

  const StackSet& current() const { return history_.back(); }
  bool can_end() const { return current().can_end; }
  // Can any byte follow?
  bool can_continue() const { return !current().tops.empty(); }

  // Consumes all of `bytes` as one history entry and returns true, or returns false and
  // changes nothing.
  bool accept(std::string_view bytes);
  // Undoes the last n accept() calls (n <= num_accepted(), CHECKed).
  void rollback(size_t n);
  size_t num_accepted() const { return history_.size() - 1; }
  // Whether `bytes` could be accepted now (no change).
  bool accepts(std::string_view bytes);

  // A key equal for two matchers exactly when their current stack sets hold the same stacks
  // (by states, not frame ids).
  std::vector<int32_t> state_key() const;

  StackArena& arena() { return arena_; }
  StackStepper& stepper() { return stepper_; }
  const Automaton& automaton() const { return *automaton_; }

 private:
  void collect_garbage();

  std::shared_ptr<const Automaton> automaton_;
  StackArena arena_;
  StackStepper stepper_;
  std::vector<StackSet> history_;  // [num_accepted + 1]
  size_t gc_threshold_;            // arena size that triggers the next collection
};

}  // namespace arbor::grammar
