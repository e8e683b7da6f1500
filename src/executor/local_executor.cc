#include "executor/local_executor.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "executor/prompt_scorer.h"

namespace arbor::executor {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The blocks a sequence of num_tokens tokens holds at least, over every group, when steps run
// one token (a sliding group of window W keeps the blocks of its last W positions and the
// next one's: ceil((W - 1) / B) + 1 at most). The scheduler's admission check counts the
// chunk too (kv::KvCacheManager::max_blocks_per_request).
int64_t min_blocks_for(const model::KvCacheLayout& layout, int64_t num_tokens, int32_t bs) {
  int64_t n = 0;
  for (const model::KvCacheGroup& g : layout.groups) {
    const int64_t full = cdiv(num_tokens, bs);
    n += g.window == 0 ? full : std::min(full, cdiv(g.window - 1, bs) + 1);
  }
  return n;
}

}  // namespace

LocalExecutor::LocalExecutor(std::unique_ptr<model::ModelRunner> runner,
                             std::unique_ptr<Drafter> drafter)
    : runner_(std::move(runner)),
      drafter_(std::move(drafter)),
      builder_(runner_->kv_cache().block_size(), runner_->kv_layout().num_groups()),
      verifier_(runner_->config().vocab_size),
      pooler_(runner_->config().dim),
      tp_sync_(runner_->tp().collective.get()) {
  if (model::RecurrentStateCache* states = runner_->recurrent_states()) {
    for (int32_t s = states->num_slots() - 1; s >= 0; --s) free_state_slots_.push_back(s);
  }
}

Result<step::StepResult> LocalExecutor::execute(const step::SchedulerOutput& output) {
  ARBOR_RETURN_IF_ERROR(apply_bookkeeping(output));
  step::StepResult result;
  if (output.requests.empty()) return result;
  std::vector<sampling::TokenTree> trees;  // [requests] the drafts each verifies
  ARBOR_ASSIGN_OR_RETURN(const BatchRows rows, build_batch(output, trees));
  readback_.plan(output, rows.sample, rows.prompt, states_, builder_.num_logits(), vocab_size());
  model::LogitsOut out = readback_.out();
  hidden_.resize(static_cast<size_t>(builder_.num_hidden()) * runner_->config().dim);
  out.hidden = hidden_.data();
  ARBOR_RETURN_IF_ERROR(runner_->forward(builder_.batch(), out));
  result.experts_touched = runner_->experts_touched();
  if (runner_->recurrent_states() != nullptr) {
    for (const auto& [from, to] : post_copies_) runner_->recurrent_states()->copy_slot(from, to);
    for (const step::ScheduledRequest& s : output.requests) {
      if (s.num_drafts > 0) continue;  // commit_states(), once verified
      states_.at(s.request_id).state_tokens = s.num_computed_tokens + s.num_scheduled_tokens;
    }
  }
  if (!tp_sync_.leader()) {
    ARBOR_RETURN_IF_ERROR(follow_verification(output));
    return result;  // rank 0 answers
  }
  result.pooled = pool(output, rows);
  // Prompt logprobs first: sampling masks its rows in place (grammar, min_tokens).
  for (size_t i = 0; i < output.requests.size(); ++i) {
    if (rows.prompt[i] < 0) continue;
    const step::ScheduledRequest& s = output.requests[i];
    result.prompt_logprobs.push_back(score_prompt(verifier_.sampler(), s,
                                                  states_.at(s.request_id),
                                                  readback_.row(rows.prompt[i]), vocab_size()));
  }
  for (size_t i = 0; i < output.requests.size(); ++i) {
    if (rows.sample[i] < 0) continue;
    result.requests.push_back(sample(output.requests[i], trees[i], rows.sample[i]));
  }
  if (main_slots_ > 0) ARBOR_RETURN_IF_ERROR(commit_states(output, rows, result.requests));
  if (tp_sync_.active()) {
    std::vector<std::vector<int32_t>> accepted(output.requests.size());
    for (size_t i = 0, r = 0; i < output.requests.size(); ++i) {
      if (rows.sample[i] < 0) continue;
      const step::RequestResult& res = result.requests[r++];
      if (res.error.ok()) accepted[i] = res.accepted_draft_indices;
    }
    ARBOR_RETURN_IF_ERROR(tp_sync_.share_accepted(output, accepted));
  }
  if (drafter_ != nullptr) {
    std::vector<TargetHidden> hidden;  // only an MTP head reads them
    if (drafter_->proposer().reads_hidden()) hidden = committed_hidden(output, rows, result.requests);
    const auto t0 = std::chrono::steady_clock::now();
    ARBOR_RETURN_IF_ERROR(drafter_->propose(output, result, states_, grammars_, hidden));
    result.propose_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return result;
}

// Each request's hidden rows of its committed positions: a chunk's every row; a verification's
// committed token and accepted drafts, gathered.
std::vector<TargetHidden> LocalExecutor::committed_hidden(
    const step::SchedulerOutput& output, const BatchRows& rows,
    const std::vector<step::RequestResult>& results) {
  std::vector<TargetHidden> out(output.requests.size());
  const auto dim = static_cast<size_t>(runner_->config().dim);
  gathered_.resize(output.requests.size());
  size_t r = 0;
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    const step::RequestResult* res = rows.sample[i] >= 0 ? &results[r++] : nullptr;
    const HiddenRows& h = rows.hidden[i];
    if (h.count == 0 || (res != nullptr && !res->error.ok())) continue;
    const std::span<const float> all(hidden_.data() + h.row * dim, h.count * dim);
    if (s.num_drafts == 0) {
      out[i] = {all, h.first_position};
      continue;
    }
    if (res == nullptr) continue;  // (drafts are verified by a sampling row)
    std::vector<float>& g = gathered_[i];
    g.assign(all.begin(), all.begin() + dim);
    for (const int32_t d : res->accepted_draft_indices) {
      g.insert(g.end(), all.begin() + (1 + d) * dim, all.begin() + (2 + d) * dim);
    }
    out[i] = {g, h.first_position};
  }
  return out;
}

Status LocalExecutor::apply_bookkeeping(const step::SchedulerOutput& output) {
  ARBOR_ASSIGN_OR_RETURN(const auto forgotten, states_.apply(output));
  for (const auto& [id, st] : forgotten) {
    grammars_.forget(id);
    pooler_.forget(id);
    if (drafter_ != nullptr) drafter_->forget(id, st);
  }
  if (runner_->recurrent_states() != nullptr) {
    ARBOR_RETURN_IF_ERROR(assign_state_slots(output, forgotten));
  }
  for (const step::BlockCopy& c : output.block_copies) {
    runner_->kv_cache().copy_block(c.src_block, c.dst_block);
    if (drafter_ != nullptr) drafter_->copy_block(c.src_block, c.dst_block);
  }
  return ok_status();
}

// A fork parent's slot is held until its children have copied it, then handed to its last
// child, which continues the parent's state in place; no other request receives it meanwhile
// (a copy writes its destination at once: a slot freed and refilled in the same step would
// hand the next copy the wrong state).
Status LocalExecutor::assign_state_slots(
    const step::SchedulerOutput& output,
    const std::vector<std::pair<step::RequestId, RequestState>>& forgotten) {
  struct Parent {
    int32_t slot = -1;
    int64_t tokens = 0;
    int32_t children = 0;  // in this output, not yet given a slot
  };
  std::unordered_map<step::RequestId, Parent> parents;
  for (const step::NewRequestData& d : output.new_requests) {
    if (d.fork_of != 0) ++parents[d.fork_of].children;
  }
  for (const auto& [id, st] : forgotten) {
    if (st.state_slot < 0) continue;
    auto p = parents.find(id);
    if (p == parents.end()) {
      free_state_slots_.push_back(st.state_slot);
    } else {
      p->second.slot = st.state_slot;
      p->second.tokens = st.state_tokens;
    }
  }
  model::RecurrentStateCache& cache = *runner_->recurrent_states();
  for (const step::NewRequestData& d : output.new_requests) {
    RequestState& st = states_.at(d.request_id);
    st.state_tokens = 0;
    Parent* parent = nullptr;
    if (d.fork_of != 0) {
      parent = &parents[d.fork_of];
      if (parent->slot < 0) {
        return internal_error("request ", d.request_id, " forks ", d.fork_of,
                              ", which this step does not finish");
      }
      st.state_tokens = parent->tokens;
      if (--parent->children == 0) {
        st.state_slot = parent->slot;
        continue;
      }
    }
    if (free_state_slots_.empty()) {
      return failed_precondition("request ", d.request_id, ": every one of the ",
                                 cache.num_slots(), " recurrent state slots is taken "
                                 "(--max-num-seqs bounds the running requests)");
    }
    st.state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
    if (parent != nullptr) cache.copy_slot(parent->slot, st.state_slot);
    if (d.state_checkpoint >= 0) ARBOR_RETURN_IF_ERROR(load_checkpoint(output, d, st));
  }
  return ok_status();
}

void LocalExecutor::reserve_state_checkpoints(int32_t n) {
  model::RecurrentStateCache* states = runner_->recurrent_states();
  ARBOR_CHECK(states != nullptr && num_checkpoints_ == 0 && main_slots_ == 0 && n > 0 &&
              n < states->num_slots())
      << "state checkpoints: reserve a recurrent model's last slots once";
  num_checkpoints_ = n;
  free_state_slots_.clear();
  for (int32_t s = states->num_slots() - n - 1; s >= 0; --s) free_state_slots_.push_back(s);
}

void LocalExecutor::split_state_slots_for_speculation(int32_t main_slots) {
  model::RecurrentStateCache* states = runner_->recurrent_states();
  ARBOR_CHECK(states != nullptr && main_slots_ == 0 && main_slots > 0 &&
              main_slots < states->num_slots() - num_checkpoints_)
      << "speculation's scratch slots: split a recurrent model's slots once";
  main_slots_ = main_slots;
  free_state_slots_.clear();
  for (int32_t s = main_slots_ - 1; s >= 0; --s) free_state_slots_.push_back(s);
}

// The drafts ran from the request's slot into scratch slots (the slot untouched); the committed
// token and the accepted path's nodes (rows token + 0, then token + 1 + node for each node of
// the path) now advance the slot itself. A failed request keeps its old state: it ends.
Status LocalExecutor::commit_states(const step::SchedulerOutput& output, const BatchRows& rows,
                                    const std::vector<step::RequestResult>& results) {
  std::vector<model::StateCommit> commits;
  size_t r = 0;
  for (size_t i = 0; i < output.requests.size(); ++i) {
    if (rows.sample[i] < 0) continue;
    const step::ScheduledRequest& s = output.requests[i];
    const step::RequestResult& res = results[r++];
    if (s.num_drafts == 0 || !res.error.ok()) continue;
    RequestState& st = states_.at(s.request_id);
    model::StateCommit c{st.state_slot, {rows.token[i]}};
    for (int32_t d : res.accepted_draft_indices) c.rows.push_back(rows.token[i] + 1 + d);
    st.state_tokens = s.num_computed_tokens + static_cast<int64_t>(c.rows.size());
    commits.push_back(std::move(c));
  }
  if (commits.empty()) return ok_status();
  return runner_->commit_states(commits);
}

// A request admitted on a prefix hit continues the checkpoint's state: the state after the
// first num_computed_tokens tokens of its first step.
Status LocalExecutor::load_checkpoint(const step::SchedulerOutput& output,
                                      const step::NewRequestData& d, RequestState& st) {
  if (d.state_checkpoint >= num_checkpoints_) {
    return internal_error("request ", d.request_id, " continues checkpoint ", d.state_checkpoint,
                          " of ", num_checkpoints_);
  }
  const auto s = std::find_if(output.requests.begin(), output.requests.end(),
                              [&](const step::ScheduledRequest& r) {
                                return r.request_id == d.request_id;
                              });
  if (s == output.requests.end()) {
    return internal_error("request ", d.request_id, " continues a checkpoint but is not run");
  }
  runner_->recurrent_states()->copy_slot(checkpoint_slot(d.state_checkpoint), st.state_slot);
  st.state_tokens = s->num_computed_tokens;
  return ok_status();
}

// One request's sampling: its rows read back (a non-finite one fails this request only),
// verified, and the accepted path's K/V moved into place.
step::RequestResult LocalExecutor::sample(const step::ScheduledRequest& s,
                                          const sampling::TokenTree& tree, int32_t row) {
  Result<RequestRows> rows = readback_.rows(
      s, row, [this](int32_t r) { return runner_->nonfinite_origin(r); });
  if (!rows.ok()) {
    step::RequestResult failed;
    failed.request_id = s.request_id;
    failed.num_draft_tokens = s.num_draft_tokens();
    failed.error = rows.status();
    return failed;
  }
  const std::optional<sampling::SiblingDraws> rule =
      drafter_ != nullptr ? drafter_->rule(tree) : std::nullopt;
  step::RequestResult r =
      verifier_.verify(s, states_.at(s.request_id), tree, rule, *rows, grammars_);
  if (r.error.ok()) compact_kv(s, r.accepted_draft_indices);
  // The first draft this step did not verify, when every verified one was accepted: was it the
  // token sampled after them (step.h, unverified_first_draft_agreed)?
  const int32_t k = s.num_drafts;
  if (r.error.ok() && drafter_ != nullptr && r.num_accepted == k &&
      r.tokens.size() == static_cast<size_t>(k) + 1) {
    if (const std::optional<int32_t> next = drafter_->chain_draft(s.request_id, k)) {
      r.unverified_first_draft_agreed = *next == r.tokens[k].token_id ? 1 : 0;
    }
  }
  return r;
}

// Appends every scheduled request to the batch; trees[i] = the drafts request i verifies.
Result<LocalExecutor::BatchRows> LocalExecutor::build_batch(
    const step::SchedulerOutput& output, std::vector<sampling::TokenTree>& trees) {
  builder_.clear();
  BatchRows rows{std::vector<int32_t>(output.requests.size(), -1),
                 std::vector<int32_t>(output.requests.size(), -1),
                 std::vector<HiddenRows>(output.requests.size()),
                 std::vector<int32_t>(output.requests.size(), -1)};
  trees.assign(output.requests.size(), sampling::TokenTree());
  for (size_t i = 0; i < output.requests.size() && tp_sync_.leader(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    if (s.num_drafts == 0) continue;
    if (drafter_ == nullptr) {
      return internal_error("request ", s.request_id, " verifies ", s.num_drafts,
                            " drafts, this executor proposes none");
    }
    ARBOR_ASSIGN_OR_RETURN(trees[i], drafter_->drafts_to_verify(s));
  }
  ARBOR_RETURN_IF_ERROR(tp_sync_.share_drafts(output, trees));
  free_scratch_.clear();
  post_copies_.clear();
  if (main_slots_ > 0) {
    const int32_t end = runner_->recurrent_states()->num_slots() - num_checkpoints_;
    for (int32_t s = end - 1; s >= main_slots_; --s) free_scratch_.push_back(s);
  }
  for (size_t i = 0; i < output.requests.size(); ++i) {
    rows.token[i] = builder_.num_tokens();
    ARBOR_RETURN_IF_ERROR(add_sequence(output.requests[i], trees[i], rows.sample[i],
                                       rows.prompt[i], rows.hidden[i]));
  }
  return rows;
}

Status LocalExecutor::follow_verification(const step::SchedulerOutput& output) {
  std::vector<std::vector<int32_t>> accepted;
  ARBOR_RETURN_IF_ERROR(tp_sync_.share_accepted(output, accepted));
  for (size_t i = 0; i < accepted.size(); ++i) {
    if (!accepted[i].empty()) compact_kv(output.requests[i], accepted[i]);
  }
  return ok_status();
}

std::vector<step::PoolingResult> LocalExecutor::pool(const step::SchedulerOutput& output,
                                                     const BatchRows& rows) {
  std::vector<step::PoolingResult> pooled;
  const auto dim = static_cast<size_t>(runner_->config().dim);
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    const RequestState& st = states_.at(s.request_id);
    if (!st.pooling) continue;
    const HiddenRows& h = rows.hidden[i];
    if (h.count > 0) {
      pooler_.add(s.request_id, *st.pooling, h.first_position,
                  std::span<const float>(hidden_).subspan(h.row * dim, h.count * dim));
    }
    if (s.pool) pooled.push_back(pooler_.finish(s.request_id, *st.pooling));
  }
  return pooled;
}

// One request's sequence: committed tokens run, then its drafts under the tree mask.
// sample_row / prompt_row: its first sampling / prompt logprobs row, -1 when none.
Status LocalExecutor::add_sequence(const step::ScheduledRequest& s,
                                   const sampling::TokenTree& tree, int32_t& sample_row,
                                   int32_t& prompt_row, HiddenRows& hidden) {
  const RequestState& st = states_.at(s.request_id);
  const int32_t k = s.num_draft_tokens();
  const int32_t num_committed_run = s.num_scheduled_tokens - k;
  if (k > 0 && num_committed_run != 1) {
    return internal_error("request ", s.request_id, " verifies ", k, " drafts after ",
                          num_committed_run, " committed tokens; drafts follow a decode token");
  }
  if (static_cast<int32_t>(s.block_tables.size()) != builder_.num_kv_groups()) {
    return internal_error("request ", s.request_id, " has ", s.block_tables.size(),
                          " block tables, the KV cache ", builder_.num_kv_groups(), " groups");
  }
  tokens_.assign(st.token_ids.begin() + s.num_computed_tokens,
                 st.token_ids.begin() + s.num_computed_tokens + num_committed_run);
  model::SequenceInput in;
  if (st.state_slot >= 0) {
    if (k > 0) ARBOR_RETURN_IF_ERROR(route_states(s, st, tree, in));
    if (s.save_state_at > 0) ARBOR_RETURN_IF_ERROR(route_save(s, st, num_committed_run, in));
    if (st.state_tokens != s.num_computed_tokens) {
      return failed_precondition("request ", s.request_id, " runs from token ",
                                 s.num_computed_tokens, ", but its recurrent state holds ",
                                 st.state_tokens, " tokens (a prefix-cache hit must name the "
                                 "state checkpoint it continues)");
    }
    in.state_slot = st.state_slot;
  }
  in.block_table = s.block_tables[0];
  in.more_block_tables = std::span<const std::vector<int32_t>>(s.block_tables).subspan(1);
  in.num_committed = static_cast<int32_t>(s.num_computed_tokens);
  if (k > 0) {
    for (const sampling::TreeNode& n : tree.nodes()) tokens_.push_back(n.token_id);
    positions_ = tree.positions(static_cast<int32_t>(s.num_computed_tokens));
    mask_.assign(static_cast<size_t>((tree.num_mask_bits() + 7) / 8), 0);
    tree.write_mask(mask_, 0);
    in.positions = positions_;
    in.mask_bits = mask_;
  }
  in.tokens = tokens_;
  in.logits = !s.sample ? model::LogitsMode::kNone
              : k > 0   ? model::LogitsMode::kAll
                        : model::LogitsMode::kLast;
  if (s.num_prompt_logprobs() > 0) {
    ARBOR_RETURN_IF_ERROR(set_prompt_logprobs_rows(s, st, num_committed_run, in));
  }
  if (st.pooling) {
    std::tie(in.hidden_begin, in.hidden_end) = Pooler::hidden_rows(
        *st.pooling, s.num_computed_tokens, num_committed_run, st.num_prompt_tokens);
  } else if (drafter_ != nullptr && drafter_->proposer().reads_hidden()) {
    in.hidden_end = static_cast<int32_t>(tokens_.size());  // every row, the drafts' too
  }
  if (in.hidden_end > in.hidden_begin) {
    hidden = HiddenRows{.row = builder_.num_hidden(),
                        .count = in.hidden_end - in.hidden_begin,
                        .first_position = s.num_computed_tokens + in.hidden_begin};
  }
  const int32_t row = builder_.add(in);
  if (s.sample) {
    sample_row = row + (in.logits == model::LogitsMode::kRange
                            ? in.logits_end - 1 - in.logits_begin - k
                            : 0);
  }
  if (s.num_prompt_logprobs() > 0) prompt_row = row;
  return ok_status();
}

// A recurrent model's verification: the committed token goes from the request's slot into a
// scratch slot; each draft continues its parent's slot into a scratch slot of its own, except
// its parent's last child, which continues the parent's in place (rows run in order, so every
// other child has read it by then): a chain takes one scratch slot, a tree one per branch.
Status LocalExecutor::route_states(const step::ScheduledRequest& s, const RequestState& st,
                                   const sampling::TokenTree& tree, model::SequenceInput& in) {
  const int32_t k = s.num_draft_tokens();
  if (main_slots_ == 0) {
    return internal_error("request ", s.request_id, " verifies ", k, " drafts without scratch "
                          "state slots");
  }
  const auto take = [&]() -> Result<int32_t> {
    if (free_scratch_.empty()) {
      return failed_precondition("request ", s.request_id, ": the step's drafts need more "
                                 "scratch state slots than the ", runner_->recurrent_states()->
                                 num_slots() - main_slots_, " there are");
    }
    const int32_t slot = free_scratch_.back();
    free_scratch_.pop_back();
    return slot;
  };
  state_src_.assign(1, st.state_slot);
  ARBOR_ASSIGN_OR_RETURN(const int32_t first, take());
  state_dst_.assign(1, first);
  // last_child[p + 1]: the last child of node p (p = -1: the committed token) in node order.
  std::vector<int32_t> last_child(static_cast<size_t>(k) + 1, -1);
  for (int32_t i = 0; i < k; ++i) last_child[static_cast<size_t>(tree.node(i).parent + 1)] = i;
  for (int32_t i = 0; i < k; ++i) {
    const int32_t parent = tree.node(i).parent;
    const int32_t from = state_dst_[static_cast<size_t>(parent + 1)];
    state_src_.push_back(from);
    if (last_child[static_cast<size_t>(parent + 1)] == i) {
      state_dst_.push_back(from);
    } else {
      ARBOR_ASSIGN_OR_RETURN(const int32_t own, take());
      state_dst_.push_back(own);
    }
  }
  in.state_src = state_src_;
  in.state_dst = state_dst_;
  in.replayable = true;
  return ok_status();
}

// The state after token save_state_at goes to the checkpoint slot: that row writes it there and
// the next continues from it into the request's slot (in place around them); when it is the
// step's last row, the checkpoint is copied into the request's slot after the forward.
Status LocalExecutor::route_save(const step::ScheduledRequest& s, const RequestState& st,
                                 int32_t n, model::SequenceInput& in) {
  const int64_t j = s.save_state_at - 1 - s.num_computed_tokens;
  if (s.num_drafts > 0 || j < 0 || j >= n || s.save_state_slot < 0 ||
      s.save_state_slot >= num_checkpoints_) {
    return internal_error("request ", s.request_id, " saves its state after token ",
                          s.save_state_at, " into checkpoint ", s.save_state_slot, " (of ",
                          num_checkpoints_, ") in a step running tokens [", s.num_computed_tokens,
                          ", ", s.num_computed_tokens + n, ")");
  }
  const int32_t checkpoint = checkpoint_slot(s.save_state_slot);
  state_src_.clear();
  state_dst_.clear();
  for (int32_t i = 0; i < n; ++i) {
    state_src_.push_back(i > 0 ? state_dst_.back()
                               : (s.num_computed_tokens == 0 ? -1 : st.state_slot));
    state_dst_.push_back(i == j ? checkpoint : st.state_slot);
  }
  if (j == n - 1) post_copies_.emplace_back(checkpoint, st.state_slot);
  in.state_src = state_src_;
  in.state_dst = state_dst_;
  return ok_status();
}

// KV compaction: accepted tree node j (at depth j + 1) was written in the slot of draft index
// accepted_nodes[j]; it moves to the slot right after its parent's, as a plain run would have
// written it. Sources are never below destinations and moves run in depth order, so no move
// overwrites a source still to be read. Rejected nodes' slots are simply reused later. Each KV
// cache group's layers move through that group's table.
void LocalExecutor::compact_kv(const step::ScheduledRequest& s,
                                  std::span<const int32_t> accepted_nodes) {
  const int64_t bs = block_size();
  const int64_t root = s.num_computed_tokens;  // the last committed token's position
  for (const std::vector<step::BlockId>& table : s.block_tables) {
    const auto slot = [&](int64_t pos) {
      return static_cast<int64_t>(table[static_cast<size_t>(pos / bs)]) * bs + pos % bs;
    };
    for (size_t j = 0; j < accepted_nodes.size(); ++j) {
      const int64_t from = root + 1 + accepted_nodes[j], to = root + 1 + static_cast<int64_t>(j);
      if (from != to) runner_->kv_cache().copy_slot(slot(from), slot(to));
    }
  }
}

Status LocalExecutor::check_max_model_len(int64_t max_model_len) const {
  const int64_t context = runner_->config().context_length;
  const int64_t usable_blocks = runner_->kv_cache().num_blocks() - 1;
  if (max_model_len < 0) return invalid_argument("--max-model-len is ", max_model_len);
  if (max_model_len > context) {
    return invalid_argument("--max-model-len is ", max_model_len,
                            ", the model's context length is ", context);
  }
  const int64_t pool_tokens = max_pool_tokens();
  if (max_model_len > pool_tokens) {
    const int32_t groups = runner_->kv_layout().num_groups();
    return invalid_argument("--max-model-len is ", max_model_len, ", the KV pool holds only ",
                            pool_tokens, " tokens (", usable_blocks, " blocks of ", block_size(),
                            groups > 1 ? str_cat(" shared by ", groups, " KV cache groups") : "",
                            ")");
  }
  return ok_status();
}

int64_t LocalExecutor::max_pool_tokens() const {
  const int64_t usable = runner_->kv_cache().num_blocks() - 1;
  const model::KvCacheLayout& layout = runner_->kv_layout();
  // The longest sequence whose blocks fit: min_blocks_for() grows with the length.
  int64_t lo = 0, hi = std::max<int64_t>(runner_->config().context_length, usable * block_size());
  if (min_blocks_for(layout, hi, block_size()) <= usable) return hi;
  while (lo + 1 < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    (min_blocks_for(layout, mid, block_size()) <= usable ? lo : hi) = mid;
  }
  return lo;
}

int64_t LocalExecutor::max_model_len() const {
  return std::min<int64_t>(runner_->config().context_length, max_pool_tokens());
}

int64_t LocalExecutor::num_kv_blocks() const { return runner_->kv_cache().num_blocks(); }
int32_t LocalExecutor::block_size() const { return runner_->kv_cache().block_size(); }

std::vector<int32_t> LocalExecutor::kv_group_windows() const {
  return runner_->kv_layout().windows();
}

// Each probe: one sequence with up to 64 committed tokens (whatever K/V the blocks hold) and n
// new distinct (or repeated) tokens, logits for every row: the shape of a verification step (for
// a mixture of experts, with the distinct experts n rows of text touch).
// Timed rounds of the step-cost measurement after one warm-up round: every probe runs once per
// round, in turn, so a stall of the machine (a noisy neighbour, 10-20 % swings within seconds on
// a VM) lands in one sample of several probes instead of every sample of one, and each probe's
// median drops it. Drafts live at small sizes, where the policy compares neighbouring points:
// those get more rounds.
constexpr int kCostRounds = 3;
constexpr int kCostRoundsSmall = 5;
constexpr int32_t kCostSmallTokens = 16;

Result<std::vector<step::StepCostSample>> LocalExecutor::measure_step_costs(
    std::span<const step::StepCostProbe> probes) {
  const int32_t bs = block_size();
  const int64_t slots = (num_kv_blocks() - 1) * bs;
  std::vector<std::vector<double>> runs(probes.size());
  std::vector<step::StepCostSample> costs(probes.size());
  // Runs probe i once; with `timed`, keeps its time.
  const auto run = [&](size_t i, bool timed) -> Status {
    const step::StepCostProbe& probe = probes[i];
    const int32_t n = probe.num_tokens;
    // Up to 64 committed tokens of context, as much as the pool leaves.
    const auto context = static_cast<int32_t>(std::clamp<int64_t>(slots - n, 0, 64));
    const int32_t num_blocks = (context + n + bs - 1) / bs;
    if (num_blocks >= num_kv_blocks()) {
      return invalid_argument("measuring a ", n, "-token step needs ", num_blocks,
                              " KV blocks, the pool has ", num_kv_blocks() - 1);
    }
    std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
    for (int32_t b = 0; b < num_blocks; ++b) blocks[b] = b + 1;
    // Every group on the same blocks: they share pools, so the groups' layers overwrite each
    // other's K/V, which only the timing reads.
    const std::vector<std::vector<int32_t>> more(
        static_cast<size_t>(runner_->kv_layout().num_groups() - 1), blocks);
    // Distinct token ids, as text has: a mixture of experts routes each row by its hidden
    // state, and a step's cost grows with the distinct experts its rows touch. The repeated
    // series (n copies of one token, routed to few experts) separates that expert term.
    tokens_.resize(static_cast<size_t>(n));
    for (int32_t t = 0; t < n; ++t) {
      const int64_t j = probe.repeat_token ? 0 : t;
      tokens_[static_cast<size_t>(t)] = static_cast<int32_t>((1 + j * 7919) % vocab_size());
    }
    builder_.clear();
    builder_.add(model::SequenceInput{.block_table = blocks,
                                      .num_committed = context,
                                      .tokens = tokens_,
                                      .logits = model::LogitsMode::kAll,
                                      .more_block_tables = more,
                                      .state_slot = recurrent_state_slots() > 0 ? 0 : -1});
    cost_logits_.resize(static_cast<size_t>(n) * vocab_size());
    const auto t0 = std::chrono::steady_clock::now();
    ARBOR_RETURN_IF_ERROR(runner_->forward(builder_.batch(), cost_logits_.data()));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timed) runs[i].push_back(seconds);
    costs[i].experts_touched = runner_->experts_touched();
    return Status();
  };
  for (int round = 0; round <= kCostRoundsSmall; ++round) {
    for (size_t i = 0; i < probes.size(); ++i) {
      const int rounds = probes[i].num_tokens <= kCostSmallTokens ? kCostRoundsSmall : kCostRounds;
      if (round > rounds) continue;
      ARBOR_RETURN_IF_ERROR(run(i, /*timed=*/round > 0));
    }
  }
  for (size_t i = 0; i < probes.size(); ++i) {
    std::vector<double>& r = runs[i];
    std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
    costs[i].seconds = r[r.size() / 2];
  }
  return costs;
}

}  // namespace arbor::executor
