// End-to-end greedy goldens through ModelRunner (on the CPU; its twin model_golden_gpu_test on a
// CUDA GPU, support/test_device.h): stories260K (llama2.c run.c, f32) token for
// token one request at a time, all six in one ragged batch, with chunked prefill, with block
// sizes 1/16/32, with F16 KV; TinyStories-656K (Q8_0 GGUF).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "convert/hf.h"
#include "convert/model_plan.h"
#include "golden_util.h"
#include "support/test_device.h"

namespace arbor::model::testing {
namespace {

// One thread unless a test is about threading: the test machines are shared and heavily loaded,
// where a 2-thread pool waits for descheduled workers on every small step.
std::unique_ptr<ModelRunner> load_runner(const std::string& rel, int32_t block_size,
                                         kernels::KvDtype dtype, int64_t num_blocks,
                                         int threads = 1) {
  RunnerOptions opt;
  opt.block_size = block_size;
  opt.num_blocks = num_blocks;
  opt.kv_dtype = dtype;
  opt.num_threads = threads;
  opt.make_ops = test::test_ops();
  if (rel.front() != '/') {
    EXPECT_TRUE(require_shared_file(rel));
  }
  auto r = ModelRunner::load(rel.front() == '/' ? rel : shared_path(rel), opt);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::vector<GoldenCase> stories_cases(const ModelRunner& runner) {
  return load_stories260k_golden(runner.model().file());
}

// Blocks for every golden case on interleaved ids, plus slack.
int64_t blocks_for(const std::vector<GoldenCase>& cases, int32_t block_size) {
  int32_t max_len = 0;
  for (const GoldenCase& c : cases) max_len = std::max(max_len, c.max_len);
  return (int64_t)cases.size() * ((max_len + block_size - 1) / block_size) + 2;
}

void expect_all_match(const std::vector<GoldenCase>& cases,
                      const std::vector<std::vector<int32_t>>& got, const std::string& what) {
  ASSERT_EQ(got.size(), cases.size());
  for (size_t b = 0; b < cases.size(); ++b) {
    EXPECT_EQ(got[b], cases[b].ids) << what << ": case \"" << cases[b].prompt
                                    << "\" diverges at index "
                                    << common_prefix(got[b], cases[b].ids);
  }
}

TEST(GoldenTest, Stories260KPromptLengthsFromVocab) {
  auto runner = load_runner(kStories260K, 16, kernels::KvDtype::kF32, 64);
  ASSERT_TRUE(runner);
  const auto cases = stories_cases(*runner);
  ASSERT_EQ(cases.size(), 6u);
  // BOS + prompt pieces; the empty prompt is BOS alone.
  const std::vector<int32_t> want = {5, 12, 4, 12, 9, 1};
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(cases[i].prompt_len, want[i]) << i;
}

TEST(GoldenTest, Stories260KOneAtATime) {
  auto runner = load_runner(kStories260K, 16, kernels::KvDtype::kF32, 32);
  ASSERT_TRUE(runner);
  for (const GoldenCase& c : stories_cases(*runner)) {
    const std::vector<int32_t> got = greedy_single(*runner, c, /*prefill_chunk=*/0);
    EXPECT_EQ(got, c.ids) << "\"" << c.prompt << "\" diverges at " << common_prefix(got, c.ids);
  }
}

TEST(GoldenTest, Stories260KRaggedBatchBlockSizes) {
  for (int32_t bs : {1, 16, 32}) {
    auto runner = load_runner(kStories260K, bs, kernels::KvDtype::kF32, 0);
    ASSERT_TRUE(runner);
    const auto cases = stories_cases(*runner);
    // Block size 16 also runs with 2 threads (parallel matmuls, attention work items).
    runner = load_runner(kStories260K, bs, kernels::KvDtype::kF32, blocks_for(cases, bs),
                         bs == 16 ? 2 : 1);
    expect_all_match(cases, greedy_batched(*runner, cases, {}), str_cat("block size ", bs));
  }
}

TEST(GoldenTest, Stories260KChunkedPrefill) {
  auto runner = load_runner(kStories260K, 16, kernels::KvDtype::kF32, 128);
  ASSERT_TRUE(runner);
  const auto cases = stories_cases(*runner);
  // Prompts in chunks of 7 next to other sequences' decode steps...
  expect_all_match(cases, greedy_batched(*runner, cases, {.prefill_chunk = 7}), "chunks of 7");
  // ...and a 100-token teacher-forced prefix, so chunks cross block boundaries mid-chunk.
  expect_all_match(cases,
                   greedy_batched(*runner, cases, {.prefill_chunk = 7, .forced_prefix = 100}),
                   "100-token prefix in chunks of 7");
  // One at a time through SingleSequence with chunks of 7.
  for (const GoldenCase& c : cases) EXPECT_EQ(greedy_single(*runner, c, 7), c.ids) << c.prompt;
}

TEST(GoldenTest, Stories260KTeacherForcedAllLogits) {
  // One forward over a whole golden sequence: every generated token is the argmax of the row
  // before it.
  auto runner = load_runner(kStories260K, 16, kernels::KvDtype::kF32, 32);
  ASSERT_TRUE(runner);
  const int32_t vocab = runner->config().vocab_size;
  for (const GoldenCase& c : stories_cases(*runner)) {
    SingleSequence seq(*runner, SingleSequence::contiguous_blocks(0, 32));
    auto logits = seq.append_all_logits(c.ids);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    for (size_t t = c.prompt_len; t < c.ids.size(); ++t) {
      ASSERT_EQ(argmax(logits->data() + (t - 1) * vocab, vocab), c.ids[t])
          << "\"" << c.prompt << "\" position " << t;
    }
  }
}

TEST(GoldenTest, Stories260KF16KvCache) {
  auto runner = load_runner(kStories260K, 16, kernels::KvDtype::kF16, 0);
  ASSERT_TRUE(runner);
  const auto cases = stories_cases(*runner);
  runner = load_runner(kStories260K, 16, kernels::KvDtype::kF16, blocks_for(cases, 16));
  expect_all_match(cases, greedy_batched(*runner, cases, {}), "F16 KV");
}

// Generated tokens (after the prompt) that follow the golden, per case.
std::vector<size_t> followed(const std::vector<GoldenCase>& cases,
                             const std::vector<std::vector<int32_t>>& got) {
  std::vector<size_t> n;
  for (size_t b = 0; b < cases.size(); ++b) {
    n.push_back(common_prefix(got[b], cases[b].ids) - cases[b].prompt_len);
  }
  return n;
}

TEST(GoldenTest, TinyStories656KF32ConversionFollowsGolden) {
  // Converted from the safetensors with the converter's library (what `arbor convert hf` runs).
  ASSERT_TRUE(require_shared_file("models/tinystories-656K/model.safetensors"));
  auto hf = convert::load_hf(shared_path("models/tinystories-656K"));
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / str_cat("arbor_golden_test_", getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tinystories656K_f32.gguf").string();
  convert::OutputType f32;
  f32.type = gguf::GgmlType::kF32;
  const Status written = convert::write_plan(hf->plan, f32, path);
  ASSERT_TRUE(written.ok()) << written.to_string();
  auto runner = load_runner(path, 16, kernels::KvDtype::kF32, 64);
  std::filesystem::remove_all(dir);  // the mapping keeps the data alive
  ASSERT_TRUE(runner);
  const auto cases = load_tinystories_golden();
  const auto got = greedy_batched(*runner, cases, {});
  const std::vector<size_t> n = followed(cases, got);
  for (size_t b = 0; b < cases.size(); ++b) {
    // The golden's top-2 gaps get as small as 8e-4, so only a late divergence is tolerated.
    EXPECT_GE(n[b], 64u) << "\"" << cases[b].prompt << "\"";
    std::printf("TinyStories-656K F32 \"%s\": follows %zu of %zu generated tokens\n",
                cases[b].prompt.c_str(), n[b], cases[b].ids.size() - cases[b].prompt_len);
  }
}

TEST(GoldenTest, TinyStories656KQ8_0HowFar) {
  auto runner = load_runner("models/tinystories-656K/TinyStories-656K-Q8_0.gguf",
                            16, kernels::KvDtype::kF32, 64);
  ASSERT_TRUE(runner);
  const auto cases = load_tinystories_golden();
  const auto got = greedy_batched(*runner, cases, {});
  const std::vector<size_t> n = followed(cases, got);
  for (size_t b = 0; b < cases.size(); ++b) {
    std::printf("TinyStories-656K Q8_0 \"%s\": follows %zu of %zu generated tokens\n",
                cases[b].prompt.c_str(), n[b], cases[b].ids.size() - cases[b].prompt_len);
  }
  // Quantised weights drift from the f32 golden; they must still start the same way.
  EXPECT_GE(*std::max_element(n.begin(), n.end()), 8u);
}

}  // namespace
}  // namespace arbor::model::testing
