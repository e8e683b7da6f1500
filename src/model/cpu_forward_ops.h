// CpuForwardOps: ForwardOps on the CPU — the kernels of src/kernels on a
// ThreadPool, device memory = host memory, the model's own weights (packed
// copies included).
//
// Each op runs to completion before it returns. Not thread-safe: one caller at
// a time, which also owns the pool for the call.
#pragma once

#include <vector>

#include "kernels/thread_pool.h"
#include "model/forward_ops.h"

namespace arbor::model {

class CpuForwardOps final : public ForwardOps {
public:
  // `model` and `pool` must outlive this object.
  CpuForwardOps(const LlamaModel &model, kernels::ThreadPool &pool)
      : model_(model), pool_(pool) {}

  std::string_view name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  Result<void *> allocate(size_t bytes) override {
    return host_memory().allocate(bytes);
  }
  void release(void *p) override { host_memory().release(p); }
  void copy(std::span<const Copy> copies) override {
    host_memory().copy(copies);
  }
  void to_device(void *dst, const void *src, size_t bytes) override {
    host_memory().to_device(dst, src, bytes);
  }
  void to_host(void *dst, const void *src, size_t bytes) override {
    host_memory().to_host(dst, src, bytes);
  }

  const LlamaWeights &weights() const override { return model_.weights(); }
  ForwardBatch stage(const ForwardBatch &batch) override { return batch; }

  void embed(const kernels::WeightView &table, const int32_t *tokens, int32_t n,
             float *x) override;
  void rope_tables(const int32_t *positions, int32_t n, const float *inv_freq,
                   int half, float mscale, float *cos, float *sin) override;
  void rms_norm_rows(const float *x, const int32_t *rows, int32_t n,
                     const float *weight, float *y, int dim,
                     float eps) override;
  void matmul_multi(std::span<const kernels::WeightView *const> ws,
                    const float *x, std::span<float *const> ys,
                    int32_t num_tokens) override;
  // kernels::matmul_segments, then collective::tree_sum over the segments' products.
  void matmul_segmented(const kernels::WeightView &whole,
                        std::span<const kernels::WeightView> segs,
                        const float *x, float *y, int32_t num_tokens) override;
  void qkv_epilogue(const QkvEpilogue &p) override;
  // A kernels::PagedAttentionPlan.
  std::unique_ptr<AttentionPlan> new_attention_plan() override;
  void plan_attention(const kernels::PagedAttentionParams &p,
                      AttentionPlan &plan) override;
  void attention(const kernels::PagedAttentionParams &p,
                 const AttentionPlan &plan) override;
  using ForwardOps::attention;
  int32_t route_experts(const ExpertRouting &r) override;
  void matmul_experts(std::span<const kernels::ExpertMatmul> mats,
                      const float *x, const kernels::ExpertRows &rows) override;
  void combine_experts(const float *pairs, const int32_t *slot_pair,
                       const float *slot_weight, int32_t num_tokens, int k,
                       int dim, float *y) override;
  void gated_delta_net(const kernels::GatedDeltaNetParams &p) override;
  void split_q_gate(const float *qg, int32_t num_tokens, int heads,
                    int head_dim, float *q, float *gate) override;
  void sigmoid_mul(float *x, const float *gate, int64_t n) override;
  void add(float *y, const float *x, int64_t n) override;
  void add_gated_rows(float *y, const float *x, const float *gate, int32_t rows,
                      int cols) override;
  void silu_mul(float *gate, const float *up, int64_t n) override;
  void gelu_mul(float *gate, const float *up, int64_t n) override;
  void swiglu_oai(float *gate, const float *up, int64_t n, float alpha,
                  float limit) override;
  void add_expert_bias(float *y, const kernels::ExpertRows &rows,
                       const float *bias, int cols) override;
  void scale_bias(float *y, int32_t rows, int cols, float scale,
                  const float *bias) override;
  void softcap(float *x, int64_t n, float cap) override;
  void flag_nonfinite(const float *x, const int32_t *rows, int32_t n, int dim,
                      uint8_t *flags) override;
  void argmax_rows(const float *x, int32_t n, int32_t cols,
                   int32_t *ids) override;
  void top_k_rows(const float *x, int32_t n, int32_t cols, int32_t k,
                  const float *scale, int32_t *ids, float *values) override;

private:
  // fn(begin, end) over [0, n): on this thread below kParallelElements, else
  // split over the pool in chunks that start and end at multiples of 16
  // (except the last, which ends at n), so a vector kernel's element i falls
  // in the same lane and the same loop part (whole vectors or the tail)
  // whether the range is split or not: its bits never depend on the split.
  // (Defined in cpu_forward_ops.cc, its only user.)
  template <class Fn> void split_elements(int64_t n, const Fn &fn);

  const LlamaModel &model_;
  kernels::ThreadPool &pool_;
  std::vector<float> segment_out_; // [segments - 1, T, rows] matmul_segmented's products
};

} // namespace arbor::model
