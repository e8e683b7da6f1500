// LocalExecutor::load: the device choice (executor/device.h), the runner and its KV pool, the
// tokenizer's vocabulary for structured output, and the proposer with its tree options.
#include <algorithm>
#include <memory>
#include <utility>

#include "base/log.h"
#include "executor/device.h"
#include "executor/draft_proposer.h"
#include "executor/local_executor.h"
#include "model/model_config.h"
#include "model/tp.h"
#include "spec/ngram_proposer.h"
#include "spec/suffix_proposer.h"
#include "tokenizer/tokenizer.h"

namespace arbor::executor {

namespace {

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

// The proposer options.proposer names (null for none); a draft model shares the target's KV
// geometry and thread pool and runs on its device.
Result<std::unique_ptr<spec::Proposer>> make_proposer(const std::string& path,
                                                      const ExecutorOptions& options,
                                                      LocalExecutor& exec,
                                                      const DeviceChoice& device) {
  switch (options.proposer) {
    case SpecProposer::kNone:
      return std::unique_ptr<spec::Proposer>();
    case SpecProposer::kDraft: {
      if (options.draft_model.empty()) return invalid_argument("--spec draft needs --draft-model");
      ARBOR_RETURN_IF_ERROR(check_same_vocabulary(path, options.draft_model));
      ARBOR_ASSIGN_OR_RETURN(
          std::unique_ptr<DraftModelProposer> draft,
          DraftModelProposer::load(options.draft_model, exec.num_kv_blocks(), exec.block_size(),
                                   exec.runner().shared_pool(), device.make_ops));
      if (draft->vocab_size() != exec.vocab_size()) {
        return invalid_argument("the draft model's vocabulary has ", draft->vocab_size(),
                                " tokens, the target's ", exec.vocab_size());
      }
      ARBOR_RETURN_IF_ERROR(draft->measure_token_cost().status());
      draft->set_tree_shape(options.tree_width, options.tree_static_widths);
      return std::unique_ptr<spec::Proposer>(std::move(draft));
    }
    case SpecProposer::kMtp: {
      if (!exec.runner().on_host()) {
        return unimplemented("--spec mtp runs the MTP head on the CPU; the target runs on ",
                             exec.runner().device_name(), " (use --device cpu)");
      }
      ARBOR_ASSIGN_OR_RETURN(
          std::unique_ptr<DraftModelProposer> mtp,
          DraftModelProposer::load_mtp(exec.runner().model(), exec.num_kv_blocks(),
                                       exec.block_size(), exec.runner().shared_pool()));
      ARBOR_ASSIGN_OR_RETURN(const double cost, mtp->measure_token_cost());
      ARBOR_LOG(kInfo) << "spec: the MTP head of " << path << " (one layer, its own KV cache of "
                       << exec.num_kv_blocks() << " blocks) drafts at " << cost * 1e3
                       << " ms per token";
      mtp->set_tree_shape(options.tree_width, options.tree_static_widths);
      return std::unique_ptr<spec::Proposer>(std::move(mtp));
    }
    case SpecProposer::kNgram:
      if (options.ngram_min > options.ngram_max) {
        return invalid_argument("--spec-ngram-min is ", options.ngram_min,
                                ", more than --spec-ngram-max ", options.ngram_max);
      }
      return std::unique_ptr<spec::Proposer>(std::make_unique<spec::NgramProposer>(
          spec::NgramProposerOptions{.min_n = options.ngram_min,
                                     .max_n = options.ngram_max,
                                     .num_speculative_tokens = kMaxProposedTokens}));
    case SpecProposer::kSuffix:
      return std::unique_ptr<spec::Proposer>(std::make_unique<spec::SuffixProposer>(
          spec::SuffixProposerOptions{.num_speculative_tokens = kMaxProposedTokens}));
  }
  return internal_error("unknown proposer");
}

// The Drafter over the chosen proposer (null when none), its tree options checked.
Result<std::unique_ptr<Drafter>> make_drafter(const std::string& path,
                                              const ExecutorOptions& options,
                                              LocalExecutor& exec, const DeviceChoice& device) {
  if (options.tree_budget > 0 && options.proposer == SpecProposer::kNone) {
    return invalid_argument("--spec-tree-budget is ", options.tree_budget,
                            " but no proposer is chosen (--spec)");
  }
  if (!options.tree_static_widths.empty() && options.proposer != SpecProposer::kDraft &&
      options.proposer != SpecProposer::kMtp) {
    return invalid_argument("--spec-tree-shape shapes a draft model's or an MTP head's trees; "
                            "--spec is ",
                            spec_proposer_name(options.proposer));
  }
  const DrafterOptions drafter{.tree_budget = options.tree_budget,
                               .tree_width = options.tree_width,
                               .tree_sampling = options.tree_sampling,
                               .tree_static_widths = options.tree_static_widths};
  ARBOR_RETURN_IF_ERROR(check_drafter_options(drafter));
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<spec::Proposer> proposer,
                         make_proposer(path, options, exec, device));
  if (proposer == nullptr) return std::unique_ptr<Drafter>();
  return std::make_unique<Drafter>(std::move(proposer), drafter);
}

}  // namespace

Result<std::unique_ptr<LocalExecutor>> LocalExecutor::load(const std::string& path,
                                                                 const ExecutorOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(DeviceChoice device,
                         choose_device(options.device, options.cuda_device, path));
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
  ro.tp = options.tp;
  // A recurrent model's speculation verifies in scratch slots: per running request one for a
  // chain, up to one per node for a tree.
  const int32_t scratch_per_seq =
      options.proposer == SpecProposer::kNone ? 0 : std::max(1, options.tree_budget);
  ro.state_slots = options.max_num_seqs * (1 + scratch_per_seq) + options.state_checkpoints;
  ro.load_mtp = options.proposer == SpecProposer::kMtp;
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> runner,
                         model::ModelRunner::load(path, ro));
  if (model::RecurrentStateCache* states = runner->recurrent_states()) {
    ARBOR_LOG(kInfo) << "recurrent state: " << options.max_num_seqs << " slots (--max-num-seqs)"
                     << (scratch_per_seq > 0
                             ? str_cat(" + ", options.max_num_seqs * scratch_per_seq,
                                       " scratch slots for speculation's drafts")
                             : std::string())
                     << " + " << options.state_checkpoints
                     << " checkpoints for prefix-cache hits (--state-checkpoints)"
                     << ", " << (model::RecurrentStateCache::bytes_per_slot(runner->config()) >> 10)
                     << " KiB each over " << runner->config().num_recurrent_layers()
                     << " Gated DeltaNet layers, committed as sequences use them";
  }
  const bool model_drafter =
      options.proposer == SpecProposer::kDraft || options.proposer == SpecProposer::kMtp;
  if (model_drafter && runner->kv_layout().groups[0].window > 0) {
    // A draft model writes and reads its K/V through the target's group-0 tables, which then
    // must keep every block: without a full-attention layer, no group does.
    ARBOR_LOG(kInfo) << "kv cache: every layer of " << path << " has a sliding window and "
                     << "--spec " << spec_proposer_name(options.proposer)
                     << " shares the target's block tables, so no block is released "
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
  ARBOR_ASSIGN_OR_RETURN(std::optional<RankHead> rank_head,
                         rank_head_from_file(runner->model()));
  auto exec = std::make_unique<LocalExecutor>(std::move(runner), nullptr);
  if (exec->recurrent_state_slots() > 0 && options.state_checkpoints > 0) {
    exec->reserve_state_checkpoints(options.state_checkpoints);
  }
  if (options.proposer != SpecProposer::kNone && exec->recurrent_state_slots() > 0) {
    exec->split_state_slots_for_speculation(options.max_num_seqs);
  }
  exec->set_top_k_candidates(top_k_candidates);
  if (rank_head) exec->set_rank_head(std::move(*rank_head));
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                         tokenizer::Tokenizer::from_file(path));
  exec->set_grammar_vocabulary(grammar_vocabulary(*tok));
  // A TP rank other than 0 verifies rank 0's drafts (TpSync) and proposes none.
  if (options.tp.rank == 0) {
    ARBOR_ASSIGN_OR_RETURN(exec->drafter_, make_drafter(path, options, *exec, device));
  }
  return exec;
}

Status check_tp_launch(const std::string& path, int tp_size) {
  if (tp_size <= 1) return ok_status();
  ARBOR_ASSIGN_OR_RETURN(const gguf::GgufFile file, gguf::GgufFile::open(path));
  ARBOR_ASSIGN_OR_RETURN(const model::ModelConfig config, model::ModelConfig::from_gguf(file));
  const Status st = model::check_tp_config(config, tp_size);
  if (!st.ok()) return st.with_context(str_cat(tp_size, " tensor-parallel shards"));
  return ok_status();
}

std::string_view spec_proposer_name(SpecProposer p) {
  switch (p) {
    case SpecProposer::kNone: return "off";
    case SpecProposer::kNgram: return "ngram";
    case SpecProposer::kSuffix: return "suffix";
    case SpecProposer::kDraft: return "draft";
    case SpecProposer::kMtp: return "mtp";
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

}  // namespace arbor::executor
