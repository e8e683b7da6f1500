// Which replica a request goes to (docs/router.md, "Routing"): a pure function of what the
// router knows, so every decision is reproducible in a test and countable in /metrics.
//
//   prefix       (the default) the least cost, where a replica's cost is the prompt tokens it
//                would have to compute (the prompt minus the blocks its cache holds, exactly, from
//                its KvEvents, or that requests in flight there are computing) plus load_tokens
//                for each request it is running. (Prompt tokens routed and not yet computed are
//                not a cost of their own: a request that shares them would wait for them
//                anywhere else too, computing them again.) A replica whose
//                requests in flight exceed both the least loaded one's + balance_abs and
//                imbalance x the least loaded one's is passed over (load takes over from
//                affinity; SGLang's cache-aware router has the same two thresholds).
//   round_robin  the next healthy replica in turn
//   routed_text  the prefix policy over RoutedBlockSet (what was routed where, never told of
//                evictions): the approximate tree of SGLang's cache-aware router, as a baseline
//
// Sessions (prefix and routed_text): the replica a request's session went to last keeps it
// while it is not overloaded and would compute no more of the prompt than the cheapest replica.
// Ties go to the longer affinity (the prompt's leading blocks this router sent there before:
// where a conversation went last, even when its cache lost the blocks since), then to fewer
// requests in flight, then to the lower index.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace arbor::router {

enum class RoutePolicy : uint8_t { kPrefix, kRoundRobin, kRoutedText };
std::string_view route_policy_name(RoutePolicy policy);  // "prefix", "round_robin", ...
std::optional<RoutePolicy> parse_route_policy(std::string_view name);

struct RouteWeights {
  int64_t load_tokens = 32;   // prompt tokens one running request weighs
  double imbalance = 2.0;     // >= 1: the relative threshold
  int64_t balance_abs = 4;    // >= 0: the absolute threshold (requests)
};

// One replica as the policy sees it.
struct RouteCandidate {
  int64_t in_flight = 0;        // requests the router has running there
  int64_t matched_blocks = 0;   // leading prompt blocks its cache holds (or was routed)
  int64_t affinity_blocks = 0;  // leading prompt blocks this router sent there before (a tie-break)
  bool eligible = true;         // healthy, and not excluded for this request
  bool sticky = false;          // the replica the request's session last went to
};

// Why the policy chose as it did (the /metrics label).
enum class RouteReason : uint8_t {
  kPrefix,      // a cached prefix made it the cheapest
  kLoad,        // no replica had a cached prefix worth more than the load difference
  kImbalance,   // the cheapest one was overloaded; the least loaded took it
  kRoundRobin,
  kSession,     // its session's replica: not overloaded, and its cache no worse than the best's
};
std::string_view route_reason_name(RouteReason reason);

struct RouteChoice {
  int32_t index = -1;           // -1: no eligible replica
  RouteReason reason = RouteReason::kLoad;
  int64_t new_tokens = 0;       // prompt tokens the chosen replica is predicted to compute
};

// `round_robin_next`: the turn counter (advanced by the caller after a round-robin choice).
RouteChoice choose_replica(RoutePolicy policy, std::span<const RouteCandidate> candidates,
                           int64_t prompt_tokens, int32_t block_size, const RouteWeights& weights,
                           uint64_t round_robin_next);

}  // namespace arbor::router
