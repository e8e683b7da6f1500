// Lossless greedy speculation needs the forward to be batch-invariant bit for bit: verifying 8
// tokens of a sequence in one step (logits for every row) must give exactly the logits of 8
// one-token decode steps, alone or beside another sequence's prefill chunk, on 1 or 2 threads,
// for every ISA this CPU runs, block sizes 1 and 16. Runs stories260K as shipped (F32) and
// quantised by the test to Q8_0 and Q4_0 (its 172-wide ffn_down has no 32-blocks: F16).
// The 600-token prompt crosses attention's fixed key-split chunk (docs/kernels.md).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gguf/quantize_model.h"
#include "golden_util.h"
#include "kernels/cpu_features.h"
#include "model/batch_builder.h"

namespace arbor::model::testing {
namespace {

constexpr int32_t kPromptLen = 600;
constexpr int32_t kDraft = 8;
constexpr int32_t kOtherCommitted = 100;
constexpr int32_t kOtherChunk = 37;

// Deterministic prompt tokens in [1, 511] (stories260K has 512).
std::vector<int32_t> make_tokens(int32_t n, uint32_t seed) {
  std::vector<int32_t> t(n);
  uint32_t x = seed;
  for (int32_t& v : t) {
    x = x * 1664525u + 1013904223u;
    v = 1 + (int32_t)((x >> 8) % 511);
  }
  return t;
}

class BatchInvarianceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / str_cat("arbor_invariance_", getpid());
    std::filesystem::create_directories(dir_);
    auto in = gguf::GgufFile::open(shared_path(kStories260K));
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    for (auto [name, t] :
         {std::pair{"Q8_0", gguf::GgmlType::kQ8_0}, {"Q4_0", gguf::GgmlType::kQ4_0}}) {
      auto w = gguf::quantize_model(*in, {.target = t}, nullptr);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      const std::string path = model_path(name);
      const Status s = w->write(path);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static std::string model_path(const std::string& variant) {
    return variant == "F32" ? shared_path(kStories260K) : (dir_ / (variant + ".gguf")).string();
  }

  static std::filesystem::path dir_;
};

std::filesystem::path BatchInvarianceTest::dir_;

// Runs one step of `seqs`; returns the logits [num_logits, vocab].
std::vector<float> step(ModelRunner& runner, const std::vector<SequenceInput>& seqs) {
  BatchBuilder b(runner.kv_cache().block_size());
  for (const SequenceInput& s : seqs) b.add(s);
  std::vector<float> logits((size_t)b.num_logits() * runner.config().vocab_size);
  const Status st = runner.forward(b.batch(), logits.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return logits;
}

// Index of the first bitwise difference of a and b ([n]), or -1.
int64_t first_bit_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  }
  return -1;
}

// Three sequences on their own blocks: A (the 600-token prompt, then the 8 speculated tokens),
// B (a prefill chunk after 100 committed tokens), C (one decode token after 23).
struct Sequences {
  std::vector<int32_t> table_a, table_b, table_c;
  std::vector<int32_t> prompt = make_tokens(kPromptLen, 7);
  std::vector<int32_t> other = make_tokens(kOtherCommitted + kOtherChunk, 8);
  std::vector<int32_t> third = make_tokens(24, 9);

  explicit Sequences(int32_t bs) {
    const auto blocks = [bs](int32_t first, int32_t tokens) {
      return SingleSequence::contiguous_blocks(first, (tokens + bs - 1) / bs);
    };
    table_a = blocks(0, kPromptLen + kDraft);
    table_b = blocks((int32_t)table_a.size(), kOtherCommitted + kOtherChunk);
    table_c = blocks((int32_t)(table_a.size() + table_b.size()), 24);
  }
};

// From the prefilled state: (a) 8 greedy decode steps of A, (b) the same 8 tokens in one step
// with logits for every row, (c) that step beside B's chunk and C's decode. Every row of (b)
// and (c) must equal its decode step's logits bit for bit.
void check_verify_step(ModelRunner& runner, const Sequences& s, const std::vector<float>& prefill) {
  const int32_t vocab = runner.config().vocab_size;
  std::vector<int32_t> draft;
  std::vector<float> decoded, last = prefill;
  for (int32_t k = 0; k < kDraft; ++k) {
    draft.push_back(argmax(last.data(), vocab));
    last = step(runner, {{.block_table = s.table_a, .num_committed = kPromptLen + k,
                          .tokens = std::span(draft).last(1)}});
    decoded.insert(decoded.end(), last.begin(), last.end());
  }
  const SequenceInput verify{.block_table = s.table_a, .num_committed = kPromptLen,
                             .tokens = draft, .logits = LogitsMode::kAll};
  const std::vector<float> alone = step(runner, {verify});
  ASSERT_EQ(alone.size(), decoded.size());
  int64_t at = first_bit_difference(alone.data(), decoded.data(), kDraft * vocab);
  EXPECT_EQ(at, -1) << "verify alone: row " << at / vocab << " logit " << at % vocab << " is "
                    << alone[at] << ", decoded " << decoded[at];
  const std::vector<float> mixed =
      step(runner, {{.block_table = s.table_b, .num_committed = kOtherCommitted,
                     .tokens = std::span(s.other).last(kOtherChunk)},
                    verify,
                    {.block_table = s.table_c, .num_committed = 23,
                     .tokens = std::span(s.third).last(1)}});
  ASSERT_EQ(mixed.size(), (size_t)(kDraft + 2) * vocab);
  at = first_bit_difference(mixed.data() + vocab, decoded.data(), kDraft * vocab);
  EXPECT_EQ(at, -1) << "verify mixed: row " << at / vocab << " logit " << at % vocab << " is "
                    << mixed[vocab + at] << ", decoded " << decoded[at];
}

TEST_F(BatchInvarianceTest, VerifyStepEqualsDecodeStepsBitForBit) {
  const kernels::Isa saved = kernels::active_isa();
  for (const std::string variant : {"F32", "Q8_0", "Q4_0"}) {
    for (int32_t bs : {1, 16}) {
      for (int threads : {1, 2}) {
        RunnerOptions opt;
        opt.block_size = bs;
        opt.num_blocks = (kPromptLen + kDraft + kOtherCommitted + kOtherChunk + 24) / bs + 4;
        // F16 is the serving default; block size 1 also covers an F32 cache.
        opt.kv_dtype = bs == 1 ? kernels::KvDtype::kF32 : kernels::KvDtype::kF16;
        opt.num_threads = threads;
        auto runner = ModelRunner::load(model_path(variant), opt);
        ASSERT_TRUE(runner.ok()) << runner.status().to_string();
        // The committed prefixes once (any ISA: only the rows after them are compared).
        const Sequences s(bs);
        kernels::set_active_isa(kernels::best_isa());
        const std::vector<float> prefill =
            step(**runner, {{.block_table = s.table_a, .tokens = s.prompt}});
        step(**runner, {{.block_table = s.table_b,
                         .tokens = std::span(s.other).first(kOtherCommitted),
                         .logits = LogitsMode::kNone},
                        {.block_table = s.table_c, .tokens = std::span(s.third).first(23),
                         .logits = LogitsMode::kNone}});
        for (int i = 0; i <= (int)kernels::best_isa(); ++i) {
          const auto isa = (kernels::Isa)i;
          kernels::set_active_isa(isa);
          SCOPED_TRACE(str_cat(variant, " block_size=", bs, " threads=", threads,
                               " isa=", kernels::isa_name(isa)));
          check_verify_step(**runner, s, prefill);
        }
      }
    }
  }
  kernels::set_active_isa(saved);
}

}  // namespace
}  // namespace arbor::model::testing
