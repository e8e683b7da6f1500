// ForwardOps: the operators the forward pass is written over, one implementation per device.
//
// LlamaForward (llama_forward.h) is the one front end: it sequences these ops for every layer.
// CpuForwardOps (cpu_forward_ops.h) runs them with the CPU kernels on a ThreadPool; the CUDA
// executor's ops (src/cuda) launch GPU kernels on a stream. Nothing else differs between devices
// (CTranslate2's split: one front end, an implementation per op and device).
//
//   stage -> plan_attention (once per distinct attention layout of the step: one per window) ->
//   embed -> rope_tables -> per layer: rms_norm -> matmul_multi(q, k, v) -> qkv_epilogue (bias,
//   QK-norm, RoPE, K/V into their cache slots) -> attention (with its layout's plan) ->
//   matmul(wo) -> add -> rms_norm -> matmul_multi(gate, up) -> silu_mul | gelu_mul ->
//   matmul(down) -> add;  then rms_norm_rows over the logits rows -> matmul(output); with
//   scale_bias, softcap and rms_norm_rows where an architecture's row (arch.h) asks for biases,
//   scales, post-norms and soft-caps. A mixture-of-experts FFN is matmul(router) ->
//   route_experts -> matmul_experts(gate, up) -> silu_mul -> matmul_experts(down) ->
//   combine_experts -> add (gpt-oss: the router's bias by scale_bias, the experts' by
//   add_expert_bias after each matmul_experts, swiglu_oai for silu_mul). A Gated DeltaNet layer
//   (Qwen3.5) is rms_norm -> matmul_multi(qkv, z, beta, alpha) -> gated_delta_net ->
//   matmul(out) -> add; its gated attention layers split_q_gate after matmul_multi and
//   sigmoid_mul the attention's output before matmul(wo).
//
// Memory: every pointer an op takes or returns lives in the device's memory ("device pointers"),
// including the model's weights as weights() returns them and the batch arrays as stage()
// returns them. On the CPU device memory is host memory and both are the host pointers
// themselves. Ops are issued in program order from one thread; a device may run them
// asynchronously, and to_host() (the only way results come back) waits for all earlier ops.
//
// Numerics: every op is batch invariant (a row's result depends, bit for bit, only on that row's
// inputs, never on the other rows of the call or how many there are), as the CPU kernels are
// (docs/kernels.md), so that a sequence's logits do not depend on what it is batched with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "base/status.h"
#include "kernels/attention.h"
#include "kernels/experts.h"
#include "kernels/gated_delta_net.h"
#include "kernels/matmul.h"
#include "model/forward_batch.h"
#include "model/llama_model.h"

namespace arbor::model {

// One device's memory: where a PagedKvCache and the forward's scratch live.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // "cpu", "cuda:0", ... for logs and errors.
  virtual std::string_view name() const = 0;
  // True when device pointers are host pointers (the CPU).
  virtual bool is_host() const = 0;
  // `bytes` of zeroed device memory, aligned to at least 256 bytes; resource_exhausted with the
  // byte count when the device cannot hold them. Freed with release().
  virtual Result<void*> allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Copies within device memory, in issue order with the ops.
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  virtual void copy(std::span<const Copy> copies) = 0;
  // Host -> device; the host buffer may be reused as soon as the call returns.
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  // Device -> host, after every op issued before it has finished.
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
};

// Host memory: anonymous mmap (zeroed; pages committed on first touch), memcpy.
DeviceMemory& host_memory();

// What qkv_epilogue does for every new token t of a layer, in this order: scales q[t], k[t] and
// v[t] by q_scale / k_scale / v_scale and adds the biases (when not null); RMS-normalises q[t]
// and k[t] (QK-norm, when q_norm is not null: each head of head_dim by the [head_dim] weight,
// or, qk_norm_whole, the whole projection by a [q_dim] / [kv_dim] weight); rotates q[t]
// (num_q_heads heads) and k[t] (num_kv_heads) by RoPE with cos/sin row t (rope_dim 0: no RoPE);
// multiplies q[t] by 1 + temp_scale * log(1 + floor(positions[t] / temp_floor)) when temp_scale
// is not 0; writes k[t] and v[t] into cache slot slot_mapping[t], converting to the cache dtype.
// A Llama / Qwen2 layer sets none of the optional steps and takes the same path as always.
struct QkvEpilogue {
  int32_t num_tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rope_dim = 0;           // rotated dimensions of each head (even, <= head_dim); 0: none
  bool rope_neox = false;     // kernels::RopeParams::neox
  float* q = nullptr;         // [T, num_q_heads * head_dim]
  float* k = nullptr;         // [T, num_kv_heads * head_dim]
  float* v = nullptr;         // [T, num_kv_heads * head_dim]
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  const float* bq = nullptr;  // [num_q_heads * head_dim] or null
  const float* bk = nullptr;  // [num_kv_heads * head_dim] or null
  const float* bv = nullptr;  // [num_kv_heads * head_dim] or null
  const float* q_norm = nullptr;  // [head_dim], or [num_q_heads * head_dim] when qk_norm_whole
  const float* k_norm = nullptr;  // [head_dim], or [num_kv_heads * head_dim] when qk_norm_whole
  bool qk_norm_whole = false;
  float norm_eps = 0.0f;
  const float* cos = nullptr;  // [T, rope_dim / 2]
  const float* sin = nullptr;  // [T, rope_dim / 2]
  const int32_t* positions = nullptr;  // [T]; read only when temp_scale != 0
  float temp_scale = 0.0f;
  int temp_floor = 0;
  const int32_t* slot_mapping = nullptr;  // [T]
  // The layer's pools, [num_blocks, num_kv_heads, block_size, head_dim] of kv_dtype.
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;
  int block_size = 0;

  // Whether any step beyond Llama / Qwen2's (bias, RoPE, store) is asked for.
  bool has_variants() const {
    return q_scale != 1.0f || k_scale != 1.0f || v_scale != 1.0f || q_norm != nullptr ||
           k_norm != nullptr || temp_scale != 0.0f;
  }
};

// One mixture-of-experts layer's routing (ForwardOps::route_experts), every pointer a device
// pointer: for each token t, the router's choice of num_used experts and their weights
// (kernels::route_softmax_top_k), then the T * k (token, slot) pairs sorted by expert
// (kernels::sort_pairs_by_expert), the layout kernels::matmul_experts runs.
struct ExpertRouting {
  int32_t num_tokens = 0;
  int num_experts = 0;
  int num_used = 0;                  // k, in [1, num_experts]
  bool renormalize = true;           // kernels::route_softmax_top_k's (false: Qwen2-MoE)
  const float* logits = nullptr;     // [T, num_experts] the router's output
  int32_t* slot_expert = nullptr;    // [T, k] out: token t's j-th choice (largest weight first)
  float* slot_weight = nullptr;      // [T, k] out: its weight
  int32_t* expert_indptr = nullptr;  // [num_experts + 1] out
  int32_t* pair_token = nullptr;     // [T * k] out: the token of each pair, in expert order
  int32_t* slot_pair = nullptr;      // [T, k] out: where token t's j-th choice sits among the pairs
};

// A device's attention plan for one batch layout (ForwardOps::plan_attention): how the work of
// an attention call is split (the CPU's work items and key-chunk splits, the GPU's grid and
// workspace). Opaque; made by the ForwardOps that runs it (new_attention_plan) and used only
// with that one.
class AttentionPlan {
 public:
  virtual ~AttentionPlan() = default;
};

class ForwardOps : public DeviceMemory {
 public:
  // The model's weights in this device's memory: the same structure as model.weights(), with
  // every pointer (WeightView::data / packed, norms, biases, rope_freqs) a device pointer.
  virtual const LlamaWeights& weights() const = 0;

  // The batch's arrays in device memory, valid until the next stage() (the CPU returns `batch`).
  virtual ForwardBatch stage(const ForwardBatch& batch) = 0;

  // x[t] = row tokens[t] of `table`, dequantised. x: [n, table.cols].
  virtual void embed(const kernels::WeightView& table, const int32_t* tokens, int32_t n,
                     float* x) = 0;
  // cos[t, i] = mscale * cos(positions[t] * inv_freq[i]), sin likewise; [n, half] each.
  virtual void rope_tables(const int32_t* positions, int32_t n, const float* inv_freq, int half,
                           float mscale, float* cos, float* sin) = 0;
  // y[r] = rms_norm(x[rows ? rows[r] : r]) * weight for r < n; x, y: [*, dim]. rows: device
  // pointer or null (every row in order).
  virtual void rms_norm_rows(const float* x, const int32_t* rows, int32_t n, const float* weight,
                             float* y, int dim, float eps) = 0;
  // ys[i] = x ws[i]^T, each [num_tokens, ws[i]->rows] (kernels::matmul_multi's contract).
  virtual void matmul_multi(std::span<const kernels::WeightView* const> ws, const float* x,
                            std::span<float* const> ys, int32_t num_tokens) = 0;
  void matmul(const kernels::WeightView& w, const float* x, float* y, int32_t num_tokens) {
    const kernels::WeightView* ws[] = {&w};
    float* ys[] = {y};
    matmul_multi(ws, x, ys, num_tokens);
  }
  // y = x W^T for a row-parallel matrix (attn_output, ffn_down) given whole and as `segs`, its
  // canonical K segments (LayerWeights::o_segs; empty: none): each segment's product as matmul()
  // computes it, the products combined in the fixed binary tree of collective::tree_sum
  // (docs/tensor_parallel.md), so the bits do not depend on how the segments are spread over
  // ranks. x: [num_tokens, whole.cols]; y: [num_tokens, whole.rows]. This default multiplies by
  // `whole` in one matmul (a device that does not run tensor parallelism: CUDA).
  virtual void matmul_segmented(const kernels::WeightView& whole,
                                std::span<const kernels::WeightView> segs, const float* x, float* y,
                                int32_t num_tokens) {
    matmul(whole, x, y, num_tokens);
  }
  virtual void qkv_epilogue(const QkvEpilogue& p) = 0;

  // Attention is planned once per step and layout, then run by every layer of that layout.
  // An empty plan of this device for plan_attention to fill. The caller keeps it and refills it
  // every step; refilling allocates only when a layout needs more room than any before.
  virtual std::unique_ptr<AttentionPlan> new_attention_plan() = 0;
  // Plans attention for p's layout into `plan` (from this device's new_attention_plan): exactly
  // the split a call planning for itself would make, so running with it gives the same output,
  // bit for bit. The plan serves every attention() call whose params differ from p only in q,
  // out, sinks, k_cache, v_cache, kv_indptr and kv_page_indices (the layers of one window, in
  // any KV cache group): every other scalar the same, and qo_indptr, kv_len, mask_indptr and mask_bits
  // the same arrays (device pointers), unchanged, while the plan is used. Debug builds check the
  // geometry here, once per plan. Every pointer a device pointer.
  virtual void plan_attention(const kernels::PagedAttentionParams& p, AttentionPlan& plan) = 0;
  // kernels::paged_attention's contract, every pointer a device pointer, run with `plan`, made by
  // plan_attention for p's layout (above). A plan of another device or layout is CHECKed where
  // the device can tell in O(1) (the scalars and the layout arrays' addresses).
  virtual void attention(const kernels::PagedAttentionParams& p, const AttentionPlan& plan) = 0;
  // Plans and runs one call (tests and one-off callers; allocates a plan).
  void attention(const kernels::PagedAttentionParams& p) {
    const std::unique_ptr<AttentionPlan> plan = new_attention_plan();
    plan_attention(p, *plan);
    attention(p, *plan);
  }

  // Mixture-of-experts FFN (ExpertRouting above; docs/kernels.md, "Mixture-of-experts FFN").
  // Returns how many distinct experts the tokens were routed to (experts with at least one
  // pair), or -1 where the device cannot tell without waiting for the routing (the step-cost
  // model's expert term reads it: docs/speculation.md, "Policy").
  virtual int32_t route_experts(const ExpertRouting& r) = 0;
  // kernels::matmul_experts' contract; every pointer (views' data / packed, x, y, the rows'
  // arrays) a device pointer.
  virtual void matmul_experts(std::span<const kernels::ExpertMatmul> mats, const float* x,
                              const kernels::ExpertRows& rows) = 0;
  // y[t] = sum over j < k, in order, of slot_weight[t, j] * pairs[slot_pair[t, j]]: the first
  // term a product, each further one added (k = 1 with weight 1 copies the row exactly).
  // pairs: [T * k, dim]; slot_pair, slot_weight: [T, k]; y: [T, dim].
  virtual void combine_experts(const float* pairs, const int32_t* slot_pair,
                               const float* slot_weight, int32_t num_tokens, int k, int dim,
                               float* y) = 0;

  // kernels::add_expert_bias: y[p] += bias[expert of pair p]; y: [rows.num_pairs(), cols],
  // bias: [rows.num_experts, cols] (gpt-oss's per-expert biases). Device pointers.
  virtual void add_expert_bias(float* y, const kernels::ExpertRows& rows, const float* bias,
                               int cols) = 0;

  // Gated DeltaNet layers (Qwen3.5): kernels::gated_delta_net's contract, every pointer a
  // device pointer (the layer's conv and recurrent states included).
  virtual void gated_delta_net(const kernels::GatedDeltaNetParams& p) = 0;
  // Gated attention's [q; gate] rows apart: qg [T, heads, 2, head_dim] (per head head_dim q
  // values, then head_dim gate values) into q and gate, [T, heads * head_dim] each.
  virtual void split_q_gate(const float* qg, int32_t num_tokens, int heads, int head_dim,
                            float* q, float* gate) = 0;
  // x[i] *= sigmoid(gate[i]), sigmoid(g) = 1 / (1 + exp(-g)); [n]. Element i's bits depend
  // only on x[i] and gate[i].
  virtual void sigmoid_mul(float* x, const float* gate, int64_t n) = 0;

  // y += x; [n].
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // y[t, :] += sigmoid(gate[t]) * x[t, :] for t < rows (kernels::axpy per row): a shared
  // expert's output under its gate (Qwen2-MoE). y, x: [rows, cols]; gate: [rows].
  virtual void add_gated_rows(float* y, const float* x, const float* gate, int32_t rows,
                              int cols) = 0;
  // gate = silu(gate) * up; [n].
  virtual void silu_mul(float* gate, const float* up, int64_t n) = 0;
  // gate = gelu_tanh(gate) * up; [n] (kernels::gelu_mul).
  virtual void gelu_mul(float* gate, const float* up, int64_t n) = 0;
  // gate = swiglu_oai(gate, up) (kernels::swiglu_oai: gpt-oss's clamped SwiGLU); [n].
  virtual void swiglu_oai(float* gate, const float* up, int64_t n, float alpha, float limit) = 0;
  // y[r, c] = y[r, c] * scale + (bias ? bias[c] : 0); y: [rows, cols], bias: [cols] or null.
  virtual void scale_bias(float* y, int32_t rows, int cols, float scale, const float* bias) = 0;
  // x = cap * tanh(x / cap); [n], cap > 0.
  virtual void softcap(float* x, int64_t n, float cap) = 0;
  // flags[i] = 1 when row rows[i] of x ([*, dim]) holds an Inf or NaN, else left as it was.
  // rows: device pointer, [n]; flags: device bytes, [n].
  virtual void flag_nonfinite(const float* x, const int32_t* rows, int32_t n, int dim,
                              uint8_t* flags) = 0;
  // ids[r] = the lowest index of the maximum of row r of x ([n, cols]), or -1 when the row holds
  // an Inf or NaN; r < n. The greedy token of a row without its logits leaving the device
  // (a finite row's argmax is what sampling::Sampler picks for greedy params). ids: [n].
  virtual void argmax_rows(const float* x, int32_t n, int32_t cols, int32_t* ids) = 0;
  // The k best entries of each row r < n of x ([n, cols]), 1 <= k <= cols (CHECKed), in the
  // order sampling::Sampler ranks a row's tokens by for top_k: score descending, ties by id
  // ascending, where score(c) = (x[r, c] - max_c' x[r, c']) * scale[r] in float arithmetic
  // (scale = 1 / temperature, so this is Sampler's score bit for bit; a score of -0 counts as
  // +0). Ranking by the score rather than the raw value matters where rounding maps distinct
  // logits to one score: Sampler breaks that tie by id, and so does this. Output per row in
  // increasing id: ids[r, j] and values[r, j] = x[r, ids[r, j]] (the raw logit) for j < k.
  // A row holding an Inf or NaN gets ids[r, j] = -1 for every j (values unspecified).
  // scale: device [n], positive and finite; ids, values: device [n, k].
  virtual void top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k, const float* scale,
                          int32_t* ids, float* values) = 0;
};

}  // namespace arbor::model
