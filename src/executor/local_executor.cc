#include "executor/local_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <unordered_map>

#include "base/log.h"
#include "executor/device.h"
#include "spec/ngram_proposer.h"
#include "spec/suffix_proposer.h"
#include "tokenizer/tokenizer.h"
#include <utility>

namespace arbor::executor {

namespace {
// Proposers may propose this many drafts; the scheduler asks for at most --spec-k.
constexpr int32_t kMaxProposedTokens = 16;

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

// The startup line that says how the KV memory is laid out and why (docs/kv_layout.md).
void log_kv_cache(model::ModelRunner& runner) {
  const model::PagedKvCache& cache = runner.kv_cache();
  const model::KvCacheLayout& layout = runner.kv_layout();
  const model::KvCacheShape& shape = cache.shape();
  const size_t per_block = model::PagedKvCache::bytes_per_block(shape);
  std::string line = str_cat("kv cache: ", cache.num_blocks(), " blocks of ", shape.block_size,
                             " tokens x ", per_block, " bytes (", shape.num_pools(),
                             " layer pools, K and V) = ", cache.total_bytes(), " bytes; ",
                             layout.summary());
  if (layout.num_groups() > 1 || layout.reclaims()) {
    line += str_cat("; the groups share the blocks: a sliding group holds about its window's "
                    "blocks per request (released beyond it), a full-attention group every block");
  }
  ARBOR_LOG(kInfo) << line;
}

}  // namespace

Result<std::unique_ptr<LocalExecutor>> LocalExecutor::load(const std::string& path,
                                                                 const ExecutorOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(DeviceChoice device,
                         choose_device(options.device, options.cuda_device));
  ARBOR_LOG(kInfo) << "device: " << device_name(device.device) << " (" << device.reason << ")";
  model::RunnerOptions ro;
  ro.make_ops = device.make_ops;
  ro.block_size = options.block_size;
  ro.num_blocks = options.num_kv_blocks;
  ro.populate_kv = true;
  ro.kv_cache_gib = options.kv_cache_gib;
  ro.kv_dtype = options.kv_dtype;
  ro.num_threads = options.num_threads;
  ro.reserve_tokens = options.reserve_tokens;
  ro.kv_reclaim = options.kv_reclaim;
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> runner,
                         model::ModelRunner::load(path, ro));
  if (options.proposer == SpecProposer::kDraft && runner->kv_layout().groups[0].window > 0) {
    // A draft model writes and reads its K/V through the target's group-0 tables, which then
    // must keep every block: without a full-attention layer, no group does.
    ARBOR_LOG(kInfo) << "kv cache: every layer of " << path << " has a sliding window and "
                     << "--spec draft shares the target's block tables, so no block is released "
                     << "(as with --no-kv-reclaim)";
    ro.kv_reclaim = false;
    ARBOR_ASSIGN_OR_RETURN(runner, model::ModelRunner::load(path, ro));
  }
  log_kv_cache(*runner);
  if (runner->kv_cache().num_blocks() < 2) {
    return invalid_argument("KV cache of ", runner->kv_cache().num_blocks(),
                            " blocks: need at least 2 (the null block and one more)");
  }
  const bool top_k_candidates = !runner->on_host() || options.top_k_candidates_on_host;
  auto exec = std::make_unique<LocalExecutor>(std::move(runner));
  exec->set_top_k_candidates(top_k_candidates);
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                         tokenizer::Tokenizer::from_file(path));
  exec->set_grammar_vocabulary(grammar_vocabulary(*tok));
  switch (options.proposer) {
    case SpecProposer::kNone:
      break;
    case SpecProposer::kDraft: {
      if (options.draft_model.empty()) return invalid_argument("--spec draft needs --draft-model");
      ARBOR_RETURN_IF_ERROR(check_same_vocabulary(path, options.draft_model));
      ARBOR_ASSIGN_OR_RETURN(
          std::unique_ptr<DraftModelProposer> draft,
          DraftModelProposer::load(options.draft_model, exec->num_kv_blocks(), exec->block_size(),
                                   exec->runner().shared_pool(), device.make_ops));
      ARBOR_RETURN_IF_ERROR(exec->set_draft_model(std::move(draft)));
      break;
    }
    case SpecProposer::kNgram:
      if (options.ngram_min > options.ngram_max) {
        return invalid_argument("--spec-ngram-min is ", options.ngram_min,
                                ", more than --spec-ngram-max ", options.ngram_max);
      }
      exec->set_proposer(std::make_unique<spec::NgramProposer>(
          spec::NgramProposerOptions{.min_n = options.ngram_min,
                                     .max_n = options.ngram_max,
                                     .num_speculative_tokens = kMaxProposedTokens}));
      break;
    case SpecProposer::kSuffix:
      exec->set_proposer(std::make_unique<spec::SuffixProposer>(
          spec::SuffixProposerOptions{.num_speculative_tokens = kMaxProposedTokens}));
      break;
  }
  if (options.tree_budget > 0 && options.proposer == SpecProposer::kNone) {
    return invalid_argument("--spec-tree-budget is ", options.tree_budget,
                            " but no proposer is chosen (--spec)");
  }
  if (!options.tree_static_widths.empty() && options.proposer != SpecProposer::kDraft) {
    return invalid_argument("--spec-tree-shape shapes a draft model's trees; --spec is ",
                            spec_proposer_name(options.proposer));
  }
  ARBOR_RETURN_IF_ERROR(exec->set_tree_options(options.tree_budget, options.tree_width,
                                               options.tree_sampling,
                                               options.tree_static_widths));
  return exec;
}

Status LocalExecutor::set_tree_options(int32_t budget, int32_t width, TreeSampling sampling,
                                          std::vector<int32_t> static_widths) {
  if (budget < 0 || budget > kMaxTreeBudget) {
    return invalid_argument("--spec-tree-budget is ", budget, ", must be in [0, ", kMaxTreeBudget,
                            "]");
  }
  if (width < 1 || width > kMaxTreeWidth) {
    return invalid_argument("--spec-tree-width is ", width, ", must be in [1, ", kMaxTreeWidth,
                            "]");
  }
  if (static_widths.size() > static_cast<size_t>(kMaxProposedTokens)) {
    return invalid_argument("--spec-tree-shape has ", static_widths.size(), " levels, at most ",
                            kMaxProposedTokens);
  }
  for (int32_t w : static_widths) {
    if (w < 1 || w > kMaxTreeWidth) {
      return invalid_argument("--spec-tree-shape width ", w, ", must be in [1, ", kMaxTreeWidth,
                              "]");
    }
  }
  if (!static_widths.empty() && budget == 0) {
    return invalid_argument("--spec-tree-shape needs --spec-tree-budget (the most nodes a tree "
                            "may have)");
  }
  tree_budget_ = budget;
  tree_width_ = width;
  tree_sampling_ = sampling;
  tree_static_widths_ = std::move(static_widths);
  return ok_status();
}

Status LocalExecutor::set_draft_model(std::unique_ptr<DraftModelProposer> draft) {
  if (draft->vocab_size() != vocab_size()) {
    return invalid_argument("the draft model's vocabulary has ", draft->vocab_size(),
                            " tokens, the target's ", vocab_size());
  }
  ARBOR_ASSIGN_OR_RETURN(draft_token_cost_, draft->measure_token_cost());
  draft_ = std::move(draft);
  return ok_status();
}

std::string_view spec_proposer_name(SpecProposer p) {
  switch (p) {
    case SpecProposer::kNone: return "off";
    case SpecProposer::kNgram: return "ngram";
    case SpecProposer::kSuffix: return "suffix";
    case SpecProposer::kDraft: return "draft";
  }
  return "?";
}

namespace {

// A one-line description of a vocabulary for error messages.
std::string describe_vocabulary(const std::string& path, const tokenizer::Tokenizer& t) {
  return str_cat(path, " (", t.vocab_size(), " tokens, ", t.model_name(), ", BOS ", t.bos_id(),
                 ", EOS ", t.eos_id(), ")");
}

}  // namespace

// Drafts are token ids of the target's vocabulary: the two tokenizers must agree on every id.
Status check_same_vocabulary(const std::string& target_path, const std::string& draft_path) {
  Result<std::unique_ptr<tokenizer::Tokenizer>> target = tokenizer::Tokenizer::from_file(target_path);
  if (!target.ok()) return target.status().with_context(str_cat("target ", target_path));
  Result<std::unique_ptr<tokenizer::Tokenizer>> draft = tokenizer::Tokenizer::from_file(draft_path);
  if (!draft.ok()) return draft.status().with_context(str_cat("draft model ", draft_path));
  const tokenizer::Tokenizer& t = **target;
  const tokenizer::Tokenizer& d = **draft;
  const std::string both = str_cat("the draft model's vocabulary ", describe_vocabulary(draft_path, d),
                                   " differs from the target's ", describe_vocabulary(target_path, t));
  if (t.vocab_size() != d.vocab_size() || t.bos_id() != d.bos_id() || t.eos_id() != d.eos_id()) {
    return invalid_argument(both);
  }
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (t.token_text(id) != d.token_text(id)) {
      return invalid_argument(both, ": token ", id, " is '", d.token_text(id), "' vs '",
                              t.token_text(id), "'");
    }
  }
  return ok_status();
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

std::vector<int32_t> LocalExecutor::kv_group_windows() const {
  return runner_->kv_layout().windows();
}

LocalExecutor::LocalExecutor(std::unique_ptr<model::ModelRunner> runner)
    : runner_(std::move(runner)),
      builder_(runner_->kv_cache().block_size(), runner_->kv_layout().num_groups()) {}

int64_t LocalExecutor::num_kv_blocks() const { return runner_->kv_cache().num_blocks(); }
int32_t LocalExecutor::block_size() const { return runner_->kv_cache().block_size(); }

// One sequence with kContext committed tokens (whatever K/V the blocks hold) and n new tokens,
// logits for every row: the shape of a verification step. Median of three after a warm-up.
Result<std::vector<double>> LocalExecutor::measure_step_costs(
    std::span<const int32_t> num_tokens) {
  std::vector<double> costs;
  const int32_t bs = block_size();
  const int64_t slots = (num_kv_blocks() - 1) * bs;
  for (int32_t n : num_tokens) {
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
    tokens_.assign(static_cast<size_t>(n), 1);
    builder_.clear();
    builder_.add(model::SequenceInput{.block_table = blocks,
                                      .num_committed = context,
                                      .tokens = tokens_,
                                      .logits = model::LogitsMode::kAll,
                                      .more_block_tables = more});
    logits_.resize(static_cast<size_t>(n) * vocab_size());
    std::vector<double> runs;
    for (int r = 0; r < 4; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      ARBOR_RETURN_IF_ERROR(runner_->forward(builder_.batch(), logits_.data()));
      runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(runs.begin() + 1, runs.end());
    costs.push_back(runs[2]);
  }
  return costs;
}

// Appends every scheduled request to the batch; rows[i] = the first logits row of request i
// (-1 when it does not sample), prompt_rows[i] = its first prompt logprobs row (-1: none).
Status LocalExecutor::build_batch(const step::SchedulerOutput& output,
                                     std::vector<int32_t>& rows,
                                     std::vector<int32_t>& prompt_rows) {
  builder_.clear();
  rows.assign(output.requests.size(), -1);
  prompt_rows.assign(output.requests.size(), -1);
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    const RequestState& st = states_.at(s.request_id);
    const int32_t k = s.num_draft_tokens();
    const int32_t num_committed_run = s.num_scheduled_tokens - k;
    if (k > 0 && num_committed_run != 1) {
      return internal_error("request ", s.request_id, " verifies ", k, " drafts after ",
                            num_committed_run, " committed tokens; drafts follow a decode token");
    }
    tokens_.assign(st.token_ids.begin() + s.num_computed_tokens,
                   st.token_ids.begin() + s.num_computed_tokens + num_committed_run);
    tokens_.insert(tokens_.end(), s.draft_token_ids.begin(), s.draft_token_ids.end());
    if (static_cast<int32_t>(s.block_tables.size()) != builder_.num_kv_groups()) {
      return internal_error("request ", s.request_id, " has ", s.block_tables.size(),
                            " block tables, the KV cache ", builder_.num_kv_groups(), " groups");
    }
    model::SequenceInput in;
    in.block_table = s.block_tables[0];
    in.more_block_tables = std::span<const std::vector<int32_t>>(s.block_tables).subspan(1);
    in.num_committed = static_cast<int32_t>(s.num_computed_tokens);
    in.tokens = tokens_;
    if (s.is_tree()) {
      ARBOR_RETURN_IF_ERROR(step::check_draft_parents(s.draft_parent_ids, s.draft_token_ids.size())
                                .with_context(str_cat("request ", s.request_id)));
      const sampling::TokenTree tree =
          sampling::TokenTree::from_parents(s.draft_token_ids, s.draft_parent_ids);
      positions_ = tree.positions(static_cast<int32_t>(s.num_computed_tokens));
      mask_.assign(static_cast<size_t>((tree.num_mask_bits() + 7) / 8), 0);
      tree.write_mask(mask_, 0);
      in.positions = positions_;
      in.mask_bits = mask_;
    }
    in.logits = !s.sample ? model::LogitsMode::kNone
                : k > 0   ? model::LogitsMode::kAll
                          : model::LogitsMode::kLast;
    int32_t prompt_row = -1;  // the prompt logprob rows' offset among the sequence's logits rows
    if (s.num_prompt_logprobs() > 0) {
      ARBOR_RETURN_IF_ERROR(prompt_logprobs_rows(s, st, num_committed_run, in));
      prompt_row = 0;
    }
    const int32_t row = builder_.add(in);
    if (s.sample) rows[i] = row + (in.logits == model::LogitsMode::kRange
                                       ? in.logits_end - 1 - in.logits_begin - k
                                       : 0);
    if (prompt_row >= 0) prompt_rows[i] = row;
  }
  return ok_status();
}

// Rows for prompt logprobs: position p is scored by the row of position p - 1, so the range
// [begin, end) needs the sequence's rows [begin - 1 - c, end - 1 - c); with sampling, the rows up
// to the last one too (the sampling row follows the prompt rows; rows between them, which only a
// recompute past the prompt could leave, are computed and ignored). Only these requests pay
// for LM-head rows beyond their sampling row.
Status LocalExecutor::prompt_logprobs_rows(const step::ScheduledRequest& s,
                                              const RequestState& st, int32_t num_committed_run,
                                              model::SequenceInput& in) const {
  const int64_t c = s.num_computed_tokens;
  if (s.prompt_logprobs_begin < c + 1 || s.prompt_logprobs_end > c + num_committed_run + 1 ||
      s.prompt_logprobs_end > st.num_prompt_tokens || !st.sampling.prompt_logprobs ||
      s.num_draft_tokens() > 0) {
    return internal_error("request ", s.request_id, " asks prompt logprobs for positions [",
                          s.prompt_logprobs_begin, ", ", s.prompt_logprobs_end, ") from rows [",
                          c, ", ", c + num_committed_run, ") of a ", st.num_prompt_tokens,
                          "-token prompt", st.sampling.prompt_logprobs ? "" : " (not asked for)");
  }
  in.logits = model::LogitsMode::kRange;
  in.logits_begin = static_cast<int32_t>(s.prompt_logprobs_begin - 1 - c);
  in.logits_end = s.sample ? num_committed_run : static_cast<int32_t>(s.prompt_logprobs_end - 1 - c);
  return ok_status();
}

// Scores the prompt positions of `s` from its rows (raw logits, before any grammar mask).
step::PromptLogprobsResult LocalExecutor::score_prompt(const step::ScheduledRequest& s,
                                                          const float* rows) {
  const RequestState& st = states_.at(s.request_id);
  const auto vocab = static_cast<size_t>(vocab_size());
  step::PromptLogprobsResult r;
  r.request_id = s.request_id;
  r.first_position = s.prompt_logprobs_begin;
  for (int64_t p = s.prompt_logprobs_begin; p < s.prompt_logprobs_end; ++p) {
    const auto row = static_cast<size_t>(p - s.prompt_logprobs_begin);
    r.entries.push_back(sampler_.score_prompt(std::span<const float>(rows + row * vocab, vocab),
                                              st.token_ids[static_cast<size_t>(p)],
                                              *st.sampling.prompt_logprobs));
  }
  return r;
}

// The model rule (accept with min(1, p/q), recover from the residual) needs the draft model's q
// and gives the highest acceptance; it is used for unseeded sampling requests. Greedy and seeded
// requests, and drafts without a q (model-free proposers), use sample-and-compare, whose output
// is token for token what the request produces without speculation.
bool LocalExecutor::uses_model_rule(const RequestState& st) const {
  return draft_ != nullptr && !st.sampling.greedy() && !st.sampling.seed.has_value();
}

// Verifies the request's drafts against logits rows [0, k] (row i: the token after d_0..d_{i-1})
// with the RejectionSampler (docs/sampling.md, "Rejection sampling"); every emitted token gets
// the logprobs a plain step would report for it.
step::RequestResult LocalExecutor::verify_drafts(const step::ScheduledRequest& s,
                                                    const RequestState& st,
                                                    const RequestRows& rows) {
  const int32_t vocab = vocab_size();
  const int32_t k = s.num_draft_tokens();
  std::optional<sampling::LogitsTarget> logits_target;
  std::optional<sampling::ArgmaxTarget> argmax_target;
  if (rows.logits != nullptr) {
    logits_target.emplace(
        sampler_, sampling::LogitsTarget::Rows{
                      .logits = std::span<const float>(rows.logits, static_cast<size_t>(k + 1) * vocab),
                      .vocab_size = vocab,
                      .params = &st.sampling,
                      .history = {st.prompt_ids(), st.output_ids()},
                      .draft_ids = s.draft_token_ids});
  } else {
    argmax_target.emplace(rows.argmax);
  }
  sampling::TargetDistributions& target =
      logits_target ? static_cast<sampling::TargetDistributions&>(*logits_target) : *argmax_target;
  sampling::CounterDrawSource draws(st.seed);
  sampling::DraftChain chain{.position = static_cast<int64_t>(st.token_ids.size()),
                             .token_ids = s.draft_token_ids};
  sampling::ChainVerdict verdict;
  auto q = draft_q_.find(s.request_id);
  if (k > 0 && uses_model_rule(st) && q != draft_q_.end() &&
      static_cast<int32_t>(q->second.size()) >= k) {
    chain.draft_probs = std::span<const std::vector<sampling::Candidate>>(q->second).first(k);
    verdict = rejection_.verify_model_drafts(chain, target, draws);
  } else {
    verdict = rejection_.verify_sample_and_compare(chain, target, draws);
  }
  step::RequestResult r;
  r.request_id = s.request_id;
  r.num_draft_tokens = k;
  r.num_accepted = verdict.num_accepted;
  for (int32_t i = 0; i <= verdict.num_accepted; ++i) {
    const int32_t token = i < verdict.num_accepted ? s.draft_token_ids[i] : verdict.next_token;
    r.tokens.push_back(emitted(rows, i, token, st));
  }
  return r;
}

step::SampledToken LocalExecutor::emitted(const RequestRows& rows, int32_t row, int32_t token,
                                          const RequestState& st) {
  if (rows.logits == nullptr) return step::SampledToken{token, 0.0f, {}};  // no logprobs asked
  const auto vocab = static_cast<size_t>(vocab_size());
  sampling::SampleResult sr = sampler_.score(
      std::span<const float>(rows.logits + static_cast<size_t>(row) * vocab, vocab), token,
      st.sampling);
  return step::SampledToken{
      .token_id = token, .logprob = sr.logprob, .top_logprobs = std::move(sr.top_logprobs)};
}

// Verifies a token tree against logits rows [0, k] (row 1 + i: the token after draft i's path)
// by sample-and-compare (tree_sampler.h): lossless for every request, greedy ones included, and
// a seeded request's tokens are those it produces without speculation; a tree the draft model
// drew (unseeded sampling, --spec-tree-sampling specinfer|sequoia) by SpecInfer's or Sequoia's
// rule with its q. Then moves the accepted path's K/V into place.
step::RequestResult LocalExecutor::verify_tree(const step::ScheduledRequest& s,
                                                  const RequestState& st,
                                                  const RequestRows& rows) {
  const int32_t vocab = vocab_size();
  const int32_t k = s.num_draft_tokens();
  sampling::TokenTree tree =
      sampling::TokenTree::from_parents(s.draft_token_ids, s.draft_parent_ids);
  // A tree the draft model drew last step, cut to the scheduled prefix (its first draws: still
  // draws from q), carries the q groups its rule needs.
  const std::optional<sampling::SiblingDraws> rule = tree_draws(st);
  bool drawn = false;
  if (const auto it = drawn_trees_.find(s.request_id); it != drawn_trees_.end()) {
    if (rule && it->second.num_nodes() >= k) {
      sampling::TokenTree cut = it->second.prefix(k);
      if (cut.parents() == s.draft_parent_ids && cut.slot_tokens(0) == tree.slot_tokens(0)) {
        tree = std::move(cut);
        drawn = true;
      }
    }
    drawn_trees_.erase(it);
  }
  std::optional<sampling::TreeLogitsTarget> logits_target;
  std::optional<sampling::TreeArgmaxTarget> argmax_target;
  if (rows.logits != nullptr) {
    logits_target.emplace(
        sampler_, sampling::TreeLogitsTarget::Rows{
                      .logits = std::span<const float>(rows.logits, static_cast<size_t>(k + 1) * vocab),
                      .vocab_size = vocab,
                      .params = &st.sampling,
                      .history = {st.prompt_ids(), st.output_ids()},
                      .tree = &tree});
  } else {
    argmax_target.emplace(rows.argmax);
  }
  sampling::TreeTargetDistributions& target =
      logits_target ? static_cast<sampling::TreeTargetDistributions&>(*logits_target)
                    : *argmax_target;
  sampling::CounterDrawSource draws(st.seed);
  const auto position = static_cast<int64_t>(st.token_ids.size());
  const sampling::TreeVerdict verdict =
      drawn ? tree_sampler_.verify(tree, position, target, draws, *rule)
            : tree_sampler_.verify_sample_and_compare(tree, position, target, draws);
  step::RequestResult r;
  r.request_id = s.request_id;
  r.num_draft_tokens = k;
  r.num_accepted = verdict.num_accepted();
  r.accepted_draft_indices = verdict.accepted_nodes;
  for (int32_t i = 0; i <= r.num_accepted; ++i) {
    const bool accepted = i < r.num_accepted;
    const int32_t token =
        accepted ? s.draft_token_ids[verdict.accepted_nodes[i]] : verdict.next_token;
    const int32_t slot = i == 0 ? 0 : verdict.accepted_nodes[i - 1] + 1;  // the parent's row
    r.tokens.push_back(emitted(rows, slot, token, st));
  }
  compact_kv(s, verdict.accepted_nodes);
  return r;
}

// Nothing reads a row beyond its best entries or moves them: no logprobs, logit_bias,
// penalties, grammar, or min_tokens mask still to apply.
bool LocalExecutor::reads_only_the_best(const RequestState& st) {
  const sampling::SamplingParams& p = st.sampling;
  return !p.logprobs.has_value() && !p.has_logit_transforms() && !p.grammar.has_value() &&
         static_cast<int64_t>(st.output_ids().size()) >= p.min_tokens;
}

bool LocalExecutor::top_k_suffices(const RequestState& st) {
  const sampling::SamplingParams& p = st.sampling;
  return !p.greedy() && p.top_k >= 1 && p.top_k <= model::kMaxDeviceTopK &&
         reads_only_the_best(st);
}

model::RowOut LocalExecutor::row_out(const RequestState& st) const {
  if (argmax_suffices(st)) return model::RowOut::kArgmax;
  if (top_k_candidates_ && top_k_suffices(st)) return model::RowOut::kTopK;
  return model::RowOut::kRow;
}

bool LocalExecutor::argmax_suffices(const RequestState& st) {
  return st.sampling.greedy() && reads_only_the_best(st);
}

step::RequestResult LocalExecutor::sample_request(const step::ScheduledRequest& s,
                                                     const RequestRows& rows) {
  const RequestState& st = states_.at(s.request_id);
  if (rows.logits == nullptr) {  // argmax_suffices: nothing to mask
    return s.is_tree() ? verify_tree(s, st, rows) : verify_drafts(s, st, rows);
  }
  float* logits = rows.logits;
  Result<grammar::OutputGrammar*> g = grammars_.sync(s.request_id, st);
  Status masked = g.status();
  if (masked.ok() && *g != nullptr) {
    const auto rows = std::span<float>(
        logits, static_cast<size_t>(s.num_draft_tokens() + 1) * static_cast<size_t>(vocab_size()));
    masked = s.is_tree() ? GrammarStates::mask_tree(**g, s.draft_token_ids, s.draft_parent_ids, rows)
                         : GrammarStates::mask_chain(**g, s.draft_token_ids, rows);
  }
  if (masked.ok() && st.sampling.min_tokens > 0) {
    mask_min_tokens(s, st, logits);
  }
  if (!masked.ok()) {
    step::RequestResult failed;
    failed.request_id = s.request_id;
    failed.num_draft_tokens = s.num_draft_tokens();
    failed.error = std::move(masked);
    return failed;
  }
  return s.is_tree() ? verify_tree(s, st, rows) : verify_drafts(s, st, rows);
}

// min_tokens: rows whose token would be output number < min_tokens get -inf for the banned ids
// (row i of a chain is output number num_outputs + i; a tree's row 1 + i is at depth(i)). A row
// where nothing else is allowed (a completed grammar) keeps them.
void LocalExecutor::mask_min_tokens(const step::ScheduledRequest& s, const RequestState& st,
                                       float* logits) {
  const auto vocab = static_cast<size_t>(vocab_size());
  const auto produced = static_cast<int64_t>(st.output_ids().size());
  const std::vector<int32_t> depths = step::draft_depths(s.draft_parent_ids, s.draft_token_ids.size());
  for (int32_t row = 0; row <= s.num_draft_tokens(); ++row) {
    const int64_t output_index = produced + (row == 0 ? 0 : depths[static_cast<size_t>(row - 1)]);
    if (output_index >= st.sampling.min_tokens) continue;
    float* r = logits + static_cast<size_t>(row) * vocab;
    bool other = false;
    for (size_t t = 0; t < vocab && !other; ++t) {
      other = r[t] != -std::numeric_limits<float>::infinity() &&
              !std::binary_search(st.sampling.min_tokens_banned.begin(),
                                  st.sampling.min_tokens_banned.end(), static_cast<int32_t>(t));
    }
    if (!other) continue;
    for (int32_t id : st.sampling.min_tokens_banned) {
      r[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    }
  }
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

// Which drawn-tree rule an unseeded sampling request gets (none: top-k trees, or a request whose
// tokens must not depend on the batch: greedy and seeded ones).
std::optional<sampling::SiblingDraws> LocalExecutor::tree_draws(const RequestState& st) const {
  if (draft_ == nullptr || st.sampling.greedy() || st.sampling.seed.has_value()) return {};
  switch (tree_sampling_) {
    case TreeSampling::kTopK: return {};
    case TreeSampling::kSpecInfer: return sampling::SiblingDraws::kWithReplacement;
    case TreeSampling::kSequoia: return sampling::SiblingDraws::kWithoutReplacement;
  }
  return {};
}

// Next drafts from a tree: a chain when a chosen tree is one (verified by the chain rules),
// else the tree. A drawn tree stays a tree, without probabilities: the policy must not size it
// by its drawn values (a prefix chosen by them would no longer be draws from q).
void LocalExecutor::set_next_drafts(const sampling::TokenTree& tree, bool drawn,
                                       step::RequestResult& r) {
  r.next_draft_token_ids.clear();
  r.next_draft_parent_ids.clear();
  r.next_draft_probs.clear();
  bool chain = true;
  for (const sampling::TreeNode& n : tree.nodes()) {
    r.next_draft_token_ids.push_back(n.token_id);
    r.next_draft_parent_ids.push_back(n.parent);
    r.next_draft_probs.push_back(static_cast<float>(std::clamp(n.draft_prob, 0.0, 1.0)));
    chain = chain && n.parent == static_cast<int32_t>(r.next_draft_parent_ids.size()) - 2;
  }
  if (drawn) {
    r.next_draft_probs.clear();
    if (!tree.empty()) drawn_trees_[r.request_id] = tree;
    return;
  }
  if (chain) r.next_draft_parent_ids.clear();
}

// Model-free token trees: the proposer's candidate continuations merged into one tree (shared
// prefixes once, continuations as siblings). The first candidate's
// nodes get probability 1, each further candidate's new nodes its score relative to the first's.
// At most each input's max_nodes nodes.
void LocalExecutor::propose_model_free(std::span<const DraftInput> inputs,
                                          std::vector<sampling::TokenTree>& trees) {
  std::vector<spec::DraftCandidate> candidates;
  trees.assign(inputs.size(), sampling::TokenTree());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    proposer_->propose_candidates(
        spec::ProposalRequest{.request_id = in.request_id,
                              .token_ids = in.token_ids,
                              .num_prompt_tokens = in.num_prompt_tokens,
                              .max_num_tokens = in.num_drafts},
        tree_width_, candidates);
    if (candidates.empty()) continue;
    const double best = std::max(candidates[0].score, 1e-9);
    sampling::TokenTree tree;
    for (const spec::DraftCandidate& c : candidates) {
      const float p = static_cast<float>(std::clamp(c.score / best, 0.0, 1.0));
      const std::vector<float> probs(c.token_ids.size(), tree.empty() ? 1.0f : p);
      std::vector<int32_t> parents(c.token_ids.size());
      for (size_t j = 0; j < parents.size(); ++j) parents[j] = static_cast<int32_t>(j) - 1;
      tree.merge(sampling::TokenTree::from_parents(c.token_ids, parents, probs));
      if (tree.num_nodes() >= in.max_nodes) break;
    }
    trees[i] = tree.prefix(std::min(tree.num_nodes(), in.max_nodes));
  }
}

// Drafts for the next step, for every request that asked for some.
Status LocalExecutor::propose(const step::SchedulerOutput& output, step::StepResult& result) {
  if (draft_ == nullptr && proposer_ == nullptr) return ok_status();
  // Most steps under load ask nobody for drafts: skip the bookkeeping then.
  if (std::none_of(output.requests.begin(), output.requests.end(),
                   [](const step::ScheduledRequest& s) { return s.max_next_draft_tokens > 0; })) {
    return ok_status();
  }
  std::unordered_map<step::RequestId, const step::ScheduledRequest*> scheduled;
  for (const step::ScheduledRequest& s : output.requests) scheduled.emplace(s.request_id, &s);
  std::vector<DraftInput> inputs;
  std::vector<std::vector<int32_t>> contexts;
  std::vector<size_t> which;
  contexts.reserve(result.requests.size());
  for (size_t i = 0; i < result.requests.size(); ++i) {
    const step::RequestResult& r = result.requests[i];
    const step::ScheduledRequest& s = *scheduled.at(r.request_id);
    if (s.max_next_draft_tokens == 0) continue;
    const RequestState& st = states_.at(r.request_id);
    std::vector<int32_t>& ctx = contexts.emplace_back(st.token_ids);
    for (const step::SampledToken& t : r.tokens) ctx.push_back(t.token_id);
    inputs.push_back(DraftInput{.request_id = r.request_id,
                                .token_ids = ctx,
                                .num_prompt_tokens = st.num_prompt_tokens,
                                .block_ids = s.block_tables[0],
                                .num_drafts = s.max_next_draft_tokens,
                                .max_nodes = tree_budget_ > 0 ? std::min(s.max_next_draft_nodes, tree_budget_) : 0,
                                .draw_tree = tree_draws(st),
                                .sampling = &st.sampling,
                                .seed = st.seed,
                                .keep_distributions = uses_model_rule(st)});
    which.push_back(i);
  }
  if (inputs.empty()) return ok_status();
  // Token trees for the inputs that asked for one, chains for the others.
  std::vector<DraftInput> tree_inputs;
  std::vector<size_t> tree_which;
  for (size_t j = 0; j < inputs.size();) {
    if (inputs[j].max_nodes > 0) {
      tree_inputs.push_back(inputs[j]);
      tree_which.push_back(which[j]);
      inputs.erase(inputs.begin() + static_cast<ptrdiff_t>(j));
      which.erase(which.begin() + static_cast<ptrdiff_t>(j));
    } else {
      ++j;
    }
  }
  if (!tree_inputs.empty()) {
    std::vector<sampling::TokenTree> trees;
    if (proposer_ != nullptr) {
      propose_model_free(tree_inputs, trees);
    } else {
      ARBOR_ASSIGN_OR_RETURN(
          trees, draft_->propose_tree(tree_inputs, tree_width_, tree_static_widths_));
    }
    for (size_t j = 0; j < tree_which.size(); ++j) {
      set_next_drafts(trees[j], tree_inputs[j].draw_tree.has_value(),
                      result.requests[tree_which[j]]);
    }
  }
  if (inputs.empty()) return ok_status();
  if (proposer_ != nullptr) {
    std::vector<spec::ProposalRequest> requests;
    for (const DraftInput& in : inputs) {
      requests.push_back(spec::ProposalRequest{.request_id = in.request_id,
                                               .token_ids = in.token_ids,
                                               .num_prompt_tokens = in.num_prompt_tokens,
                                               .max_num_tokens = in.num_drafts});
    }
    std::vector<std::vector<int32_t>> drafts;
    proposer_->propose(requests, drafts);
    for (size_t j = 0; j < which.size(); ++j) {
      result.requests[which[j]].next_draft_token_ids = std::move(drafts[j]);
    }
    return ok_status();
  }
  ARBOR_ASSIGN_OR_RETURN(std::vector<DraftOutput> drafts, draft_->propose(inputs));
  for (size_t j = 0; j < which.size(); ++j) {
    result.requests[which[j]].next_draft_token_ids = std::move(drafts[j].tokens);
    if (inputs[j].keep_distributions) draft_q_[inputs[j].request_id] = std::move(drafts[j].q);
  }
  return ok_status();
}

// kInternal naming the first non-finite logit of `rows` ([n, vocab]): a NaN or Inf weight, or
// an activation that overflowed, reached the classifier. The sampler must never see one.
// `first_row`: the request's first row among the step's logits (for the runner's diagnosis).
Status check_finite_logits(const step::ScheduledRequest& s, std::span<const float> rows,
                           int32_t vocab, const model::ModelRunner& runner, int32_t first_row) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (std::isfinite(rows[i])) continue;
    const int64_t row = static_cast<int64_t>(i) / vocab;
    const std::string& origin = runner.nonfinite_origin(first_row + static_cast<int32_t>(row));
    return internal_error(
        "the model produced a non-finite logit (", rows[i], ") for request ", s.request_id,
        " at position ",
        s.num_computed_tokens + s.num_scheduled_tokens - s.num_draft_tokens() - 1 + row,
        ", token id ", static_cast<int64_t>(i) % vocab, "; the hidden state first became "
        "non-finite in ", origin.empty() ? std::string("an unknown place") : origin,
        " (`arbor serve --check-weights` scans the weights)");
  }
  return ok_status();
}

// The same check for rows that came back as their argmax or top-k candidates only: row i's
// flag is ids[i * stride], -1 when the row has an Inf or NaN. ids: [num_rows, stride].
Status check_finite_ids(const step::ScheduledRequest& s, std::span<const int32_t> ids,
                        size_t stride, const model::ModelRunner& runner, int32_t first_row) {
  for (size_t row = 0; row * stride < ids.size(); ++row) {
    if (ids[row * stride] >= 0) continue;
    const std::string& origin = runner.nonfinite_origin(first_row + static_cast<int32_t>(row));
    return internal_error(
        "the model produced a non-finite logit for request ", s.request_id, " at position ",
        s.num_computed_tokens + s.num_scheduled_tokens - s.num_draft_tokens() - 1 +
            static_cast<int64_t>(row),
        "; the hidden state first became non-finite in ",
        origin.empty() ? std::string("an unknown place") : origin,
        " (`arbor serve --check-weights` scans the weights)");
  }
  return ok_status();
}

Result<step::StepResult> LocalExecutor::execute(const step::SchedulerOutput& output) {
  ARBOR_ASSIGN_OR_RETURN(const auto forgotten, states_.apply(output));
  for (const auto& [id, st] : forgotten) {
    grammars_.forget(id);
    draft_q_.erase(id);
    drawn_trees_.erase(id);
    if (draft_ != nullptr) draft_->forget(id);
    if (proposer_ != nullptr) proposer_->forget(id, st.token_ids, st.num_prompt_tokens);
  }
  for (const step::BlockCopy& c : output.block_copies) {
    runner_->kv_cache().copy_block(c.src_block, c.dst_block);
    if (draft_ != nullptr) draft_->copy_block(c.src_block, c.dst_block);
  }
  step::StepResult result;
  if (output.requests.empty()) return result;
  std::vector<int32_t> rows, prompt_rows;
  ARBOR_RETURN_IF_ERROR(build_batch(output, rows, prompt_rows));
  const int32_t vocab = vocab_size();
  const auto num_logits = static_cast<size_t>(builder_.num_logits());
  logits_.resize(num_logits * vocab);
  want_.assign(num_logits, model::RowOut::kRow);
  argmax_.assign(num_logits, -1);
  top_k_scale_.assign(num_logits, 1.0f);
  int32_t top_k = 0;  // the most candidates a kTopK row of this step needs
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    if (rows[i] < 0 || prompt_rows[i] >= 0) continue;
    const RequestState& st = states_.at(s.request_id);
    const model::RowOut kind = row_out(st);
    std::fill_n(want_.begin() + rows[i], s.num_draft_tokens() + 1, kind);
    if (kind != model::RowOut::kTopK) continue;
    // Sampler's inv_t, the same float expression, so the device ranks by Sampler's scores.
    std::fill_n(top_k_scale_.begin() + rows[i], s.num_draft_tokens() + 1,
                1.0f / st.sampling.temperature);
    top_k = std::max(top_k, std::min(st.sampling.top_k, vocab));
    num_top_k_rows_ += s.num_draft_tokens() + 1;
  }
  top_ids_.assign(num_logits * static_cast<size_t>(top_k), -1);
  top_logits_.resize(num_logits * static_cast<size_t>(top_k));
  ARBOR_RETURN_IF_ERROR(runner_->forward(builder_.batch(),
                                         model::LogitsOut{.logits = logits_.data(),
                                                          .want = want_,
                                                          .argmax = argmax_.data(),
                                                          .top_k = top_k,
                                                          .top_k_scale = top_k_scale_,
                                                          .top_ids = top_ids_.data(),
                                                          .top_logits = top_logits_.data()}));
  // Prompt logprobs first: sampling masks its rows in place (grammar, min_tokens).
  for (size_t i = 0; i < output.requests.size(); ++i) {
    if (prompt_rows[i] < 0) continue;
    result.prompt_logprobs.push_back(score_prompt(
        output.requests[i], logits_.data() + static_cast<size_t>(prompt_rows[i]) * vocab));
  }
  for (size_t i = 0; i < output.requests.size(); ++i) {
    if (rows[i] < 0) continue;
    const step::ScheduledRequest& s = output.requests[i];
    float* rows_i = logits_.data() + static_cast<size_t>(rows[i]) * vocab;
    // One logits row per draft plus the bonus row; a non-finite one fails this request only.
    const size_t num_rows = static_cast<size_t>(s.num_draft_tokens()) + 1;
    RequestRows request_rows{.logits = rows_i, .argmax = {}};
    Status finite;
    const model::RowOut kind = want_[static_cast<size_t>(rows[i])];
    if (kind == model::RowOut::kArgmax) {
      request_rows = RequestRows{.logits = nullptr,
                                 .argmax = std::span<const int32_t>(argmax_).subspan(
                                     static_cast<size_t>(rows[i]), num_rows)};
      finite = check_finite_ids(s, request_rows.argmax, 1, *runner_, rows[i]);
    } else if (kind == model::RowOut::kTopK) {
      const auto k = static_cast<size_t>(top_k);
      const size_t first = static_cast<size_t>(rows[i]) * k;
      const auto ids = std::span<const int32_t>(top_ids_).subspan(first, num_rows * k);
      const auto values = std::span<const float>(top_logits_).subspan(first, num_rows * k);
      finite = check_finite_ids(s, ids, k, *runner_, rows[i]);
      // The rows Sampler sees: -inf but for the candidates (sampling::fill_sparse_row's
      // argument: its tokens are those the whole rows give).
      for (size_t r = 0; finite.ok() && r < num_rows; ++r) {
        sampling::fill_sparse_row(ids.subspan(r * k, k), values.subspan(r * k, k),
                                  std::span<float>(rows_i + r * vocab, vocab));
      }
    } else {
      finite = check_finite_logits(s, std::span<const float>(rows_i, num_rows * vocab), vocab,
                                   *runner_, rows[i]);
    }
    if (!finite.ok()) {
      step::RequestResult failed;
      failed.request_id = s.request_id;
      failed.num_draft_tokens = s.num_draft_tokens();
      failed.error = std::move(finite);
      result.requests.push_back(std::move(failed));
      continue;
    }
    result.requests.push_back(sample_request(s, request_rows));
  }
  if (proposer_ != nullptr) {
    for (const step::RequestResult& r : result.requests) {
      if (r.num_draft_tokens > 0) proposer_->observe(r.request_id, r.num_draft_tokens, r.num_accepted);
    }
  }
  ARBOR_RETURN_IF_ERROR(propose(output, result));
  for (step::RequestResult& r : result.requests) constrain_next_drafts(r);
  return result;
}

void LocalExecutor::constrain_next_drafts(step::RequestResult& r) {
  if (r.next_draft_token_ids.empty() || !r.error.ok()) return;
  const RequestState& st = states_.at(r.request_id);
  if (!st.sampling.grammar.has_value() || uses_model_rule(st)) return;
  // A drawn tree keeps its draws from q; the SpecInfer/Sequoia rules verify it as drawn.
  if (!r.next_draft_parent_ids.empty() && tree_draws(st).has_value()) return;
  Result<grammar::OutputGrammar*> g = grammars_.sync(r.request_id, st);
  if (!g.ok() || *g == nullptr) return;
  std::vector<int32_t> emitted;
  for (const step::SampledToken& t : r.tokens) emitted.push_back(t.token_id);
  if (r.next_draft_parent_ids.empty()) {
    r.next_draft_token_ids.resize(
        GrammarStates::valid_prefix(**g, emitted, r.next_draft_token_ids));
    if (!r.next_draft_probs.empty()) r.next_draft_probs.resize(r.next_draft_token_ids.size());
    return;
  }
  // A tree: keep the nodes whose whole path the grammar accepts (parents come first).
  const size_t n = r.next_draft_token_ids.size();
  std::vector<int32_t> new_index(n, -1), tokens, parents, path;
  std::vector<float> probs;
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = r.next_draft_parent_ids[i];
    if (p != step::kDraftRoot && new_index[static_cast<size_t>(p)] < 0) continue;
    path.clear();
    for (int32_t x = static_cast<int32_t>(i); x != step::kDraftRoot;
         x = r.next_draft_parent_ids[static_cast<size_t>(x)]) {
      path.push_back(r.next_draft_token_ids[static_cast<size_t>(x)]);
    }
    std::reverse(path.begin(), path.end());
    if (GrammarStates::valid_prefix(**g, emitted, path) != path.size()) continue;
    new_index[i] = static_cast<int32_t>(tokens.size());
    tokens.push_back(r.next_draft_token_ids[i]);
    parents.push_back(p == step::kDraftRoot ? p : new_index[static_cast<size_t>(p)]);
    if (!r.next_draft_probs.empty()) probs.push_back(r.next_draft_probs[i]);
  }
  r.next_draft_token_ids = std::move(tokens);
  r.next_draft_parent_ids = std::move(parents);
  r.next_draft_probs = std::move(probs);
}

}  // namespace arbor::executor
