// src/cuda without CUDA (-DARBOR_CUDA=OFF): the public functions, reporting that.
#include "cuda/cuda_forward_ops.h"
#include "cuda/runtime.h"

namespace arbor::cuda {
namespace {

constexpr char kNoCuda[] =
    "arbor was built without CUDA (configure with -DARBOR_CUDA=ON and nvcc on PATH)";

}  // namespace

int device_count() { return 0; }

std::string describe_devices() { return std::string("no CUDA device: ") + kNoCuda; }

Result<double> measure_read_bandwidth_gbs(int device, size_t bytes, int reps) {
  return failed_precondition(kNoCuda);
}

Result<std::unique_ptr<model::ForwardOps>> make_cuda_forward_ops(const model::LlamaModel& model,
                                                                 int device) {
  return failed_precondition(kNoCuda);
}

Status check_cuda_runs(const model::LlamaModel&) { return failed_precondition(kNoCuda); }

}  // namespace arbor::cuda
