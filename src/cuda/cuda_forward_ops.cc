// CudaForwardOps: model::ForwardOps on one CUDA device and stream (cuda/cuda_forward_ops.h).
#include "cuda/cuda_forward_ops.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/log.h"
#include "cuda/attention.h"
#include "cuda/cuda_check.h"
#include "cuda/device_ops.h"
#include "cuda/matmul.h"
#include "cuda/runtime.h"
#include "cuda/host_plan.h"

namespace arbor::cuda {
namespace {

std::string gib(size_t bytes) { return str_cat((double)bytes / (double)(1ull << 30), " GiB"); }

// Device memory that grows on demand. Growing waits for the stream (earlier launches may still
// read the old buffer) and aborts with the byte counts when the device is full: ops return void.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;

  void* reserve(size_t want, cudaStream_t stream) {
    if (want <= bytes) return ptr;
    ARBOR_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (ptr != nullptr) ARBOR_CUDA_CHECK(cudaFree(ptr));
    ptr = nullptr;
    bytes = 0;
    const size_t grown = std::max(want, (size_t)4096);
    const cudaError_t err = cudaMalloc(&ptr, grown);
    ARBOR_CHECK(err == cudaSuccess) << "cannot grow a device buffer to " << grown << " bytes: "
                                    << cudaGetErrorString(err);
    bytes = grown;
    return ptr;
  }
  void free() {
    if (ptr != nullptr) (void)cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
  }
};

// Pinned host memory for asynchronous uploads. `ready` is recorded after the upload that last
// read it, so a refill first waits for that upload.
struct PinnedBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  cudaEvent_t ready = nullptr;

  void* acquire(size_t want) {
    if (ready != nullptr) ARBOR_CUDA_CHECK(cudaEventSynchronize(ready));
    if (want > bytes) {
      if (ptr != nullptr) ARBOR_CUDA_CHECK(cudaFreeHost(ptr));
      ptr = nullptr;
      const size_t grown = std::max(want, bytes * 2);
      ARBOR_CUDA_CHECK(cudaMallocHost(&ptr, grown));
      bytes = grown;
    }
    return ptr;
  }
  void release_after(cudaStream_t stream) {
    if (ready == nullptr) ARBOR_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ARBOR_CUDA_CHECK(cudaEventRecord(ready, stream));
  }
  void free() {
    if (ready != nullptr) {
      (void)cudaEventSynchronize(ready);
      (void)cudaEventDestroy(ready);
    }
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
    ptr = nullptr;
    ready = nullptr;
    bytes = 0;
  }
};

class CudaForwardOps final : public model::ForwardOps {
 public:
  explicit CudaForwardOps(int device) : device_(device), name_(str_cat("cuda:", device)) {}
  ~CudaForwardOps() override;

  Status init(const model::LlamaModel& model);

  std::string_view name() const override { return name_; }
  bool is_host() const override { return false; }
  Result<void*> allocate(size_t bytes) override;
  void release(void* p) override;
  void copy(std::span<const Copy> copies) override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;

  const model::LlamaWeights& weights() const override { return weights_; }
  model::ForwardBatch stage(const model::ForwardBatch& batch) override;
  void embed(const kernels::WeightView& table, const int32_t* tokens, int32_t n,
             float* x) override;
  void rope_tables(const int32_t* positions, int32_t n, const float* inv_freq, int half,
                   float mscale, float* cos, float* sin) override;
  void rms_norm_rows(const float* x, const int32_t* rows, int32_t n, const float* weight,
                     float* y, int dim, float eps) override;
  void matmul_multi(std::span<const kernels::WeightView* const> ws, const float* x,
                    std::span<float* const> ys, int32_t num_tokens) override;
  void qkv_epilogue(const model::QkvEpilogue& p) override;
  std::unique_ptr<model::AttentionPlan> new_attention_plan() override;
  void plan_attention(const kernels::PagedAttentionParams& p,
                      model::AttentionPlan& plan) override;
  void attention(const kernels::PagedAttentionParams& p,
                 const model::AttentionPlan& plan) override;
  using model::ForwardOps::attention;
  void add(float* y, const float* x, int64_t n) override;
  void add_gated_rows(float*, const float*, const float*, int32_t, int) override {
    refused("add_gated_rows");
  }
  void silu_mul(float* gate, const float* up, int64_t n) override;
  // Refused at load (check_cuda_supports): never called.
  void gelu_mul(float*, const float*, int64_t) override { refused("gelu_mul"); }
  void swiglu_oai(float*, const float*, int64_t, float, float) override {
    refused("swiglu_oai");
  }
  void add_expert_bias(float*, const kernels::ExpertRows&, const float*, int) override {
    refused("add_expert_bias");
  }
  void scale_bias(float*, int32_t, int, float, const float*) override { refused("scale_bias"); }
  void softcap(float*, int64_t, float) override { refused("softcap"); }
  int32_t route_experts(const model::ExpertRouting&) override {
    refused("route_experts");
    return -1;
  }
  void matmul_experts(std::span<const kernels::ExpertMatmul>, const float*,
                      const kernels::ExpertRows&) override {
    refused("matmul_experts");
  }
  void combine_experts(const float*, const int32_t*, const float*, int32_t, int, int,
                       float*) override {
    refused("combine_experts");
  }
  void gated_delta_net(const kernels::GatedDeltaNetParams&) override {
    refused("gated_delta_net");
  }
  void split_q_gate(const float*, int32_t, int, int, float*, float*) override {
    refused("split_q_gate");
  }
  void sigmoid_mul(float*, const float*, int64_t) override { refused("sigmoid_mul"); }
  void flag_nonfinite(const float* x, const int32_t* rows, int32_t n, int dim,
                      uint8_t* flags) override;
  void argmax_rows(const float* x, int32_t n, int32_t cols, int32_t* ids) override;
  void top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k, const float* scale,
                  int32_t* ids, float* values) override;

 private:
  void use_device() const { ARBOR_CUDA_CHECK(cudaSetDevice(device_)); }
  [[noreturn]] static void refused(const char* op) {
    ARBOR_CHECK(false) << op << " on CUDA: models that need it are refused at load";
    __builtin_unreachable();
  }
  Status upload_weights(const model::LlamaModel& model);
  AttentionGeometry attention_geometry(const kernels::PagedAttentionParams& p);
  void copy_run(const Copy* copies, const CopyRegion* device_regions, int32_t n);

  int device_;
  std::string name_;
  std::string device_name_;
  int num_sms_ = 1;
  cudaStream_t stream_ = nullptr;
  void* weights_mem_ = nullptr;
  model::LlamaWeights weights_;

  PinnedBuffer stage_host_;
  DeviceBuffer stage_dev_;
  PinnedBuffer copy_host_;
  DeviceBuffer copy_dev_;
  DeviceBuffer matmul_ws_;
  DeviceBuffer attn_ws_;

  // The last stage()'s attention geometry, for attention() calls over its arrays.
  const int32_t* staged_qo_indptr_ = nullptr;
  const int32_t* staged_kv_len_ = nullptr;
  int32_t staged_num_seqs_ = -1;
  AttentionGeometry staged_geometry_;
  std::vector<model::KvGroupArrays> staged_groups_;  // the last stage()'s further KV groups
};

CudaForwardOps::~CudaForwardOps() {
  if (stream_ != nullptr) {
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
  }
  stage_host_.free();
  copy_host_.free();
  stage_dev_.free();
  copy_dev_.free();
  matmul_ws_.free();
  attn_ws_.free();
  if (weights_mem_ != nullptr) (void)cudaFree(weights_mem_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Status CudaForwardOps::init(const model::LlamaModel& model) {
  ARBOR_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
  cudaDeviceProp prop{};
  ARBOR_RETURN_IF_ERROR(cuda_status(cudaGetDeviceProperties(&prop, device_),
                                    "cudaGetDeviceProperties"));
  device_name_ = prop.name;
  num_sms_ = std::max(1, prop.multiProcessorCount);
  ARBOR_RETURN_IF_ERROR(cuda_status(cudaStreamCreate(&stream_), "cudaStreamCreate"));
  return upload_weights(model);
}

Status CudaForwardOps::upload_weights(const model::LlamaModel& model) {
  ARBOR_ASSIGN_OR_RETURN(UploadPlan plan, plan_weight_upload(model, &matmul_supported));
  size_t free_bytes = 0, total_bytes = 0;
  ARBOR_RETURN_IF_ERROR(cuda_status(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  if (plan.total_bytes > free_bytes) {
    return resource_exhausted(name_, " (", device_name_, "): the weights need ", plan.total_bytes,
                              " bytes (", gib(plan.total_bytes), "), the device has ", free_bytes,
                              " bytes free of ", total_bytes);
  }
  const cudaError_t err = cudaMalloc(&weights_mem_, std::max<size_t>(plan.total_bytes, 256));
  if (err != cudaSuccess) {
    weights_mem_ = nullptr;
    ARBOR_RETURN_IF_ERROR(cuda_status(err, "cudaMalloc"));
  }
  auto* base = static_cast<uint8_t*>(weights_mem_);
  for (const UploadPlan::Tensor& t : plan.tensors) {
    // Dense tensors in one copy; strided rows (a view into a wider buffer) row by row.
    const cudaError_t copied =
        t.host_stride == t.row_bytes
            ? cudaMemcpy(base + t.offset, t.host, t.row_bytes * t.rows, cudaMemcpyHostToDevice)
            : cudaMemcpy2D(base + t.offset, t.row_bytes, t.host, t.host_stride, t.row_bytes,
                           t.rows, cudaMemcpyHostToDevice);
    ARBOR_RETURN_IF_ERROR(cuda_status(copied, str_cat("uploading ", t.name).c_str()));
  }
  weights_ = device_weights(model.weights(), model.config(), plan, base);
  ARBOR_LOG(kInfo) << name_ << " (" << device_name_ << ", " << num_sms_ << " SMs): uploaded "
                   << plan.tensors.size() << " weight tensors, " << gib(plan.total_bytes);
  return ok_status();
}

Result<void*> CudaForwardOps::allocate(size_t bytes) {
  use_device();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    return resource_exhausted(name_, ": cannot allocate ", bytes, " bytes (", free_bytes,
                              " bytes free of ", total_bytes, "): ", cudaGetErrorString(err));
  }
  ARBOR_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  return p;
}

void CudaForwardOps::release(void* p) {
  if (p == nullptr) return;
  use_device();
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(stream_));  // earlier ops may still use it
  ARBOR_CUDA_CHECK(cudaFree(p));
}

// Few regions: one cudaMemcpyAsync each. Many: the descriptors go up once and each run without
// hazards (copy_runs) is one kernel; runs stay in issue order on the stream.
void CudaForwardOps::copy(std::span<const Copy> copies) {
  if (copies.empty()) return;
  use_device();
  constexpr size_t kFewCopies = 4;
  if (copies.size() <= kFewCopies) {
    for (const Copy& c : copies) {
      if (c.bytes == 0) continue;
      ARBOR_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    return;
  }
  const size_t bytes = copies.size() * sizeof(CopyRegion);
  auto* host = static_cast<CopyRegion*>(copy_host_.acquire(bytes));
  for (size_t i = 0; i < copies.size(); ++i) host[i] = {copies[i].dst, copies[i].src, copies[i].bytes};
  auto* dev = static_cast<CopyRegion*>(copy_dev_.reserve(bytes, stream_));
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
  copy_host_.release_after(stream_);
  for (const CopyRun& run : copy_runs(copies)) {
    launch_copy_regions(dev + run.first, run.count, run.max_bytes, stream_);
  }
}

void CudaForwardOps::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  use_device();
  // Synchronous, so the host buffer may be reused at once even when it is pinned memory.
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaForwardOps::to_host(void* dst, const void* src, size_t bytes) {
  use_device();
  if (bytes > 0) {
    ARBOR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

model::ForwardBatch CudaForwardOps::stage(const model::ForwardBatch& batch) {
  use_device();
  const StagingLayout lay = staging_layout(batch);
  auto* host = static_cast<uint8_t*>(stage_host_.acquire(lay.total_bytes));
  write_staging(batch, lay, host);
  auto* dev = static_cast<uint8_t*>(stage_dev_.reserve(lay.total_bytes, stream_));
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(dev, host, lay.total_bytes, cudaMemcpyHostToDevice, stream_));
  stage_host_.release_after(stream_);
  const model::ForwardBatch staged = staged_batch(batch, lay, dev, &staged_groups_);
  staged_qo_indptr_ = staged.qo_indptr.data();
  staged_kv_len_ = staged.kv_len.data();
  staged_num_seqs_ = batch.num_seqs();
  staged_geometry_.num_tokens = batch.num_tokens();
  staged_geometry_.max_kv_len = 0;
  for (int32_t len : batch.kv_len) staged_geometry_.max_kv_len = std::max(staged_geometry_.max_kv_len, len);
  return staged;
}

void CudaForwardOps::embed(const kernels::WeightView& table, const int32_t* tokens, int32_t n,
                           float* x) {
  use_device();
  get_rows(table, tokens, n, x, stream_);
}

void CudaForwardOps::rope_tables(const int32_t* positions, int32_t n, const float* inv_freq,
                                 int half, float mscale, float* cos, float* sin) {
  ARBOR_CHECK(mscale == 1.0f) << "RoPE magnitude scaling on CUDA: refused at load";
  use_device();
  launch_rope_tables(positions, n, inv_freq, half, cos, sin, stream_);
}

void CudaForwardOps::rms_norm_rows(const float* x, const int32_t* rows, int32_t n,
                                   const float* weight, float* y, int dim, float eps) {
  use_device();
  launch_rms_norm_rows(x, rows, n, weight, y, dim, eps, stream_);
}

void CudaForwardOps::matmul_multi(std::span<const kernels::WeightView* const> ws, const float* x,
                                  std::span<float* const> ys, int32_t num_tokens) {
  ARBOR_CHECK_EQ(ws.size(), ys.size());
  use_device();
  size_t need = 0;
  for (const kernels::WeightView* w : ws) need = std::max(need, matmul_workspace_bytes(*w, num_tokens));
  void* workspace = need > 0 ? matmul_ws_.reserve(need, stream_) : nullptr;
  for (size_t i = 0; i < ws.size(); ++i) {
    cuda::matmul(*ws[i], x, ys[i], num_tokens, workspace, stream_);
  }
}

void CudaForwardOps::qkv_epilogue(const model::QkvEpilogue& p) {
  ARBOR_CHECK(!p.has_variants() && p.rope_dim > 0) << "QK-norm, scales, NoPE or temperature on "
                                                      "CUDA: refused at load";
  use_device();
  launch_qkv_epilogue(p, stream_);
}

// A step's attention plan on this device: the launch's plan, the geometry it was made from and
// what it was made for (checked against each call).
struct CudaAttentionPlan final : model::AttentionPlan {
  cuda::AttentionPlan launch;  // qualified: the base class name hides it here
  AttentionGeometry geometry;
  int num_seqs = -1, num_q_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  const int32_t* qo_indptr = nullptr;
  const int32_t* kv_len = nullptr;
};

// The launch needs the token count and the longest kv_len: from the last stage() when p points
// at its arrays, else read back from the device (a synchronisation; tests and odd callers only).
AttentionGeometry CudaForwardOps::attention_geometry(const kernels::PagedAttentionParams& p) {
  if (p.qo_indptr == staged_qo_indptr_ && p.kv_len == staged_kv_len_ &&
      p.num_seqs == staged_num_seqs_) {
    return staged_geometry_;
  }
  std::vector<int32_t> qo(p.num_seqs + 1), kv(p.num_seqs);
  to_host(qo.data(), p.qo_indptr, qo.size() * sizeof(int32_t));
  to_host(kv.data(), p.kv_len, kv.size() * sizeof(int32_t));
  AttentionGeometry g;
  g.num_tokens = qo.back();
  for (int32_t len : kv) g.max_kv_len = std::max(g.max_kv_len, len);
  return g;
}

std::unique_ptr<model::AttentionPlan> CudaForwardOps::new_attention_plan() {
  return std::make_unique<CudaAttentionPlan>();
}

void CudaForwardOps::plan_attention(const kernels::PagedAttentionParams& p,
                                    model::AttentionPlan& plan) {
  ARBOR_CHECK(p.window == 0 && p.softcap == 0.0f) << "sliding windows and soft-caps on CUDA: "
                                                     "refused at load";
  auto* c = dynamic_cast<CudaAttentionPlan*>(&plan);
  ARBOR_CHECK(c != nullptr) << "an attention plan of another device";
  c->num_seqs = p.num_seqs;
  c->num_q_heads = p.num_q_heads;
  c->num_kv_heads = p.num_kv_heads;
  c->head_dim = p.head_dim;
  c->block_size = p.block_size;
  c->qo_indptr = p.qo_indptr;
  c->kv_len = p.kv_len;
  if (p.num_seqs == 0) return;
  use_device();
  c->geometry = attention_geometry(p);
  c->launch = plan_paged_attention(p, c->geometry, num_sms_);
}

void CudaForwardOps::attention(const kernels::PagedAttentionParams& p,
                               const model::AttentionPlan& plan) {
  const auto* c = dynamic_cast<const CudaAttentionPlan*>(&plan);
  ARBOR_CHECK(c != nullptr) << "an attention plan of another device";
  // The grid, shared memory and workspace were sized for this layout.
  ARBOR_CHECK(c->num_seqs == p.num_seqs && c->num_q_heads == p.num_q_heads &&
              c->num_kv_heads == p.num_kv_heads && c->head_dim == p.head_dim &&
              c->block_size == p.block_size && c->qo_indptr == p.qo_indptr &&
              c->kv_len == p.kv_len && p.window == 0 && p.softcap == 0.0f)
      << "an attention plan made for another layout";
  if (p.num_seqs == 0) return;
  use_device();
  void* workspace = c->launch.workspace_bytes > 0
                        ? attn_ws_.reserve(c->launch.workspace_bytes, stream_)
                        : nullptr;
  launch_paged_attention(p, c->geometry, c->launch, workspace, stream_);
}

void CudaForwardOps::add(float* y, const float* x, int64_t n) {
  use_device();
  launch_add(y, x, n, stream_);
}

void CudaForwardOps::silu_mul(float* gate, const float* up, int64_t n) {
  use_device();
  launch_silu_mul(gate, up, n, stream_);
}

void CudaForwardOps::flag_nonfinite(const float* x, const int32_t* rows, int32_t n, int dim,
                                    uint8_t* flags) {
  use_device();
  launch_flag_nonfinite(x, rows, n, dim, flags, stream_);
}

void CudaForwardOps::argmax_rows(const float* x, int32_t n, int32_t cols, int32_t* ids) {
  use_device();
  launch_argmax_rows(x, n, cols, ids, stream_);
}

void CudaForwardOps::top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k,
                                const float* scale, int32_t* ids, float* values) {
  use_device();
  launch_top_k_rows(x, n, cols, k, scale, ids, values, stream_);
}

}  // namespace

Status check_cuda_runs(const model::LlamaModel& model) {
  ARBOR_RETURN_IF_ERROR(check_cuda_supports(model.config(), model.weights()));
  return plan_weight_upload(model, &matmul_supported).status();
}

Result<std::unique_ptr<model::ForwardOps>> make_cuda_forward_ops(const model::LlamaModel& model,
                                                                 int device) {
  const int count = device_count();
  if (count == 0) return failed_precondition(describe_devices());
  if (device < 0 || device >= count) {
    return failed_precondition("no CUDA device ", device, ": this machine has ", count);
  }
  ARBOR_RETURN_IF_ERROR(check_cuda_supports(model.config(), model.weights()));
  auto ops = std::make_unique<CudaForwardOps>(device);
  ARBOR_RETURN_IF_ERROR(ops->init(model));
  return std::unique_ptr<model::ForwardOps>(std::move(ops));
}

}  // namespace arbor::cuda
