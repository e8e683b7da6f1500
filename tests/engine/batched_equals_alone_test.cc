// 64 greedy requests, prompts of 1..400 tokens, up to 64 new tokens, budgets 32 / 256 / 2048
// and a KV pool small enough to preempt. Labelled e2e (Release).
#include "batched_equals_alone.h"

namespace arbor::engine {
namespace {

TEST(BatchedEqualsAlone, SixtyFourRequestsStories260K) {
  // 40 blocks of 16 tokens = 640 slots: a 400-token prompt + 64 outputs fits alone, a few
  // requests together do not.
  testing::check_batched_equals_alone(64, 400, 64, 40);
}

}  // namespace
}  // namespace arbor::engine
