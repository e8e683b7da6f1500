// A scheduler driven by a fake executor, for iteration-table tests.
//
// The fake executor samples next = (31 * last + num_tokens) % 97 + 3 (never 0..2), so the
// tokens depend only on the request, never on the batch around it.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kv/kv_cache_manager.h"
#include "sched/scheduler.h"

namespace arbor::sched::testing {

inline int32_t fake_next_token(std::span<const int32_t> tokens) {
  return (31 * tokens.back() + static_cast<int32_t>(tokens.size())) % 97 + 3;
}

// The executor side of the step protocol for the fake model: remembers each request's
// committed tokens from NewRequestData / new_token_ids, verifies drafts by sample-and-compare
// (token i is what a plain step would produce; continue while it equals draft i), and proposes
// next drafts: the true continuation with every token from index `draft_correct` on wrong
// (draft_correct < 0: no drafts). With `trees`, and when the scheduler asks for a tree, it
// proposes a ladder instead: each level has a wrong first child (probability 0.6) and the true
// token as its second (0.4), the true one only for the first draft_correct levels; a tree is
// verified by tree sample-and-compare and its accepted path reported.
//
// With kv_windows set (one window per KV cache group, 0 = full attention) it also keeps a shadow
// K/V store per group, as the executor would write it: block copies first, then for every
// scheduled request it checks that each position its first query reads (all computed ones; for
// a sliding group of window W those from num_computed_tokens - W + 1) holds the request's own
// token in that group's table, writes the step's tokens (drafts too) into every group's slots,
// and moves an accepted tree path into place (KV compaction). A released block read, or a
// block handed to two requests at once, shows up as a wrong token.
class FakeModel {
 public:
  int32_t draft_correct = -1;
  bool trees = false;
  bool report_unverified = true;  // set unverified_first_draft_agreed as the executor does
  // ... also after a verified chain accepted whole (the draft after it), as the executor does;
  // false: only for steps that verified no draft.
  bool report_next_level = true;
  // Each chain draft before index draft_correct is the true token only with this probability
  // (independently, from a generator seeded with draft_seed; the rest of the chain after a wrong
  // one is wrong too): a draft of known acceptance rate.
  double draft_agreement = 1.0;
  uint64_t draft_seed = 1;
  // With a period > 0, the agreement alternates with the text: draft_agreement over the first
  // `period` tokens of a request, then agreement_alt over the next `period`, and so on (a draft
  // that agrees in runs, as a good draft does on familiar text).
  int32_t agreement_period = 0;
  double agreement_alt = 1.0;
  // >= 0: drafts after the first agree (given the earlier did) with this probability instead.
  double later_agreement = -1.0;
  // >= 0: a calibrated draft model's chains instead. Each draft before draft_correct gets a
  // confidence — with this probability a sure one, uniform in [0.9, 1), else an unsure one,
  // uniform in [0.2, 0.7) — and agrees (given the earlier did) with exactly that probability;
  // the chain goes to the scheduler with the confidences when report_confidence is set.
  double sure_share = -1.0;
  bool report_confidence = true;
  std::vector<int32_t> kv_windows;  // empty: no K/V shadow
  int32_t kv_block_size = 0;
  int64_t kv_reads_checked = 0;     // positions checked so far

  StepResult execute(const SchedulerOutput& out) {
    if (!seeded_) rng_.seed(draft_seed);
    seeded_ = true;
    for (RequestId id : out.finished_ids) forget(id);
    for (RequestId id : out.preempted_ids) forget(id);
    current_drafts_.clear();
    for (const NewRequestData& d : out.new_requests) {
      EXPECT_FALSE(tokens_.contains(d.request_id)) << d.request_id;
      tokens_[d.request_id] = d.token_ids;
    }
    if (!kv_windows.empty()) copy_blocks(out.block_copies);
    StepResult r;
    for (const ScheduledRequest& s : out.requests) {
      EXPECT_TRUE(tokens_.contains(s.request_id)) << s.request_id;
      std::vector<int32_t>& toks = tokens_[s.request_id];
      toks.insert(toks.end(), s.new_token_ids.begin(), s.new_token_ids.end());
      if (!kv_windows.empty()) run_kv(s, toks);
      if (s.num_prompt_logprobs() > 0) {
        // Position p's "logprob" is -p and its rank the token: a test sees which positions came.
        step::PromptLogprobsResult p{
            .request_id = s.request_id, .first_position = s.prompt_logprobs_begin, .entries = {}};
        for (int64_t q = s.prompt_logprobs_begin; q < s.prompt_logprobs_end; ++q) {
          p.entries.push_back(sampling::PromptLogprob{.token_id = toks[static_cast<size_t>(q)],
                                                      .logprob = -static_cast<float>(q),
                                                      .rank = 1,
                                                      .top = {}});
        }
        r.prompt_logprobs.push_back(std::move(p));
      }
      if (s.pool) {
        // A pooling request's "vector": its length, first and last token (all of them known).
        EXPECT_EQ(s.num_computed_tokens + s.num_scheduled_tokens,
                  static_cast<int64_t>(toks.size()));
        r.pooled.push_back(step::PoolingResult{
            .request_id = s.request_id,
            .error = {},
            .values = {static_cast<float>(toks.size()), static_cast<float>(toks.front()),
                       static_cast<float>(toks.back())}});
      }
      if (!s.sample) continue;
      EXPECT_EQ(s.num_computed_tokens + s.num_scheduled_tokens - s.num_draft_tokens(),
                static_cast<int64_t>(toks.size()));
      RequestResult rr;
      rr.request_id = s.request_id;
      rr.num_draft_tokens = s.num_draft_tokens();
      std::vector<int32_t> upto = toks;
      // The drafts proposed last step (a chain's parents are -1, 0, 1, ...): the first k.
      const Drafts drafts = std::move(drafts_[s.request_id]);
      drafts_.erase(s.request_id);
      EXPECT_LE(s.num_draft_tokens(), static_cast<int32_t>(drafts.tokens.size()));
      int32_t node = step::kDraftRoot;
      while (true) {
        const int32_t t = fake_next_token(upto);
        rr.tokens.push_back(SampledToken{.token_id = t});
        int32_t next = -1;
        for (int32_t i = 0; i < s.num_draft_tokens() && next < 0; ++i) {
          if (drafts.parents[i] == node && drafts.tokens[i] == t) next = i;
        }
        if (next < 0) {
          // Every verified draft of a chain accepted (or none verified) and the kept drafts go
          // on: whether the next was the token sampled (the executor's
          // unverified_first_draft_agreed).
          const int32_t k = s.num_draft_tokens();
          bool chain = static_cast<int32_t>(drafts.tokens.size()) > k;
          for (int32_t i = 0; chain && i <= k; ++i) chain = drafts.parents[i] == i - 1;
          if (report_unverified && (k == 0 || report_next_level) && chain &&
              rr.num_accepted == k) {
            rr.unverified_first_draft_agreed = drafts.tokens[k] == t ? 1 : 0;
          }
          break;
        }
        if (!kv_windows.empty()) {
          compact(s, next, static_cast<int32_t>(rr.accepted_draft_indices.size()));
        }
        rr.accepted_draft_indices.push_back(next);
        ++rr.num_accepted;
        upto.push_back(t);
        node = next;
      }
      Drafts& next = drafts_[s.request_id];
      if (draft_correct >= 0 && trees && s.max_next_draft_nodes > 0) {
        upto.push_back(rr.tokens.back().token_id);
        int32_t parent = step::kDraftRoot;
        for (int32_t d = 0; d < s.max_next_draft_tokens; ++d) {
          const int32_t t = fake_next_token(upto);
          const auto n = static_cast<int32_t>(next.tokens.size());
          if (n >= s.max_next_draft_nodes) break;
          next.add(t == 3 ? 4 : 3, parent, 0.6f);
          if (d >= draft_correct || n + 1 >= s.max_next_draft_nodes) break;
          next.add(t, parent, 0.4f);
          parent = n + 1;
          upto.push_back(t);
        }
        rr.next_drafts = {next.parents, next.probs};
      } else if (draft_correct >= 0) {
        upto.push_back(rr.tokens.back().token_id);
        bool right = true;
        for (int32_t i = 0; i < s.max_next_draft_tokens; ++i) {
          const int32_t t = fake_next_token(upto);
          upto.push_back(t);
          double agree = i > 0 && later_agreement >= 0
                             ? later_agreement
                             : agreement_at(static_cast<int64_t>(upto.size()));
          if (sure_share >= 0) {
            agree = uniform_(rng_) < sure_share ? 0.9 + 0.1 * uniform_(rng_)
                                                : 0.2 + 0.5 * uniform_(rng_);
          }
          right = right && i < draft_correct && uniform_(rng_) < agree;
          next.add(right ? t : (t == 3 ? 4 : 3), i - 1, static_cast<float>(agree));
        }
        rr.next_drafts = {next.parents,
                          sure_share >= 0 && report_confidence ? next.probs
                                                               : std::vector<float>{}};
      }
      current_drafts_[s.request_id] = drafts;
      r.requests.push_back(std::move(rr));
    }
    return r;
  }
  size_t num_known() const { return tokens_.size(); }
  // The draft tokens request `id` verified in the last step: the first ScheduledRequest::
  // num_drafts of these (empty when it had none).
  std::vector<int32_t> verified_drafts(RequestId id) const {
    const auto it = current_drafts_.find(id);
    return it == current_drafts_.end() ? std::vector<int32_t>{} : it->second.tokens;
  }

 private:
  // A request's drafts as this fake keeps them between steps (the executor's TokenTree).
  struct Drafts {
    std::vector<int32_t> tokens, parents;
    std::vector<float> probs;
    void add(int32_t token, int32_t parent, float prob) {
      tokens.push_back(token);
      parents.push_back(parent);
      probs.push_back(prob);
    }
  };
  double agreement_at(int64_t position) const {
    if (agreement_period > 0 && (position / agreement_period) % 2 == 1) return agreement_alt;
    return draft_agreement;
  }
  std::mt19937_64 rng_{draft_seed};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  bool seeded_ = false;
  void forget(RequestId id) {
    tokens_.erase(id);
    drafts_.erase(id);
  }
  int32_t* slot(const ScheduledRequest& s, size_t g, int64_t pos) {
    const auto b = static_cast<size_t>(pos / kv_block_size);
    EXPECT_LT(b, s.block_tables[g].size()) << "request " << s.request_id << " position " << pos;
    if (b >= s.block_tables[g].size()) return nullptr;
    const int64_t at = int64_t{s.block_tables[g][b]} * kv_block_size + pos % kv_block_size;
    std::vector<int32_t>& shadow = shadow_[g];
    if (static_cast<int64_t>(shadow.size()) <= at) shadow.resize(static_cast<size_t>(at) + 1, -1);
    return &shadow[static_cast<size_t>(at)];
  }
  void copy_blocks(const std::vector<step::BlockCopy>& copies) {
    shadow_.resize(kv_windows.size());
    for (const step::BlockCopy& c : copies) {
      for (std::vector<int32_t>& shadow : shadow_) {
        const int64_t need = (int64_t{std::max(c.src_block, c.dst_block)} + 1) * kv_block_size;
        if (static_cast<int64_t>(shadow.size()) < need) shadow.resize(static_cast<size_t>(need), -1);
        std::copy_n(shadow.begin() + int64_t{c.src_block} * kv_block_size, kv_block_size,
                    shadow.begin() + int64_t{c.dst_block} * kv_block_size);
      }
    }
  }
  // Reads of the step's first query, then the writes of its tokens.
  void run_kv(const ScheduledRequest& s, const std::vector<int32_t>& toks) {
    ASSERT_EQ(s.block_tables.size(), kv_windows.size());
    const int64_t c = s.num_computed_tokens;
    for (size_t g = 0; g < kv_windows.size(); ++g) {
      const int64_t first = kv_windows[g] == 0 ? 0 : std::max<int64_t>(0, c - kv_windows[g] + 1);
      for (int64_t p = first; p < c; ++p) {
        const int32_t* at = slot(s, g, p);
        ASSERT_NE(at, nullptr);
        ASSERT_EQ(*at, toks[static_cast<size_t>(p)])
            << "request " << s.request_id << " group " << g << " reads position " << p
            << " (block " << s.block_tables[g][static_cast<size_t>(p / kv_block_size)]
            << "): K/V not its own";
        ++kv_reads_checked;
      }
      const int32_t committed = s.num_scheduled_tokens - s.num_draft_tokens();
      for (int32_t i = 0; i < s.num_scheduled_tokens; ++i) {
        int32_t* at = slot(s, g, c + i);
        ASSERT_NE(at, nullptr);
        *at = i < committed ? toks[static_cast<size_t>(c + i)]
                            : drafts_[s.request_id].tokens[static_cast<size_t>(i - committed)];
      }
    }
  }
  // Tree KV compaction: accepted node `node` becomes depth `index` + 1 after the root.
  void compact(const ScheduledRequest& s, int32_t node, int32_t index) {
    const int64_t root = s.num_computed_tokens;
    for (size_t g = 0; g < kv_windows.size(); ++g) {
      const int32_t value = *slot(s, g, root + 1 + node);
      *slot(s, g, root + 1 + index) = value;
    }
  }

  std::map<RequestId, std::vector<int32_t>> tokens_;
  std::map<RequestId, Drafts> drafts_;          // proposed last step, kept for the next
  std::map<RequestId, Drafts> current_drafts_;  // verified this step (for tests to read)
  std::vector<std::vector<int32_t>> shadow_;  // [groups][slots] token written, -1 never
};

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

  // The KV manager with every allocate_slots call counted per request, for the rule that a
  // step allocates each request's slots at most once (plans first, then one allocation).
  class CountingKv final : public kv::KvCacheManager {
   public:
    using kv::KvCacheManager::KvCacheManager;
    std::optional<std::span<const kv::BlockId>> allocate_slots(
        const kv::KvRequest& request, int64_t num_new_tokens,
        const kv::ComputedBlocks& new_computed_blocks = kv::ComputedBlocks{},
        int64_t num_lookahead_tokens = 0) override {
      ++calls[request.request_id];
      max_calls = std::max(max_calls, calls[request.request_id]);
      return kv::KvCacheManager::allocate_slots(request, num_new_tokens, new_computed_blocks,
                                                num_lookahead_tokens);
    }
    std::map<kv::KvRequestId, int32_t> calls;  // this step's, by request
    int32_t max_calls = 0;                     // the most one request got in any step
  };

  // Adds a request named `name` (ids 1, 2, ... in order of addition).
  Status add(const std::string& name, std::vector<int32_t> prompt, int32_t max_tokens,
             int32_t priority = 0, int32_t best_of = 1, SpecRequest speculation = {}) {
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
    spec.speculation = speculation;
    spec.sampling.prompt_logprobs = prompt_logprobs;
    spec.pooling = pooling;
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
    for (const auto& [id, n] : kv.calls) {
      EXPECT_LE(n, 1) << "request " << name(id) << " allocated " << n << " times in step "
                      << out.step;
    }
    kv.calls.clear();
    std::string row;
    for (const step::BlockCopy& c : out.block_copies) {
      row += "copy:" + std::to_string(c.src_block) + ">" + std::to_string(c.dst_block) + " ";
    }
    for (const ScheduledRequest& s : out.requests) {
      row += name(s.request_id) + ":" + std::to_string(s.num_scheduled_tokens) + " ";
      tokens_run[name(s.request_id)] += s.num_scheduled_tokens;
      int64_t& blocks = max_blocks[name(s.request_id)];
      blocks = std::max(blocks, s.num_table_blocks());
    }
    for (RequestId p : out.preempted_ids) row += "preempt:" + name(p) + " ";
    const StepResult result = model.execute(out);
    if (step_seconds) sched.observe_step(out, step_seconds(out));  // as the engine loop does
    Result<std::vector<RequestOutput>> outs = sched.update_from_output(out, result);
    EXPECT_TRUE(outs.ok()) << outs.status().to_string();
    last_outputs = outs.ok() ? std::move(outs).value() : std::vector<RequestOutput>{};
    for (const RequestOutput& o : last_outputs) {
      for (const SampledToken& t : o.new_tokens) tokens[name(o.request_id)].push_back(t.token_id);
      for (size_t i = 0; i < o.prompt_logprobs.size(); ++i) {
        prompt_positions[name(o.request_id)].push_back(o.first_prompt_logprob +
                                                       static_cast<int64_t>(i));
        EXPECT_EQ(o.prompt_logprobs[i].logprob,
                  -static_cast<float>(o.first_prompt_logprob + static_cast<int64_t>(i)));
      }
      num_draft_tokens += o.num_draft_tokens;
      num_accepted_tokens += o.num_accepted_tokens;
      if (o.num_draft_tokens > 0) {
        row.insert(row.find(name(o.request_id) + ":") + name(o.request_id).size() + 1 +
                       std::to_string(o.num_draft_tokens + 1).size(),
                   "(+" + std::to_string(o.num_accepted_tokens) + ")");
      }
      if (!o.pooled.empty()) pooled[name(o.request_id)] = o.pooled;
      if (o.stop_reason) row += "done:" + name(o.request_id) + " ";
    }
    kv.check_invariants();
    if (!row.empty()) row.pop_back();
    return row;
  }
  std::vector<std::string> run(int max_steps = 1000) {
    std::vector<std::string> table;
    while (sched.has_unfinished_requests() && max_steps-- > 0) table.push_back(step());
    if (!sched.has_unfinished_requests() && sched.has_unreported_finishes()) {
      // The engine's idle flush: the executor hears of the last finished requests.
      const SchedulerOutput out = sched.schedule();
      EXPECT_TRUE(out.empty());
      model.execute(out);
    }
    return table;
  }

  CountingKv kv;
  Scheduler sched;
  FakeModel model;
  std::vector<RequestOutput> last_outputs;
  std::map<std::string, std::vector<int32_t>> tokens;  // generated, by name
  std::map<std::string, int64_t> tokens_run;  // scheduled tokens over all steps, by name
  std::map<std::string, int64_t> max_blocks;  // largest block table seen when scheduled
  // Prompt positions scored, by name, in the order they arrived.
  std::map<std::string, std::vector<int64_t>> prompt_positions;
  // sampling.prompt_logprobs of the requests add() adds from now on.
  std::optional<int32_t> prompt_logprobs;
  // RequestSpec::pooling of the requests add() adds from now on (give them max_tokens 0).
  std::optional<step::PoolingType> pooling;
  std::map<std::string, std::vector<float>> pooled;  // pooled vectors, by name
  // When set, each step's simulated seconds, given to Scheduler::observe_step (the served
  // curve learns from them).
  std::function<double(const SchedulerOutput&)> step_seconds;
  int64_t num_draft_tokens = 0;     // over all steps
  int64_t num_accepted_tokens = 0;

 private:
  RequestId next_id_ = 1;
  std::map<RequestId, std::string> names_;
};

// A KV manager of num_blocks blocks (the null block included) of block_size tokens.
inline kv::KvCacheManagerOptions kopts(int32_t num_blocks, int32_t block_size = 4) {
  return {.num_blocks = num_blocks, .block_size = block_size};
}

inline std::vector<int32_t> iota_prompt(int32_t n, int32_t first = 3) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = first + i % 90;
  return v;
}

}  // namespace arbor::sched::testing
