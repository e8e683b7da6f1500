// A scheduler driven by a fake executor, for iteration-table tests.
//
// The fake executor samples next = (31 * last + num_tokens) % 97 + 3 (never 0..2), so the
// tokens depend only on the request, never on the batch around it.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/scheduler.h"

namespace arbor::sched::testing {

inline int32_t fake_next_token(std::span<const int32_t> tokens) {
  return (31 * tokens.back() + static_cast<int32_t>(tokens.size())) % 97 + 3;
}

inline StepResult fake_execute(const SchedulerOutput& out) {
  StepResult r;
  for (const ScheduledRequest& s : out.requests) {
    if (!s.sample) continue;
    const auto upto = s.token_ids.first(s.num_computed_tokens + s.num_scheduled_tokens);
    SampledToken t;
    t.request_id = s.request_id;
    t.token_id = fake_next_token(upto);
    r.sampled.push_back(t);
  }
  return r;
}

// The tokens a request generates alone: max_tokens fake tokens after `tokens`.
inline std::vector<int32_t> alone_tokens(std::vector<int32_t> tokens, int32_t max_tokens) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < max_tokens; ++i) {
    out.push_back(fake_next_token(tokens));
    tokens.push_back(out.back());
  }
  return out;
}

class Harness {
 public:
  Harness(const SchedulerOptions& sopt, const kv::KvCacheManagerOptions& kopt)
      : kv(kopt), sched(sopt, kv) {}

  // Adds a request named `name` (ids 1, 2, ... in order of addition).
  Status add(const std::string& name, std::vector<int32_t> prompt, int32_t max_tokens,
             int32_t priority = 0, int32_t best_of = 1) {
    RequestSpec spec;
    spec.request_id = next_id_++;
    names_[spec.request_id] = name;
    spec.prompt_token_ids = std::move(prompt);
    spec.stop.max_tokens = max_tokens;
    spec.sampling.temperature = 0.0f;
    spec.sampling.seed = 1;
    spec.priority = priority;
    spec.arrival_time = static_cast<double>(spec.request_id);
    spec.n = best_of;
    spec.best_of = best_of;
    return sched.add_request(make_request(std::move(spec)));
  }
  RequestId id(const std::string& name) const {
    for (const auto& [id, n] : names_) {
      if (n == name) return id;
    }
    return 0;
  }
  std::string name(RequestId id) const {
    if (id >= kMaxUserRequestId) {
      return name(id & (kMaxUserRequestId - 1)) + "." + std::to_string((id >> 48) - 1);
    }
    auto it = names_.find(id);
    return it == names_.end() ? "?" : it->second;
  }

  // One step; returns "A:16 B:1" (+ " preempt:C" + " copy:3>7" + " done:A") and keeps
  // the outputs in last_outputs.
  std::string step() {
    SchedulerOutput out = sched.schedule();
    std::string row;
    for (const kv::BlockCopy& c : out.block_copies) {
      row += "copy:" + std::to_string(c.src_block) + ">" + std::to_string(c.dst_block) + " ";
    }
    for (const ScheduledRequest& s : out.requests) {
      row += name(s.request_id) + ":" + std::to_string(s.num_scheduled_tokens) + " ";
      tokens_run[name(s.request_id)] += s.num_scheduled_tokens;
      int64_t& blocks = max_blocks[name(s.request_id)];
      blocks = std::max(blocks, static_cast<int64_t>(s.block_ids.size()));
    }
    for (RequestId p : out.preempted_ids) row += "preempt:" + name(p) + " ";
    last_outputs = sched.update_from_output(out, fake_execute(out));
    for (const RequestOutput& o : last_outputs) {
      for (const SampledToken& t : o.new_tokens) tokens[name(o.request_id)].push_back(t.token_id);
      if (o.finish_reason) row += "done:" + name(o.request_id) + " ";
    }
    kv.check_invariants();
    if (!row.empty()) row.pop_back();
    return row;
  }
  std::vector<std::string> run(int max_steps = 1000) {
    std::vector<std::string> table;
    while (sched.has_unfinished_requests() && max_steps-- > 0) table.push_back(step());
    return table;
  }

  kv::KvCacheManager kv;
  Scheduler sched;
  std::vector<RequestOutput> last_outputs;
  std::map<std::string, std::vector<int32_t>> tokens;  // generated, by name
  std::map<std::string, int64_t> tokens_run;  // scheduled tokens over all steps, by name
  std::map<std::string, int64_t> max_blocks;  // largest block table seen when scheduled

 private:
  RequestId next_id_ = 1;
  std::map<RequestId, std::string> names_;
};

inline std::vector<int32_t> iota_prompt(int32_t n, int32_t first = 3) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = first + i % 90;
  return v;
}

}  // namespace arbor::sched::testing
