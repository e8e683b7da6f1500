// Shared by the gpu tests: a fixture holding CudaForwardOps over stories260K (skipped, saying
// why, without a CUDA device) and device arrays that go back to the ops on teardown.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "model/forward_ops.h"
#include "model/llama_model.h"

namespace arbor::cuda::testing {

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // `bytes` of device memory (zeroed), released on teardown.
  void* alloc(size_t bytes);
  template <typename T>
  T* upload(const std::vector<T>& host) {
    void* d = alloc(std::max<size_t>(host.size() * sizeof(T), 1));
    if (!host.empty()) ops().to_device(d, host.data(), host.size() * sizeof(T));
    return static_cast<T*>(d);
  }
  template <typename T>
  std::vector<T> download(const T* dev, size_t n) {
    std::vector<T> host(n);
    if (n > 0) ops().to_host(host.data(), dev, n * sizeof(T));
    return host;
  }

  model::ForwardOps& ops() { return *ops_; }
  const model::LlamaModel& model() { return *model_; }

 private:
  static std::unique_ptr<model::LlamaModel> model_;
  static std::unique_ptr<model::ForwardOps> ops_;
  std::vector<void*> allocations_;
};

std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f);

// Bit-exact comparison of two float arrays; the message names the first difference.
::testing::AssertionResult bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);
// max |a - b| <= atol + rtol * |b| elementwise; the message names the worst element.
::testing::AssertionResult all_close(const std::vector<float>& a, const std::vector<float>& b,
                                     float atol, float rtol = 0.0f);

}  // namespace arbor::cuda::testing
