// RecurrentStateCache: the per-sequence states of a model's Gated DeltaNet layers
// (kernels/gated_delta_net.h), in fixed slots beside the paged KV cache.
//
// Layout, per recurrent layer r (the model's recurrent layers in order):
//   conv [num_slots][conv_dim][conv_kernel - 1]   f32, the last inputs of the causal conv
//   ssm  [num_slots][Hv][dv][dk]                   f32, per head the transposed delta-rule state
// A slot holds one sequence's state after its last computed token; which sequence owns which
// slot is the caller's (ForwardBatch::state_slots). A sequence whose tokens start at position 0
// starts from a zero state whatever its slot held, so a freed slot needs no clearing.
// All memory is allocated once, in create(), in the device's memory (pages committed on first
// write on the host, so unused slots cost address space only).
// Not thread-safe: the forward writes a sequence's slot while no one else touches it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "model/forward_ops.h"
#include "model/model_config.h"

namespace arbor::model {

class RecurrentStateCache {
 public:
  // Bytes of one slot over every recurrent layer of `c` (conv and ssm state).
  static size_t bytes_per_slot(const ModelConfig& c);
  // num_slots >= 1 slots for the recurrent layers of `c` (which must have some), zeroed.
  // Errors: num_slots < 1, or the allocation failing (the message has the byte count).
  // `memory` must outlive the cache.
  static Result<std::unique_ptr<RecurrentStateCache>> create(const ModelConfig& c,
                                                             int32_t num_slots,
                                                             DeviceMemory& memory);
  ~RecurrentStateCache();
  RecurrentStateCache(const RecurrentStateCache&) = delete;
  RecurrentStateCache& operator=(const RecurrentStateCache&) = delete;

  int32_t num_slots() const { return num_slots_; }
  size_t total_bytes() const { return bytes_; }
  // Model layer `layer`'s states (CHECKed recurrent): conv [num_slots, conv_dim, K-1] and
  // ssm [num_slots, Hv, dv, dk].
  float* conv(int layer);
  float* ssm(int layer);
  // Copies slot src's state onto slot dst in every layer (a fork's child continuing its
  // parent's sequence). src == dst is a no-op.
  void copy_slot(int32_t src, int32_t dst);

 private:
  RecurrentStateCache(const ModelConfig& c, int32_t num_slots, float* data, size_t bytes,
                      DeviceMemory& memory);

  int32_t num_slots_;
  int64_t conv_floats_;          // one slot, one layer
  int64_t ssm_floats_;
  std::vector<int> layer_index_;  // [num_layers] -> recurrent layer index, or -1
  int num_recurrent_ = 0;
  float* data_;  // [recurrent layers][conv pool, ssm pool]
  size_t bytes_;
  DeviceMemory& memory_;
};

}  // namespace arbor::model
