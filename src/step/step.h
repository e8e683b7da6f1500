// The step protocol's values: what the scheduler asks of an executor (SchedulerOutput) and what
// the executor returns (StepResult). Plain values, no pointers into scheduler state, so that an
// executor may live on another device or in another process (docs/engine.md, "Step protocol").
//
// The executor keeps per-request state between steps (the committed tokens, for penalties and
// proposers): it learns a request from NewRequestData when the request (re)enters the running
// set, the tokens committed since through ScheduledRequest::new_token_ids, and forgets it when
// its id is in finished_ids or preempted_ids.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace arbor::step {

using RequestId = uint64_t;
using BlockId = int32_t;

// Copy the K/V of the first num_tokens slots of src_block into dst_block (every layer, K and V;
// block ids are unique over every KV cache group, so a copy names no group).
struct BlockCopy {
  BlockId src_block = 0;
  BlockId dst_block = 0;
  int32_t num_tokens = 0;
};

// Pooling requests (embeddings, reranking; docs/engine.md, "Pooling requests"): instead of sampling, the step
// that runs a request's last prompt token returns one vector pooled from the final hidden states
// (after the output norm) of its prompt. Numbered as llama.cpp's llama_pooling_type.
enum class PoolingType : uint8_t {
  kMean = 1,  // the mean of every prompt token's state: [dim]
  kCls = 2,   // the first prompt token's state: [dim]
  kLast = 3,  // the last prompt token's state: [dim]
  kRank = 4,  // the rank head over the last token's state, softmaxed: [classes]
};
std::string_view pooling_type_name(PoolingType type);  // "mean", "cls", "last", "rank"
// "mean", "cls", "last", "rank" (or llama.cpp's numbers "1".."4"); nullopt otherwise.
std::optional<PoolingType> parse_pooling_type(std::string_view name);
// Whether the pooled vector reads every prompt row (mean) or the first (cls): such a request
// runs every prompt token (no prefix-cache hit), where last / rank need only the last row.
bool pools_early_rows(PoolingType type);

// A request the executor has not seen (admitted, resumed after preemption, or a fork child).
struct NewRequestData {
  RequestId request_id = 0;
  std::vector<int32_t> token_ids;   // [num_tokens] committed: prompt + generated so far
  int32_t num_prompt_tokens = 0;
  sampling::SamplingParams sampling{};
  uint64_t seed = 0;                // draws come from Rng::at(seed, position, stream)
  // A pooling request: it never samples; its prompt's hidden states are pooled (see `pool`).
  std::optional<PoolingType> pooling;
  // A fork child entering with its parent's computed tokens: the parent's id (finished in the
  // same SchedulerOutput); its per-request state in the executor (a recurrent model's state
  // slot) continues this request's. 0 otherwise.
  RequestId fork_of = 0;
  // A model with recurrent layers, admitted on a prefix-cache hit: the checkpoint slot holding
  // the state after the hit's tokens (ModelExecutor::state_checkpoints; its first
  // ScheduledRequest's num_computed_tokens), which this request's state continues. -1: none.
  int32_t state_checkpoint = -1;
};

// One request's work in a step. With c = num_computed_tokens and k = num_drafts, the step runs
// the committed tokens [c, c + num_scheduled_tokens - k) followed by k drafts in the slots after
// them, writing K/V for all of them into the slots of block_tables.
//
// Drafts stay with the executor: it proposed a TokenTree for the request after its previous
// step (parents first; a chain is the width-1 tree; docs/speculation.md, "Token trees") and
// reported only its shape (RequestResult::next_drafts); the scheduler answers with k, and the
// executor verifies the tree's first k nodes (a prefix in node order is a tree). A draft at depth
// d (d = 1 for the root's children) has position c' + d, where c' is the last committed token's
// position, and sees exactly the committed tokens and its ancestors. Slots are by index (draft i
// in slot c' + 1 + i) until verification; then the executor moves the accepted path's K/V to
// slots c' + 1, c' + 2, ... (KV compaction), so the cache holds what a plain run would.
struct ScheduledRequest {
  RequestId request_id = 0;
  int64_t num_computed_tokens = 0;     // committed tokens whose K/V are cached before this step
  int32_t num_scheduled_tokens = 0;    // committed tokens run this step + k
  std::vector<int32_t> new_token_ids;  // committed since the executor last heard of it
  // k: verify the first k nodes of the drafts the executor proposed for this request last step
  // (0 <= k <= their number; 0 when it proposed none). Drafts follow one committed token.
  int32_t num_drafts = 0;
  // [num_kv_groups][num_blocks] the whole block table of every KV cache group (one group unless
  // the model has sliding-window layers; ModelExecutor::kv_group_windows). All tables have one
  // length; a sliding group's entries before its window are 0 (released: never read).
  std::vector<std::vector<BlockId>> block_tables;
  // The step reaches the last committed token: the executor samples (or, with drafts, verifies)
  // and returns a RequestResult. Logits rows: 1 + k when set, none otherwise.
  bool sample = false;
  // What to propose after this step (sampling requests only): drafts of at most
  // max_next_draft_tokens levels; a token tree of at most max_next_draft_nodes nodes when that is
  // > 0, else a chain. 0 levels: propose nothing (and forget any drafts kept).
  int32_t max_next_draft_tokens = 0;
  int32_t max_next_draft_nodes = 0;
  // Prompt logprobs (the request's sampling.prompt_logprobs is set): score the prompt tokens at
  // positions [prompt_logprobs_begin, prompt_logprobs_end), each from the logits row of the
  // position before it, which this step runs: c + 1 <= begin and end <= c + committed tokens run
  // + 1 (the chunk's last row scores the next chunk's first token), end <= num_prompt_tokens.
  // The scheduler never asks for a position twice (preemption, recompute) nor skips one (prefix
  // cache hits stop before the first position not yet scored). Empty (begin == end): none.
  int64_t prompt_logprobs_begin = 0;
  int64_t prompt_logprobs_end = 0;
  // A pooling request's step that runs its last prompt token: the executor returns its
  // PoolingResult. Earlier chunks of a mean (or cls) request feed the pooled state the executor
  // keeps for it; a preempted request starts that state over with its recompute.
  bool pool = false;
  // A model with recurrent layers: save the state after the request's first save_state_at
  // tokens (num_computed_tokens < save_state_at <= the committed tokens this step runs) into
  // checkpoint slot save_state_slot, for later prefix-cache hits. 0 / -1: none.
  int64_t save_state_at = 0;
  int32_t save_state_slot = -1;
  bool is_prompt_chunk = false;        // informational: the step includes prompt tokens
  bool is_new = false;                 // informational: admitted (or resumed) this step

  int32_t num_draft_tokens() const { return num_drafts; }
  int32_t num_logits() const { return sample ? 1 + num_draft_tokens() : 0; }
  int32_t num_prompt_logprobs() const {
    return static_cast<int32_t>(prompt_logprobs_end - prompt_logprobs_begin);
  }
  // Entries of each block table (every group's has this many).
  int64_t num_table_blocks() const {
    return block_tables.empty() ? 0 : static_cast<int64_t>(block_tables[0].size());
  }
};

// A draft parent's name for the last committed token (sampling::TokenTree::kRoot).
inline constexpr int32_t kDraftRoot = -1;

// ok when `parents` ([k]) describes a token tree over k drafts: each entry kDraftRoot or an
// earlier index. Otherwise kInternal naming the draft.
Status check_draft_parents(std::span<const int32_t> parents);
// Depth of every draft (1 for the root's children): [k]. parents: valid.
std::vector<int32_t> draft_depths(std::span<const int32_t> parents);
// The deepest draft's depth (0 for none). parents: valid.
int32_t draft_levels(std::span<const int32_t> parents);
// Whether the drafts form a chain: parents[i] == i - 1 for every i (true for none).
bool is_chain(std::span<const int32_t> parents);

// The shape of the drafts an executor proposed and keeps for the next step: what the scheduler
// needs to plan with (never the tokens).
struct DraftShape {
  std::vector<int32_t> parent_ids;  // [n] kDraftRoot or an earlier index; parents first
  // [n] or empty: the proposer's probability of each draft given its parent (the draft model's,
  // or a model-free proposer's relative confidence); the SpecPolicy ranks tree nodes by it and
  // prices a chain's drafts by it (the draft model's confidence). Empty for drafts drawn from q
  // (a prefix chosen by their drawn values would no longer be draws from q) and where every
  // probability would be 1 (no ranking: a model-free proposer's chain).
  std::vector<float> probs;
  int32_t size() const { return static_cast<int32_t>(parent_ids.size()); }
  bool empty() const { return parent_ids.empty(); }
};

struct SchedulerOutput {
  int64_t step = 0;
  std::vector<NewRequestData> new_requests;  // learn these before running `requests`
  std::vector<ScheduledRequest> requests;    // running first, then newly admitted
  std::vector<BlockCopy> block_copies;       // copy-on-write of forks: do before the forward
  std::vector<RequestId> preempted_ids;      // preempted this step: forget them
  std::vector<RequestId> finished_ids;       // finished since the previous schedule(): forget
  int32_t total_num_scheduled_tokens = 0;
  bool empty() const { return requests.empty(); }
};

struct SampledToken {
  int32_t token_id = 0;
  float logprob = 0.0f;                              // 0 unless logprobs were asked for
  std::vector<sampling::TokenLogprob> top_logprobs;  // [num_top] by decreasing logprob
};

// One sampling request's outcome: the accepted drafts, then one token sampled from the target
// (recovered after a rejection, or the bonus token when every draft was accepted). The accepted
// drafts are a root-to-node path of the verified tree (accepted_draft_indices; 0, 1, ... for a
// chain) and their K/V has been compacted into the slots after the last committed token before
// execute() returns.
struct RequestResult {
  RequestId request_id = 0;
  // Not ok: the model failed for this request alone (its logits were not finite); tokens,
  // num_accepted and the next drafts are empty, and the engine ends the request with this
  // error (HTTP 500) while every other request of the step goes on.
  Status error;
  std::vector<SampledToken> tokens;  // [num_accepted + 1]
  int32_t num_draft_tokens = 0;      // drafts verified (the ScheduledRequest's k)
  int32_t num_accepted = 0;          // drafts accepted, <= num_draft_tokens
  // [num_accepted] the accepted path (draft indices, the root's child first).
  std::vector<int32_t> accepted_draft_indices;
  // The drafts proposed for the next step, kept by the executor: at most max_next_draft_tokens
  // levels and, when max_next_draft_nodes > 0, that many nodes (else a chain).
  DraftShape next_drafts;
  // The first kept draft the step did not verify, when it verified a chain of k >= 0 drafts and
  // accepted all k, and the kept drafts continue that chain: 1 when that draft (draft k) is the
  // token sampled after the accepted ones (tokens[k]), 0 when not; -1 otherwise. The scheduler
  // learns acceptance from it for free: while the policy declines drafts (k = 0), and for the
  // level after the longest chain it verifies (so it learns what a longer chain would be worth).
  int32_t unverified_first_draft_agreed = -1;
};

// One request's prompt logprobs of a step: entries[i] scores the prompt token at position
// first_position + i. Returned for every ScheduledRequest with a non-empty prompt logprobs range,
// whether or not it samples.
struct PromptLogprobsResult {
  RequestId request_id = 0;
  int64_t first_position = 0;                     // the range's begin
  std::vector<sampling::PromptLogprob> entries;   // [end - begin]
};

// A pooling request's vector: [dim] (mean, cls, last; not normalised) or [classes] (rank,
// softmaxed over the classes).
struct PoolingResult {
  RequestId request_id = 0;
  // Not ok: the model failed for this request alone (a non-finite hidden state); values empty.
  Status error;
  std::vector<float> values;
};

// One RequestResult per ScheduledRequest with sample == true, in any order; one
// PromptLogprobsResult per ScheduledRequest with a prompt logprobs range, in any order; one
// PoolingResult per ScheduledRequest with pool == true, in any order.
struct StepResult {
  std::vector<RequestResult> requests;
  std::vector<PromptLogprobsResult> prompt_logprobs;
  std::vector<PoolingResult> pooled;
  // The mean over a mixture of experts' layers of the distinct experts the step's rows were
  // routed to in the target's forward (the SpecPolicy's expert term learns from it); 0 for a
  // dense model or an empty step, -1 when the executor could not tell.
  double experts_touched = 0.0;
  // Wall seconds the executor spent proposing drafts for the next step (the drafter's forwards
  // and picks; the SpecPolicy learns a draft token's real cost from it); 0: none proposed.
  double propose_seconds = 0.0;
};

// ok when `result` answers `output`: exactly one result per sampling request and none for
// others; num_draft_tokens equal to the request's k; 0 <= num_accepted <= k; tokens.size() ==
// num_accepted + 1; accepted_draft_indices naming num_accepted drafts below k; token ids in
// [0, vocab_size); unverified_first_draft_agreed -1, 0 or 1, and -1 when not every draft was
// accepted;
// next drafts within max_next_draft_tokens levels and max_next_draft_nodes
// nodes (a chain when that is 0), with valid parents and probabilities; prompt logprobs exactly for the
// requests with a range, covering it (first_position, one entry per position), with token ids and
// top ids in the vocabulary, ranks in [1, vocab_size] and at most kMaxLogprobs alternatives;
// pooled vectors exactly for the requests with `pool`, non-empty and finite unless failed.
// Otherwise kInternal naming the request and the broken rule.
Status validate_step_result(const SchedulerOutput& output, const StepResult& result,
                            int32_t vocab_size);
// ok when r's accepted drafts are a root-to-node path of the verified drafts (`parents`: the
// first k of the shape the executor reported); otherwise kInternal naming the request.
Status check_accepted_path(std::span<const int32_t> parents, const RequestResult& r);

}  // namespace arbor::step
