// The replica protocol's values (router/replica.proto, docs/router.md) and their conversions:
// engine::GenerateRequest <-> wire::GenerateCall, engine::StreamEvent <-> wire::GenerateEvent,
// block hashes <-> wire::KvEventBatch. Decoding checks every enum and count and names the field
// it refuses; no gRPC here (replica_service.h and replica_client.h carry the messages).
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "kv/block_pool.h"
#include "router/replica.pb.h"

namespace arbor::router {

// Bumped when a message's meaning changes; every call carries it and the replica refuses
// another (FAILED_PRECONDITION, naming both).
inline constexpr uint32_t kReplicaProtocolVersion = 1;

void encode_request(const engine::GenerateRequest& r, wire::GenerateCall* m);
// Errors (kInvalidArgument): an enum out of range, a negative count. The engine's submit()
// validates the rest (token ids, lengths, sampling ranges).
Result<engine::GenerateRequest> decode_request(const wire::GenerateCall& m);

void encode_event(const engine::StreamEvent& e, wire::GenerateEvent* m);
// Errors: a stop kind or status code out of range; logprobs not parallel to token_ids.
Result<engine::StreamEvent> decode_event(const wire::GenerateEvent& m);

// Appends `events` to *m (parallel arrays).
void encode_kv_events(std::span<const kv::KvEvent> events, wire::KvEventBatch* m);
// Errors: the arrays are not parallel.
Result<std::vector<kv::KvEvent>> decode_kv_events(const wire::KvEventBatch& m);

}  // namespace arbor::router
