#include "cuda_test_util.h"

#include <cmath>

#include "cuda/cuda_forward_ops.h"
#include "cuda/runtime.h"
#include "support/shared_data.h"

namespace arbor::cuda::testing {

std::unique_ptr<model::LlamaModel> CudaOpsTest::model_;
std::unique_ptr<model::ForwardOps> CudaOpsTest::ops_;

void CudaOpsTest::SetUp() {
  if (device_count() == 0) GTEST_SKIP() << describe_devices();
  if (ops_ != nullptr) return;
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  auto m = model::LlamaModel::load(test::shared_path(test::kStories260K));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  model_ = std::move(*m);
  auto ops = make_cuda_forward_ops(*model_, 0);
  ASSERT_TRUE(ops.ok()) << ops.status().to_string();
  ops_ = std::move(*ops);
}

void CudaOpsTest::TearDown() {
  for (void* p : allocations_) ops_->release(p);
  allocations_.clear();
}

void* CudaOpsTest::alloc(size_t bytes) {
  auto p = ops().allocate(bytes);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  if (!p.ok()) return nullptr;
  allocations_.push_back(*p);
  return *p;
}

std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

::testing::AssertionResult bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i]
                                           << " (of " << a.size() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult all_close(const std::vector<float>& a, const std::vector<float>& b,
                                     float atol, float rtol) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  }
  size_t worst = 0;
  double worst_excess = 0.0;
  bool bad = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs((double)a[i] - (double)b[i]);
    const double tol = atol + rtol * std::fabs((double)b[i]);
    if (!(diff <= tol) && (!bad || diff - tol > worst_excess)) {
      bad = true;
      worst = i;
      worst_excess = std::isnan(diff) ? INFINITY : diff - tol;
    }
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst << ": " << a[worst] << " vs "
                                       << b[worst] << " (tolerance " << atol << " + " << rtol
                                       << " * |ref|, " << a.size() << " elements)";
}

}  // namespace arbor::cuda::testing
