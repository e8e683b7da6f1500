// The host-side planning of CudaForwardOps, kept apart from the CUDA calls so that it is tested
// without a GPU: where each weight goes in the one device allocation, how a batch is packed for
// its single upload, and how a list of region copies splits into runs that may run in parallel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_type.h"
#include "model/forward_batch.h"
#include "model/forward_ops.h"
#include "model/llama_model.h"

namespace arbor::cuda {

// Every distinct host tensor of a model's weights, with its place in one device allocation.
struct UploadPlan {
  struct Tensor {
    std::string name;        // GGUF name, for errors and logs
    const void* host = nullptr;
    size_t host_stride = 0;  // bytes between host rows
    size_t row_bytes = 0;    // dense bytes of a row (= the device row stride)
    int64_t rows = 0;        // 1 for a vector
    size_t offset = 0;       // from the allocation's base; a multiple of 256
  };
  std::vector<Tensor> tensors;  // in upload order; a tensor seen twice (tied output) once
  size_t total_bytes = 0;
};

// Plans the upload of model.weights() in model::for_each_weight's order (absent ones skipped).
// Each matrix must have a type `supported` accepts, else unimplemented naming the tensor and its
// type ("blk.0.attn_q.weight has type iq4_xs, which the CUDA matmul does not support (...)").
Result<UploadPlan> plan_weight_upload(const model::LlamaModel& model,
                                      bool (*supported)(gguf::GgmlType));

// host's structure with every pointer moved to base + its tensor's offset (found by host
// pointer), views dense (row_stride = row bytes) and `packed` null.
model::LlamaWeights device_weights(const model::LlamaWeights& host, const model::ModelConfig& c,
                                   const UploadPlan& plan, uint8_t* base);

// ok when the CUDA executor runs this model as it has been run on a GPU: the llama and qwen2
// rows without the newer variants (sliding windows, QK-norm, post-norms, soft-caps, NoPE
// layers, YaRN / LongRoPE / linear scaling, weight scales, output or FFN biases, mixtures of
// experts). Otherwise
// unimplemented naming the variant and suggesting --device cpu.
Status check_cuda_supports(const model::ModelConfig& c, const model::LlamaWeights& w);

// A batch's ten arrays packed back to back, each at a multiple of 256 bytes, then the three
// arrays of each further KV cache group (batch.more_kv_groups).
struct StagingLayout {
  size_t offsets[11] = {};  // tokens, positions, qo_indptr, kv_indptr, kv_page_indices, kv_len,
                            // slot_mapping, logits_indices, mask_indptr, mask_bits,
                            // hidden_indices
  // [3 * (num_kv_groups - 1)]: each further group's kv_indptr, kv_page_indices, slot_mapping
  std::vector<size_t> group_offsets;
  size_t total_bytes = 0;
};
StagingLayout staging_layout(const model::ForwardBatch& batch);
// Copies the arrays into `dst` (total_bytes) at their offsets.
void write_staging(const model::ForwardBatch& batch, const StagingLayout& lay, uint8_t* dst);
// The batch whose arrays are those at `base` (the staged copy); empty arrays stay empty (null).
// The further KV cache groups' array views go into *groups (host memory the caller keeps while
// it uses the staged batch; may be null when the batch has one group).
model::ForwardBatch staged_batch(const model::ForwardBatch& batch, const StagingLayout& lay,
                                 const uint8_t* base,
                                 std::vector<model::KvGroupArrays>* groups = nullptr);

// Copies [first, first + count) of a list, which may run at the same time: no copy of the run
// reads or writes bytes an earlier copy of the run writes, nor writes bytes an earlier one reads.
struct CopyRun {
  int32_t first = 0;
  int32_t count = 0;
  size_t max_bytes = 0;
};
// Greedy split of `copies` in order into hazard-free runs; zero-byte copies join any run.
// O(n log n).
std::vector<CopyRun> copy_runs(std::span<const model::DeviceMemory::Copy> copies);

}  // namespace arbor::cuda
