#include "executor/draft_proposer.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <utility>

#include "base/bits.h"
#include "kernels/ops.h"
#include "sampling/rng.h"

namespace arbor::executor {

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::load(
    const std::string& path, int64_t num_blocks, int32_t block_size,
    std::shared_ptr<kernels::ThreadPool> pool, model::RunnerOptions::OpsFactory make_ops) {
  model::RunnerOptions ro;
  ro.block_size = block_size;
  ro.num_blocks = num_blocks;
  ro.pool = std::move(pool);
  ro.make_ops = std::move(make_ops);
  ro.populate_kv = true;
  Result<std::unique_ptr<model::ModelRunner>> runner = model::ModelRunner::load(path, ro);
  if (!runner.ok()) return runner.status().with_context(str_cat("draft model ", path));
  if ((*runner)->recurrent_states() != nullptr) {
    return unimplemented("draft model ", path, " (", (*runner)->config().arch_name,
                         ") has recurrent layers, whose state a rejected draft would have to "
                         "roll back: arbor does not run such a draft model yet");
  }
  return std::unique_ptr<DraftModelProposer>(new DraftModelProposer(std::move(runner).value()));
}

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::load_mtp(
    const model::LlamaModel& target, int64_t num_blocks, int32_t block_size,
    std::shared_ptr<kernels::ThreadPool> pool) {
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> head, target.mtp_model());
  model::RunnerOptions ro;
  ro.block_size = block_size;
  ro.num_blocks = num_blocks;
  ro.pool = std::move(pool);
  ro.populate_kv = true;  // as the target's: no page faults mid-serving
  Result<std::unique_ptr<model::ModelRunner>> runner =
      model::ModelRunner::create(std::move(head), ro);
  if (!runner.ok()) return runner.status().with_context("the MTP head");
  std::unique_ptr<DraftModelProposer> p(new DraftModelProposer(std::move(runner).value()));
  p->mtp_ = std::make_unique<Mtp>();
  p->mtp_->dim = p->runner_->config().dim;
  return p;
}

DraftModelProposer::DraftModelProposer(std::unique_ptr<model::ModelRunner> runner)
    : runner_(std::move(runner)), builder_(runner_->kv_cache().block_size()) {}

namespace {

// The running hash of a request's tokens that keys an MTP head's kept block rows.
uint64_t hash_step(uint64_t h, int32_t token) {
  return mix64(h ^ (0x9e3779b97f4a7c15ULL + static_cast<uint32_t>(token)));
}

}  // namespace

const float* DraftModelProposer::target_row(const MtpSeq& q, const DraftInput& in,
                                            int64_t position) const {
  const int32_t d = mtp_->dim;
  const int64_t kept = static_cast<int64_t>(q.rows.size()) / d;
  if (position >= q.first && position < q.first + kept) return q.rows.data() + (position - q.first) * d;
  const int64_t given = static_cast<int64_t>(in.hidden.size()) / d;
  if (position >= in.hidden_position && position < in.hidden_position + given) {
    return in.hidden.data() + (position - in.hidden_position) * d;
  }
  return nullptr;
}

// The head's K/V in the cached blocks is trusted (every request the head kept up with wrote
// its rows there); the target's hidden row before the first new position comes from the row
// kept for the last cached block, when it holds these tokens.
int64_t DraftModelProposer::mtp_resume(const DraftInput& in, MtpSeq& q) {
  const int32_t bs = builder_.block_size();
  const int64_t c = std::min<int64_t>(in.hidden_position, static_cast<int64_t>(in.token_ids.size()));
  for (int64_t t = 0; t < c; ++t) q.hash = hash_step(q.hash, in.token_ids[t]);
  q.hash_end = c;
  if (c % bs == 0 && c / bs <= static_cast<int64_t>(in.block_ids.size())) {
    const auto it = mtp_->block_rows.find(in.block_ids[c / bs - 1]);
    if (it != mtp_->block_rows.end() && it->second.prefix_hash == q.hash) {
      q.first = c - 1;
      q.rows = it->second.row;
    }
  }
  return c;
}

int64_t DraftModelProposer::mtp_rows(const DraftInput& in, size_t i, int64_t& valid) {
  const int32_t d = mtp_->dim;
  const auto n = static_cast<int64_t>(in.token_ids.size());
  auto [it, fresh] = mtp_->seqs.try_emplace(in.request_id);
  MtpSeq& q = it->second;
  if (fresh && valid == 0 && in.hidden_position > 0) valid = mtp_resume(in, q);
  // The rows given this step join the kept ones (a gap, or an earlier start, restarts them).
  if (!in.hidden.empty()) {
    const int64_t kept_end = q.first + static_cast<int64_t>(q.rows.size()) / d;
    if (q.rows.empty() || in.hidden_position < q.first || in.hidden_position > kept_end) {
      q.first = in.hidden_position;
      q.rows.assign(in.hidden.begin(), in.hidden.end());
    } else {
      q.rows.resize(static_cast<size_t>(in.hidden_position - q.first) * d);
      q.rows.insert(q.rows.end(), in.hidden.begin(), in.hidden.end());
    }
  }
  // Row p reads the target's row p - 1: rows up to one past the newest known row (and within
  // the block table); a drafting request runs up to its last committed token, at least that.
  const int64_t known_end = q.first + static_cast<int64_t>(q.rows.size()) / d;
  const int64_t capacity = static_cast<int64_t>(in.block_ids.size()) * builder_.block_size();
  int64_t end = std::min({n, known_end + 1, capacity});
  if (in.max_depth > 0) {
    end = n;
    valid = std::min(valid, n - 1);
  }
  valid = std::min(valid, end);
  std::vector<float>& x = mtp_->inputs[i];
  x.assign(static_cast<size_t>(end - valid) * d, 0.0f);
  for (int64_t p = std::max<int64_t>(valid, 1); p < end; ++p) {
    const float* h = target_row(q, in, p - 1);
    if (h == nullptr) {
      ++mtp_->missing_rows;
      continue;
    }
    std::copy(h, h + d, x.begin() + (p - valid) * d);
  }
  return end;
}

void DraftModelProposer::mtp_advance(const DraftInput& in, int64_t valid, int64_t end) {
  const int32_t d = mtp_->dim;
  const int32_t bs = builder_.block_size();
  MtpSeq& q = mtp_->seqs[in.request_id];
  // Keep the target's row at each block end consumed (a later request resumes there).
  for (int64_t p = std::max<int64_t>(valid, 1); p < end; ++p) {
    const int64_t last = p - 1;
    if ((last + 1) % bs != 0) continue;
    const float* h = target_row(q, in, last);
    if (h == nullptr) continue;
    if (q.hash_end > last + 1) {  // recomputed rows: rehash from the start
      q.hash = 0;
      q.hash_end = 0;
    }
    for (; q.hash_end < last + 1; ++q.hash_end) q.hash = hash_step(q.hash, in.token_ids[q.hash_end]);
    BlockRow& r = mtp_->block_rows[in.block_ids[static_cast<size_t>(last / bs)]];
    r.prefix_hash = q.hash;
    r.row.assign(h, h + d);
  }
  // Keep from the row the last row read (a re-run of it reads it again).
  const int64_t from = std::max<int64_t>(q.first, end - 2);
  const int64_t kept_end = q.first + static_cast<int64_t>(q.rows.size()) / d;
  if (from >= kept_end) {
    q.rows.clear();
    q.first = from;
  } else if (from > q.first) {
    q.rows.erase(q.rows.begin(), q.rows.begin() + (from - q.first) * d);
    q.first = from;
  }
}

Result<double> DraftModelProposer::measure_token_cost() {
  const std::vector<int32_t> blocks{1};
  const int32_t token = 1;
  std::vector<double> runs;
  logits_.resize(static_cast<size_t>(vocab_size()));
  const std::vector<float> zeros(mtp_ != nullptr ? static_cast<size_t>(mtp_->dim) : 0, 0.0f);
  for (int r = 0; r < 4; ++r) {
    builder_.clear();
    builder_.add(model::SequenceInput{.block_table = blocks,
                                      .num_committed = 0,
                                      .tokens = std::span<const int32_t>(&token, 1),
                                      .logits = model::LogitsMode::kLast,
                                      .input_hidden = zeros});
    const auto t0 = std::chrono::steady_clock::now();
    ARBOR_RETURN_IF_ERROR(runner_->forward(builder_.batch(), logits_.data()));
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(runs.begin() + 1, runs.end());
  token_cost_ = runs[2];
  return token_cost_;
}

// The draft token at `position` from the draft's logits row, following the request's sampling.
int32_t DraftModelProposer::pick(const DraftInput& in, std::span<const float> logits,
                                 int64_t position, std::span<const int32_t> drafted,
                                 DraftOutput& out) {
  history_.assign(in.token_ids.begin() + in.num_prompt_tokens, in.token_ids.end());
  history_.insert(history_.end(), drafted.begin(), drafted.end());
  const sampling::TokenHistory history{in.token_ids.first(in.num_prompt_tokens), history_};
  sampling::Rng rng = sampling::Rng::at(in.seed, position, sampling::RngStream::kDraft);
  const int32_t token = sampler_.sample(logits, *in.sampling, history, rng).token_id;
  if (in.draw.has_value()) {
    work_.assign(logits.begin(), logits.end());
    sampler_.apply_penalties(work_, *in.sampling, history);
    out.q.push_back(sampler_.distribution(work_, *in.sampling));
  }
  return token;
}

Status DraftModelProposer::forward_rows() {
  const auto rows = static_cast<size_t>(builder_.num_logits());
  logits_.resize(rows * static_cast<size_t>(vocab_size()));
  model::LogitsOut out{.logits = logits_.data()};
  if (mtp_ != nullptr) {
    mtp_->out.resize(static_cast<size_t>(builder_.num_hidden()) * mtp_->dim);
    out.hidden = mtp_->out.data();
  }
  return runner_->forward(builder_.batch(), out);
}

Status DraftModelProposer::catch_up(std::span<const DraftInput> inputs) {
  builder_.clear();
  chunks_.resize(inputs.size());
  std::vector<int64_t> valids(inputs.size()), ends(inputs.size());
  std::vector<int32_t> hidden_row(inputs.size(), -1);  // MTP: a drafting input's output row
  if (mtp_ != nullptr) {
    mtp_->inputs.resize(inputs.size());
    mtp_->chain.resize(inputs.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    std::vector<int32_t>& run = states_[in.request_id];
    const auto n = static_cast<int64_t>(in.token_ids.size());
    const bool drafts = in.max_depth > 0;
    auto [a, b] = std::mismatch(run.begin(), run.end(), in.token_ids.begin(), in.token_ids.end());
    int64_t valid = a - run.begin();
    if (drafts) valid = std::min(valid, n - 1);  // the last committed token's row drafts
    int64_t end = n;
    if (mtp_ != nullptr) end = mtp_rows(in, i, valid);
    if (valid <= static_cast<int64_t>(run.size())) {
      run.resize(static_cast<size_t>(valid));
    } else {  // an MTP head resumed on a prefix-cache hit
      run.assign(in.token_ids.begin(), in.token_ids.begin() + valid);
    }
    valids[i] = valid;
    ends[i] = end;
    chunks_[i].assign(in.token_ids.begin() + valid, in.token_ids.begin() + end);
    if (chunks_[i].empty()) continue;  // an MTP head with nothing new to keep up with
    model::SequenceInput seq{.block_table = in.block_ids,
                             .num_committed = static_cast<int32_t>(valid),
                             .tokens = chunks_[i],
                             .logits = drafts ? model::LogitsMode::kLast : model::LogitsMode::kNone};
    if (mtp_ != nullptr) {
      seq.input_hidden = mtp_->inputs[i];
      if (drafts) {
        seq.hidden_begin = static_cast<int32_t>(end - valid) - 1;
        seq.hidden_end = static_cast<int32_t>(end - valid);
        hidden_row[i] = builder_.num_hidden();
      }
    }
    builder_.add(seq);
  }
  const Status st = builder_.num_tokens() > 0 ? forward_rows() : ok_status();
  if (!st.ok()) {
    for (const DraftInput& in : inputs) {
      states_.erase(in.request_id);
      if (mtp_ != nullptr) mtp_->seqs.erase(in.request_id);
    }
    return st;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int32_t>& run = states_[inputs[i].request_id];
    run.insert(run.end(), chunks_[i].begin(), chunks_[i].end());
    if (mtp_ == nullptr) continue;
    mtp_advance(inputs[i], valids[i], ends[i]);
    if (hidden_row[i] >= 0) {
      const float* h = mtp_->out.data() + static_cast<size_t>(hidden_row[i]) * mtp_->dim;
      mtp_->chain[i].assign(h, h + mtp_->dim);
    }
  }
  return ok_status();
}

Result<std::vector<DraftOutput>> DraftModelProposer::propose_chains(
    std::span<const DraftInput> inputs) {
  const int32_t vocab = vocab_size();
  std::vector<DraftOutput> outs(inputs.size());
  // Round 0: catch up on committed tokens not yet run (at least the last one) and draft 1 token.
  ARBOR_RETURN_IF_ERROR(catch_up(inputs));
  int32_t max_drafts = 0;
  for (const DraftInput& in : inputs) max_drafts = std::max(max_drafts, in.max_depth);
  for (int32_t round = 0; round < max_drafts; ++round) {
    if (round > 0) {
      builder_.clear();
      for (size_t i = 0; i < inputs.size(); ++i) {
        const DraftInput& in = inputs[i];
        if (in.max_depth <= round) continue;
        const std::vector<int32_t>& run = states_[in.request_id];
        chunks_[i].assign(1, outs[i].tokens.back());
        model::SequenceInput seq{.block_table = in.block_ids,
                                 .num_committed = static_cast<int32_t>(run.size()),
                                 .tokens = chunks_[i],
                                 .logits = model::LogitsMode::kLast};
        if (mtp_ != nullptr) {  // the head's K/V keeps committed rows only: drafts go after
          seq.num_committed = static_cast<int32_t>(run.size()) + round - 1;
          seq.input_hidden = mtp_->chain[i];
          seq.hidden_end = 1;
        }
        builder_.add(seq);
      }
      const Status st = forward_rows();
      if (!st.ok()) {
        for (const DraftInput& in : inputs) {
          states_.erase(in.request_id);
          if (mtp_ != nullptr) mtp_->seqs.erase(in.request_id);
        }
        return st;
      }
    }
    size_t row = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DraftInput& in = inputs[i];
      if (in.max_depth <= round) continue;
      std::vector<int32_t>& run = states_[in.request_id];
      if (round > 0 && mtp_ == nullptr) run.insert(run.end(), chunks_[i].begin(), chunks_[i].end());
      if (round > 0 && mtp_ != nullptr) {  // this round's hidden rows are its logits rows
        const float* h = mtp_->out.data() + row * mtp_->dim;
        mtp_->chain[i].assign(h, h + mtp_->dim);
      }
      std::span<const float> logits(logits_.data() + row * vocab, static_cast<size_t>(vocab));
      const int64_t position = static_cast<int64_t>(in.token_ids.size()) + round;
      const int32_t token = pick(in, logits, position, outs[i].tokens, outs[i]);
      if (!in.draw.has_value()) {
        outs[i].probs.push_back(chosen_prob(in, logits, outs[i].tokens, token));
      }
      outs[i].tokens.push_back(token);
      ++row;
    }
  }
  return outs;
}

float DraftModelProposer::ranking_logits(const DraftInput& in, std::span<const float> row,
                                         std::span<const int32_t> path) {
  work_.assign(row.begin(), row.end());
  history_.assign(in.token_ids.begin() + in.num_prompt_tokens, in.token_ids.end());
  history_.insert(history_.end(), path.begin(), path.end());
  sampler_.apply_penalties(
      work_, *in.sampling, sampling::TokenHistory{in.token_ids.first(in.num_prompt_tokens), history_});
  return in.sampling->greedy() ? 1.0f : 1.0f / in.sampling->temperature;
}

float DraftModelProposer::chosen_prob(const DraftInput& in, std::span<const float> row,
                                      std::span<const int32_t> path, int32_t token) {
  if (token < 0 || static_cast<size_t>(token) >= row.size()) return 0.0f;
  const float inv_t = ranking_logits(in, row, path);
  if (inv_t != 1.0f) {
    for (float& x : work_) x *= inv_t;
  }
  kernels::softmax(work_.data(), static_cast<int64_t>(work_.size()));
  const float p = work_[static_cast<size_t>(token)];
  return p >= 0.0f && p <= 1.0f ? p : 0.0f;  // NaN (a NaN or +Inf logit): no confidence
}

// The `width` most probable next tokens after the committed tokens and `path`, with the draft's
// probabilities (softmax after the request's logit bias and penalties, at the request's
// temperature, or 1 for greedy requests; filters are left out: these only rank a one-hot tree),
// most probable first, ties to the lower id. O(vocab + vocab log width).
std::vector<sampling::Candidate> DraftModelProposer::top_children(const DraftInput& in,
                                                                  std::span<const float> row,
                                                                  std::span<const int32_t> path,
                                                                  int32_t width) {
  const float inv_t = ranking_logits(in, row, path);
  const float max_logit = *std::max_element(work_.begin(), work_.end());
  double total = 0.0;
  for (float& x : work_) {
    x = std::exp((x - max_logit) * inv_t);
    total += x;
  }
  const auto w = static_cast<size_t>(std::min<int64_t>(width, static_cast<int64_t>(work_.size())));
  std::vector<int32_t> ids(work_.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(w), ids.end(),
                    [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); });
  std::vector<sampling::Candidate> out;
  for (size_t i = 0; i < w; ++i) {
    const double p = work_[ids[i]] / total;
    if (p > 0) out.push_back({ids[i], p});
  }
  return out;
}

// One input's tree under construction: every candidate so far (parents before children).
struct DraftModelProposer::TreeBuild {
  struct Cand {
    int32_t token = 0, parent = -1, depth = 1;
    double prob = 0.0, path = 1.0;
    std::vector<float> h;  // MTP mode: the head's hidden row at this node, once run
  };
  std::vector<float> root_h;    // MTP mode: the head's hidden row at the last committed token
  std::vector<Cand> cands;
  sampling::TokenTree drawn;    // a drawn tree: the same nodes as cands, with their q groups
  std::vector<int32_t> draws_at_depth;  // a drawn tree's draw counters, by depth
  std::vector<int32_t> expand;  // candidates expanded this level (-1: the root)
  std::vector<int32_t> run;     // candidates run in the last forward, in order (slots)
  std::vector<int32_t> path(int32_t c) const {
    std::vector<int32_t> p;
    for (; c >= 0; c = cands[c].parent) p.push_back(cands[c].token);
    std::reverse(p.begin(), p.end());
    return p;
  }
  // The expanded candidates and their ancestors, in index order.
  std::vector<int32_t> closure() const {
    std::vector<char> in(cands.size(), 0);
    for (int32_t c : expand) {
      for (; c >= 0 && !in[c]; c = cands[c].parent) in[c] = 1;
    }
    std::vector<int32_t> out;
    for (size_t c = 0; c < cands.size(); ++c) {
      if (in[c]) out.push_back(static_cast<int32_t>(c));
    }
    return out;
  }
  // The `budget` best candidates by path probability (parents first on ties) as a TokenTree;
  // a static tree's first `budget` in level order; a drawn tree whole.
  sampling::TokenTree finish(int32_t budget, bool is_drawn, bool is_static) const {
    if (is_drawn) return drawn;
    std::vector<int32_t> order(cands.size());
    for (size_t c = 0; c < cands.size(); ++c) order[c] = static_cast<int32_t>(c);
    // A static tree keeps its level order (the shape's first `budget` nodes).
    if (!is_static) {
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        if (cands[a].path != cands[b].path) return cands[a].path > cands[b].path;
        return cands[a].depth < cands[b].depth;
      });
    }
    if (order.size() > static_cast<size_t>(budget)) order.resize(static_cast<size_t>(budget));
    std::vector<int32_t> node_of(cands.size(), -1);
    sampling::TokenTree tree;
    for (int32_t c : order) {
      const int32_t parent = cands[c].parent < 0 ? sampling::TokenTree::kRoot : node_of[cands[c].parent];
      ARBOR_CHECK(cands[c].parent < 0 || parent >= 0) << "tree candidate before its parent";
      node_of[c] = tree.add_node(parent, cands[c].token, cands[c].prob);
    }
    return tree;
  }
};

// A drawn tree's children of candidate u (-1: the root) at `depth`: as many as the budget
// leaves, at most `width`, drawn from q after the request's transforms.
void DraftModelProposer::draw_children(const DraftInput& in, std::span<const float> row,
                                       int32_t u, int32_t depth, int32_t width, TreeBuild& t) {
  const int32_t count =
      std::min<int32_t>(width, in.max_nodes - static_cast<int32_t>(t.cands.size()));
  if (count <= 0) return;
  work_.assign(row.begin(), row.end());
  const std::vector<int32_t> path = t.path(u);
  history_.assign(in.token_ids.begin() + in.num_prompt_tokens, in.token_ids.end());
  history_.insert(history_.end(), path.begin(), path.end());
  sampler_.apply_penalties(
      work_, *in.sampling, sampling::TokenHistory{in.token_ids.first(in.num_prompt_tokens), history_});
  if (t.draws_at_depth.size() <= static_cast<size_t>(depth)) {
    t.draws_at_depth.resize(static_cast<size_t>(depth) + 1, 0);
  }
  sampling::CounterDrawSource draws(in.seed);
  const int32_t before = t.drawn.num_nodes();
  sampling::append_sampled_children(t.drawn, u < 0 ? sampling::TokenTree::kRoot : u,
                                    sampler_.distribution(work_, *in.sampling), count,
                                    *in.draw, static_cast<int64_t>(in.token_ids.size()),
                                    t.draws_at_depth[static_cast<size_t>(depth)], draws);
  const double base = u < 0 ? 1.0 : t.cands[u].path;
  for (int32_t n = before; n < t.drawn.num_nodes(); ++n) {
    const sampling::TreeNode& x = t.drawn.node(n);
    t.cands.push_back({.token = x.token_id, .parent = u, .depth = depth, .prob = x.draft_prob,
                       .path = base * x.draft_prob});
  }
}

Result<std::vector<sampling::TokenTree>> DraftModelProposer::propose_tree(
    std::span<const DraftInput> inputs, int32_t width, std::span<const int32_t> static_widths) {
  ARBOR_CHECK(width >= 1) << "tree width " << width;
  const bool is_static = !static_widths.empty();
  const int32_t vocab = vocab_size();
  ARBOR_RETURN_IF_ERROR(catch_up(inputs));
  std::vector<TreeBuild> builds(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    builds[i].expand = {-1};
    builds[i].run.clear();
    if (mtp_ != nullptr) builds[i].root_h = mtp_->chain[i];
  }
  std::vector<int32_t> hidden_rows(inputs.size(), -1);  // MTP: each input's first hidden row
  std::vector<int32_t> rows(inputs.size());  // first logits row of each input this round
  for (size_t i = 0; i < inputs.size(); ++i) rows[i] = static_cast<int32_t>(i);
  std::vector<int32_t> positions;
  std::vector<uint8_t> mask;
  for (int32_t depth = 1;; ++depth) {
    // Children of the expanded candidates, from this round's logits.
    for (size_t i = 0; i < inputs.size(); ++i) {
      TreeBuild& t = builds[i];
      if (rows[i] < 0) continue;
      const std::vector<int32_t> expand = std::move(t.expand);
      t.expand.clear();
      for (int32_t u : expand) {
        // The row of u: the root's is the catch-up row; a candidate's is its slot in the run.
        const int32_t r = u < 0 ? rows[i]
                                : rows[i] + static_cast<int32_t>(std::find(t.run.begin(), t.run.end(), u) -
                                                                 t.run.begin());
        const std::span<const float> row(logits_.data() + static_cast<size_t>(r) * vocab,
                                         static_cast<size_t>(vocab));
        const double base = u < 0 ? 1.0 : t.cands[u].path;
        const int32_t children = is_static ? static_widths[static_cast<size_t>(depth - 1)] : width;
        if (inputs[i].draw) {
          draw_children(inputs[i], row, u, depth, children, t);
          continue;
        }
        for (const sampling::Candidate& c : top_children(inputs[i], row, t.path(u), children)) {
          t.cands.push_back({.token = c.token_id, .parent = u, .depth = depth, .prob = c.prob,
                             .path = base * c.prob});
        }
      }
    }
    // The next level's expansions: the `width` best new candidates, as many as fit the budget.
    builder_.clear();
    bool any = false;
    for (size_t i = 0; i < inputs.size(); ++i) {
      TreeBuild& t = builds[i];
      rows[i] = -1;
      if (depth >= inputs[i].max_depth) continue;
      if (is_static && depth >= static_cast<int32_t>(static_widths.size())) continue;
      std::vector<int32_t> level;
      for (size_t c = 0; c < t.cands.size(); ++c) {
        if (t.cands[c].depth == depth) level.push_back(static_cast<int32_t>(c));
      }
      // Dynamic: the `width` most probable; static: every node of the level, in order.
      if (!is_static) {
        std::stable_sort(level.begin(), level.end(),
                         [&](int32_t a, int32_t b) { return t.cands[a].path > t.cands[b].path; });
      }
      for (int32_t c : level) {
        if (!is_static && static_cast<int32_t>(t.expand.size()) >= width) break;
        t.expand.push_back(c);
        if (static_cast<int32_t>(t.closure().size()) > inputs[i].max_nodes) {
          t.expand.pop_back();
          break;
        }
      }
      if (t.expand.empty()) continue;
      t.run = t.closure();
      chunks_[i].clear();
      positions.clear();
      const auto n = t.run.size();
      const auto committed = static_cast<int32_t>(inputs[i].token_ids.size());
      mask.assign((n * n + 7) / 8, 0);
      for (size_t a = 0; a < n; ++a) {
        const TreeBuild::Cand& c = t.cands[t.run[a]];
        chunks_[i].push_back(c.token);
        positions.push_back(committed - 1 + c.depth);
        for (int32_t x = t.run[a]; x >= 0; x = t.cands[x].parent) {
          const auto j = static_cast<size_t>(std::find(t.run.begin(), t.run.end(), x) - t.run.begin());
          mask[(a * n + j) >> 3] |= static_cast<uint8_t>(1u << ((a * n + j) & 7));
        }
      }
      model::SequenceInput seq{.block_table = inputs[i].block_ids,
                               .num_committed = committed,
                               .tokens = chunks_[i],
                               .positions = positions,
                               .mask_bits = mask,
                               .logits = model::LogitsMode::kAll};
      if (mtp_ != nullptr) {  // each node reads its parent's hidden row of the head
        std::vector<float>& x = mtp_->inputs[i];
        x.clear();
        for (size_t a = 0; a < n; ++a) {
          const int32_t parent = t.cands[t.run[a]].parent;
          const std::vector<float>& h = parent < 0 ? t.root_h : t.cands[parent].h;
          x.insert(x.end(), h.begin(), h.end());
        }
        seq.input_hidden = x;
        seq.hidden_end = static_cast<int32_t>(n);
        hidden_rows[i] = builder_.num_hidden();
      }
      rows[i] = builder_.add(seq);
      any = true;
    }
    if (!any) break;
    const Status st = forward_rows();
    if (!st.ok()) {
      for (const DraftInput& in : inputs) {
        states_.erase(in.request_id);
        if (mtp_ != nullptr) mtp_->seqs.erase(in.request_id);
      }
      return st;
    }
    for (size_t i = 0; i < inputs.size() && mtp_ != nullptr; ++i) {
      if (rows[i] < 0) continue;
      TreeBuild& t = builds[i];
      for (size_t a = 0; a < t.run.size(); ++a) {
        const float* h = mtp_->out.data() + (hidden_rows[i] + a) * mtp_->dim;
        t.cands[t.run[a]].h.assign(h, h + mtp_->dim);
      }
    }
  }
  std::vector<sampling::TokenTree> trees;
  trees.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    trees.push_back(
        builds[i].finish(inputs[i].max_nodes, inputs[i].draw.has_value(), is_static));
  }
  return trees;
}

Status DraftModelProposer::propose(std::span<const spec::DraftRequest> requests,
                                   std::vector<sampling::TokenTree>& out) {
  out.assign(requests.size(), sampling::TokenTree());
  std::vector<DraftInput> chains, trees;
  std::vector<size_t> chain_at, tree_at;
  for (size_t i = 0; i < requests.size(); ++i) {
    // An MTP head keeps up with requests that do not draft (beside the chains: one forward).
    if (requests[i].max_depth <= 0 && mtp_ == nullptr) continue;
    const bool tree = requests[i].max_nodes > 0 && requests[i].max_depth > 0;
    (tree ? trees : chains).push_back(requests[i]);
    (tree ? tree_at : chain_at).push_back(i);
  }
  if (!chains.empty()) {
    ARBOR_ASSIGN_OR_RETURN(std::vector<DraftOutput> drafts, propose_chains(chains));
    for (size_t j = 0; j < chains.size(); ++j) {
      out[chain_at[j]] = chains[j].draw
                             ? sampling::TokenTree::from_chain(drafts[j].tokens, drafts[j].q)
                             : sampling::TokenTree::from_chain(drafts[j].tokens, drafts[j].probs);
    }
  }
  if (!trees.empty()) {
    ARBOR_ASSIGN_OR_RETURN(std::vector<sampling::TokenTree> drawn,
                           propose_tree(trees, width_, static_widths_));
    for (size_t j = 0; j < trees.size(); ++j) out[tree_at[j]] = std::move(drawn[j]);
  }
  return ok_status();
}

}  // namespace arbor::executor
