#include "router/route_policy.h"

#include <algorithm>
#include <limits>

namespace arbor::router {

std::string_view route_policy_name(RoutePolicy policy) {
  switch (policy) {
    case RoutePolicy::kPrefix: return "prefix";
    case RoutePolicy::kRoundRobin: return "round_robin";
    case RoutePolicy::kRoutedText: return "routed_text";
  }
  return "?";
}

std::optional<RoutePolicy> parse_route_policy(std::string_view name) {
  for (RoutePolicy p : {RoutePolicy::kPrefix, RoutePolicy::kRoundRobin, RoutePolicy::kRoutedText}) {
    if (route_policy_name(p) == name) return p;
  }
  return std::nullopt;
}

std::string_view route_reason_name(RouteReason reason) {
  switch (reason) {
    case RouteReason::kPrefix: return "prefix";
    case RouteReason::kLoad: return "load";
    case RouteReason::kImbalance: return "imbalance";
    case RouteReason::kRoundRobin: return "round_robin";
    case RouteReason::kSession: return "session";
  }
  return "?";
}

RouteChoice choose_replica(RoutePolicy policy, std::span<const RouteCandidate> candidates,
                           int64_t prompt_tokens, int32_t block_size, const RouteWeights& weights,
                           uint64_t round_robin_next) {
  RouteChoice choice;
  const auto n = static_cast<int64_t>(candidates.size());
  auto new_tokens = [&](const RouteCandidate& c) {
    // A full-prompt hit still computes the last token.
    return std::max<int64_t>(1, prompt_tokens - c.matched_blocks * block_size);
  };
  if (policy == RoutePolicy::kRoundRobin) {
    for (int64_t step = 0; step < n; ++step) {
      const int64_t i = static_cast<int64_t>((round_robin_next + static_cast<uint64_t>(step)) %
                                             static_cast<uint64_t>(n));
      if (!candidates[static_cast<size_t>(i)].eligible) continue;
      choice.index = static_cast<int32_t>(i);
      choice.reason = RouteReason::kRoundRobin;
      choice.new_tokens = new_tokens(candidates[static_cast<size_t>(i)]);
      return choice;
    }
    return choice;
  }
  int64_t least_load = std::numeric_limits<int64_t>::max();
  for (const RouteCandidate& c : candidates) {
    if (c.eligible) least_load = std::min(least_load, c.in_flight);
  }
  if (least_load == std::numeric_limits<int64_t>::max()) return choice;
  auto overloaded = [&](const RouteCandidate& c) {
    return c.in_flight > least_load + weights.balance_abs &&
           static_cast<double>(c.in_flight) > weights.imbalance * static_cast<double>(least_load);
  };
  // The cheapest among the balanced, and the cheapest at all (to say why when they differ).
  auto better = [&](int64_t i, int64_t j, int64_t cost_i, int64_t cost_j) {
    if (j < 0) return true;
    if (cost_i != cost_j) return cost_i < cost_j;
    const auto& a = candidates[static_cast<size_t>(i)];
    const auto& b = candidates[static_cast<size_t>(j)];
    if (a.affinity_blocks != b.affinity_blocks) return a.affinity_blocks > b.affinity_blocks;
    return a.in_flight < b.in_flight;  // then the lower index: i > j never wins a tie
  };
  int64_t best = -1, best_cost = 0, best_any = -1, best_any_cost = 0;
  bool any_hit = false;
  for (int64_t i = 0; i < n; ++i) {
    const RouteCandidate& c = candidates[static_cast<size_t>(i)];
    if (!c.eligible) continue;
    const int64_t cost = new_tokens(c) + c.in_flight * weights.load_tokens;
    any_hit = any_hit || c.matched_blocks > 0;
    if (better(i, best_any, cost, best_any_cost)) best_any = i, best_any_cost = cost;
    if (overloaded(c)) continue;
    if (better(i, best, cost, best_cost)) best = i, best_cost = cost;
  }
  for (int64_t i = 0; i < n; ++i) {
    const RouteCandidate& c = candidates[static_cast<size_t>(i)];
    if (!c.sticky || !c.eligible || overloaded(c)) continue;
    if (new_tokens(c) <= new_tokens(candidates[static_cast<size_t>(best)])) {
      choice.index = static_cast<int32_t>(i);
      choice.reason = RouteReason::kSession;
      choice.new_tokens = new_tokens(c);
      return choice;
    }
  }
  choice.index = static_cast<int32_t>(best);
  const RouteCandidate& chosen = candidates[static_cast<size_t>(best)];
  choice.new_tokens = new_tokens(chosen);
  if (best != best_any) {
    choice.reason = RouteReason::kImbalance;
  } else if (any_hit && chosen.matched_blocks > 0) {
    choice.reason = RouteReason::kPrefix;
  } else {
    choice.reason = RouteReason::kLoad;
  }
  return choice;
}

}  // namespace arbor::router
