#include "model/recurrent_state.h"

#include "base/check.h"

namespace arbor::model {

size_t RecurrentStateCache::bytes_per_slot(const ModelConfig& c) {
  return static_cast<size_t>(c.num_recurrent_layers()) *
         static_cast<size_t>(c.ssm.conv_state_floats() + c.ssm.ssm_state_floats()) * sizeof(float);
}

Result<std::unique_ptr<RecurrentStateCache>> RecurrentStateCache::create(const ModelConfig& c,
                                                                         int32_t num_slots,
                                                                         DeviceMemory& memory) {
  if (num_slots < 1) return invalid_argument("recurrent state slots: ", num_slots, " (need >= 1)");
  if (!c.has_recurrent_layers() || c.num_recurrent_layers() == 0) {
    return invalid_argument(c.arch_name, " has no recurrent layers");
  }
  const size_t bytes = bytes_per_slot(c) * static_cast<size_t>(num_slots);
  Result<void*> p = memory.allocate(bytes);
  if (!p.ok()) {
    return p.status().with_context(str_cat("recurrent state: ", num_slots, " slots of ",
                                           bytes_per_slot(c), " bytes"));
  }
  return std::unique_ptr<RecurrentStateCache>(
      new RecurrentStateCache(c, num_slots, static_cast<float*>(*p), bytes, memory));
}

RecurrentStateCache::RecurrentStateCache(const ModelConfig& c, int32_t num_slots, float* data,
                                         size_t bytes, DeviceMemory& memory)
    : num_slots_(num_slots),
      conv_floats_(c.ssm.conv_state_floats()),
      ssm_floats_(c.ssm.ssm_state_floats()),
      data_(data),
      bytes_(bytes),
      memory_(memory) {
  for (const LayerSpec& l : c.layers) layer_index_.push_back(l.recurrent ? num_recurrent_++ : -1);
}

RecurrentStateCache::~RecurrentStateCache() { memory_.release(data_); }

float* RecurrentStateCache::conv(int layer) {
  const int r = layer_index_.at(static_cast<size_t>(layer));
  ARBOR_CHECK(r >= 0) << "layer " << layer << " is not recurrent";
  return data_ + static_cast<int64_t>(r) * num_slots_ * (conv_floats_ + ssm_floats_);
}

float* RecurrentStateCache::ssm(int layer) {
  return conv(layer) + static_cast<int64_t>(num_slots_) * conv_floats_;
}

void RecurrentStateCache::copy_slot(int32_t src, int32_t dst) {
  ARBOR_CHECK(src >= 0 && src < num_slots_ && dst >= 0 && dst < num_slots_)
      << "slots " << src << " -> " << dst << " of " << num_slots_;
  if (src == dst) return;
  std::vector<DeviceMemory::Copy> copies;
  for (int layer = 0; layer < static_cast<int>(layer_index_.size()); ++layer) {
    if (layer_index_[layer] < 0) continue;
    float* c = conv(layer);
    float* s = ssm(layer);
    copies.push_back({c + dst * conv_floats_, c + src * conv_floats_,
                      static_cast<size_t>(conv_floats_) * sizeof(float)});
    copies.push_back({s + dst * ssm_floats_, s + src * ssm_floats_,
                      static_cast<size_t>(ssm_floats_) * sizeof(float)});
  }
  memory_.copy(copies);
}

}  // namespace arbor::model
