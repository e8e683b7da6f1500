// The shard protocol's two ends as pure logic (docs/shards.md; messages in shard/shard.proto):
//
//   StepEncoder  (engine side) turns a SchedulerOutput into a wire::Step of deltas against what
//                the shard's incarnation holds, and keeps that mirror.
//   StepDecoder  (shard side) validates a wire::Step against the shard's own per-request state
//                and limits and turns it back into the full SchedulerOutput the LocalExecutor
//                runs. A violation is an error naming the field and the rule; nothing of the
//                message is applied then.
//
// Plus the by-value conversions of results (StepResult <-> wire::StepReply). No gRPC here: the
// transport is shard/shard_server.h and shard/remote_executor.h.
//
// Threading: each object belongs to one thread (the engine thread, or the shard's session).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "shard/shard.pb.h"
#include "step/step.h"

namespace arbor::shard {

// Bumped when a message's meaning changes; Hello and HelloReply carry it and must agree.
inline constexpr uint32_t kProtocolVersion = 2;  // 2: Hello.tp_group

class StepEncoder {
 public:
  // A new incarnation: the shard holds no request.
  void reset() {
    known_.clear();
    step_ = 0;
  }
  // Fills *msg with `output` as deltas and records what the shard will hold after it: the new
  // requests, each scheduled request's block tables. Finished and preempted ids the shard does
  // not hold (a previous incarnation's) are left out.
  void encode(const step::SchedulerOutput& output, uint64_t incarnation, wire::Step* msg);
  bool knows(step::RequestId id) const { return known_.contains(id); }
  size_t num_known() const { return known_.size(); }

 private:
  struct Known {
    std::vector<std::vector<step::BlockId>> tables;  // [num_kv_groups][num_blocks]
  };
  void encode_tables(const step::ScheduledRequest& s, Known& k, wire::Scheduled* m);
  std::unordered_map<step::RequestId, Known> known_;
  int64_t step_ = 0;  // the last message's step number (1, 2, ... per incarnation)
};

// What a shard checks every Step against.
struct DecoderLimits {
  int32_t vocab_size = 0;
  int64_t num_kv_blocks = 0;  // block ids are in [0, num_kv_blocks)
  int32_t block_size = 0;
  int32_t num_kv_groups = 1;  // block tables per request
};

// A refused message: the field ("requests[2].tables[0].append[5]") and the rule it broke.
struct WireError {
  std::string field;
  Status status;  // kInvalidArgument, its message starting with the step and the field
};

class StepDecoder {
 public:
  explicit StepDecoder(const DecoderLimits& limits) : limits_(limits) {}

  // Hello: a new incarnation; forgets every request and the step count. Returns the ids it
  // forgot (the executor must forget them too).
  std::vector<step::RequestId> reset(uint64_t incarnation);
  uint64_t incarnation() const { return incarnation_; }

  // Validates `msg` and fills *out with the full SchedulerOutput (block tables whole, new
  // requests' data); then applies it to the per-request state. On a violation, returns it and
  // changes nothing. Checked: the incarnation; the step number (the previous + 1, 1 first); finished and
  // preempted ids known; new requests unknown, with a prompt of 1..num_tokens tokens, token ids
  // in the vocabulary, valid sampling parameters and pooling type; scheduled requests known and
  // once each, with 1 <= scheduled tokens, 0 <= drafts < scheduled tokens (drafts follow one
  // committed token), committed tokens run within the tokens known, new token ids in the
  // vocabulary, table edits within the table held, block ids in [0, num_kv_blocks), tables of
  // one length covering every slot the step writes, prompt logprobs within the prompt, pool
  // only for a pooling request and sample only for a sampling one; block copies between usable
  // blocks of at most block_size tokens; total_num_scheduled_tokens the sum.
  std::optional<WireError> decode(const wire::Step& msg, step::SchedulerOutput* out);

  size_t num_known() const { return known_.size(); }
  std::vector<step::RequestId> known_ids() const;

 private:
  struct Known {
    int64_t num_tokens = 0;
    int32_t num_prompt_tokens = 0;
    bool pooling = false;
    std::vector<std::vector<step::BlockId>> tables;
  };
  // Per-request state as the message leaves it, before it is committed.
  struct Staged {
    const Known* base = nullptr;  // null: a new request of this message
    Known next;
    bool tables_from_base = false;  // next.tables unused: base's tables, unedited
    bool scheduled = false;         // named by one of the message's requests
  };
  // A list entry's name, "requests[3]", formatted only when an error names it.
  struct Field {
    const char* list;
    int index;
    std::string operator+(const char* suffix) const;
  };
  std::optional<WireError> check_forgets(const wire::Step& msg,
                                         std::unordered_map<step::RequestId, Staged>& staged);
  std::optional<WireError> check_new(const wire::Step& msg, step::SchedulerOutput* out,
                                     std::unordered_map<step::RequestId, Staged>& staged);
  std::optional<WireError> check_scheduled(const wire::Scheduled& m, const Field& field,
                                           Staged& st, step::ScheduledRequest* s) const;
  std::optional<WireError> check_tables(const wire::Scheduled& m, const Field& field,
                                        Staged& st, step::ScheduledRequest* s) const;
  std::optional<WireError> check_copies(const wire::Step& msg, step::SchedulerOutput* out) const;
  WireError error(const std::string& field, const std::string& message) const;

  DecoderLimits limits_;
  uint64_t incarnation_ = 0;
  int64_t step_ = 0;           // of the last step applied (0: none yet)
  int64_t decoding_step_ = 0;  // of the message being decoded (for error messages)
  std::unordered_map<step::RequestId, Known> known_;
  std::unordered_map<step::RequestId, Staged> staged_;  // the message being decoded (scratch)
};

// Sampling parameters on the wire and back (the grammar with its thinking block included).
void encode_sampling(const sampling::SamplingParams& p, wire::Sampling* m);
sampling::SamplingParams decode_sampling(const wire::Sampling& m);

// A step's result on the wire (rank 0's reply) and back. decode_result checks only the message's
// own shape (parallel arrays of one length, a known error code); step::validate_step_result
// checks it against the step.
void encode_result(const step::StepResult& result, wire::StepReply* m);
Result<step::StepResult> decode_result(const wire::StepReply& m);

}  // namespace arbor::shard
