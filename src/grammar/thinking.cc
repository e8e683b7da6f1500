#include "grammar/thinking.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::grammar {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

ThinkingScanner::ThinkingScanner(const ThinkingMarkers& markers, ThinkingStart start)
    : m_(&markers), phase_(start == ThinkingStart::kOpen ? Phase::kThinking : Phase::kPrefix) {
  ARBOR_CHECK(!markers.end.empty());
  ARBOR_CHECK(start == ThinkingStart::kOpen || !markers.start.empty());
}

void ThinkingScanner::feed(std::string_view bytes, Out& out) {
  for (char c : bytes) step(c, out);
}

void ThinkingScanner::step(char c, Out& out) {
  switch (phase_) {
    case Phase::kPrefix:
      if (matched_ == 0 && is_space(c)) {
        held_ += c;
        ++space_;
        return;
      }
      if (c == m_->start[matched_]) {
        held_ += c;
        if (++matched_ == m_->start.size()) {
          phase_ = Phase::kThinking;
          matched_ = 0;
          space_ = 0;
          held_.clear();
        }
        return;
      }
      out.content += held_;
      held_.clear();
      matched_ = 0;
      space_ = 0;
      phase_ = Phase::kContent;
      out.content += c;
      return;
    case Phase::kThinking:
      held_ += c;
      if (held_ == m_->end) {
        phase_ = Phase::kAfterEnd;
        space_ = 0;
        held_.clear();
        return;
      }
      // Keep the longest tail that may still become `end`; what falls out is reasoning.
      while (!std::string_view(m_->end).starts_with(held_)) {
        out.reasoning += held_.front();
        held_.erase(0, 1);
      }
      return;
    case Phase::kAfterEnd: {
      const std::string& open = m_->content_open;
      if (held_.empty() && is_space(c)) {
        ++space_;
        return;
      }
      if (!open_done_ && held_.size() < open.size() && c == open[held_.size()]) {
        held_ += c;
        if (held_.size() == open.size()) {
          open_done_ = true;
          held_.clear();
        }
        return;
      }
      out.content += held_;
      held_.clear();
      space_ = 0;
      phase_ = Phase::kContent;
      opened_ = true;
      out.content += c;
      return;
    }
    case Phase::kContent:
      out.content += c;
      return;
  }
}

bool ThinkingScanner::passes_through(char c) const {
  switch (phase_) {
    case Phase::kPrefix:
      return held_.empty() && !is_space(c) && c != m_->start.front();
    case Phase::kThinking:
      return false;
    case Phase::kAfterEnd:
      return held_.empty() && !is_space(c) &&
             (open_done_ || m_->content_open.empty() || c != m_->content_open.front());
    case Phase::kContent:
      return true;
  }
  return false;
}

void ThinkingScanner::finish(Out& out) {
  switch (phase_) {
    case Phase::kThinking:
      out.reasoning += held_;
      break;
    case Phase::kAfterEnd:
      opened_ = true;
      out.content += held_;
      break;
    case Phase::kPrefix:
    case Phase::kContent:
      out.content += held_;
      break;
  }
  held_.clear();
  matched_ = 0;
  space_ = 0;
  if (phase_ != Phase::kThinking) phase_ = Phase::kContent;
}

std::string ThinkingScanner::key() const {
  std::string k;
  k += static_cast<char>(phase_);
  k += static_cast<char>(open_done_);
  k += static_cast<char>(matched_ & 0xff);
  k += static_cast<char>((matched_ >> 8) & 0xff);
  k += static_cast<char>(std::min<size_t>(space_, 255));
  k += held_;
  return k;
}

}  // namespace arbor::grammar
