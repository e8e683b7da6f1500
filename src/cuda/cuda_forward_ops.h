// model::ForwardOps on one CUDA device: the forward's operators as kernels on one stream.
//
// make_cuda_forward_ops() uploads every weight of `model` once (token_embd, each layer's
// matrices, norms and biases, output — the same device pointer as token_embd when tied —,
// rope_freqs), densely (row_stride = the dense row size, `packed` null), and exposes the copy
// through weights(). The model may be destroyed afterwards. Matmuls run through cuda::matmul
// (cuda/matmul.h), the rest through src/cuda's kernels (docs/cuda.md); every op is batch
// invariant, and attention splits long contexts only at fixed 512-key positions.
//
// Threads: one thread issues everything (the engine thread). Memory from allocate() is
// device memory, zeroed; to_host() waits for every op issued before it.
//
// Usable from code not compiled by nvcc. Built with -DARBOR_CUDA=OFF, make_cuda_forward_ops()
// returns an error saying so.
#pragma once

#include <memory>

#include "base/status.h"
#include "model/forward_ops.h"
#include "model/llama_model.h"

namespace arbor::cuda {

// Errors: failed_precondition "no CUDA device <device>: ..." when there is no such device
// (the reason, or the device count); unimplemented naming the tensor and its type when a weight
// type has no CUDA kernel (matmul_supported); resource_exhausted with the byte counts when the
// weights do not fit in the device's free memory.
Result<std::unique_ptr<model::ForwardOps>> make_cuda_forward_ops(const model::LlamaModel& model,
                                                                 int device);

// Whether the CUDA forward runs `model` at all: its architecture and block variants
// (check_cuda_supports in host_plan.h) and every matrix type (matmul_supported). The error
// (unimplemented) says what the GPU path lacks and names --device cpu. --device auto asks this
// before it chooses a GPU (executor/device.h). Host code only: no device is touched.
Status check_cuda_runs(const model::LlamaModel& model);

}  // namespace arbor::cuda
