// Tensor parallelism (model/tp.h, docs/tensor_parallel.md): ranks as forked processes meeting
// through the shared-memory collective. Logits at TP = 1, 2 and 4 must be the same bits on F32,
// Q8_0 and Q4_K_M random-weight files (prefill of two ragged sequences, a batched decode step, a
// single decode step; an uneven vocabulary split); greedy decoding at TP = 2 through the argmax
// path must equal TP = 1 token for token; each rank must hold about 1/size of the split weights;
// ranks given different batches fail with an error; unsupported degrees are refused by name.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "collective/shm_collective.h"
#include "gguf/quantize_model.h"
#include "kernels/cpu_features.h"
#include "model/batch_builder.h"
#include "model/cpu_forward_ops.h"
#include "model/runner.h"
#include "model/synth_model.h"
#include "support/temp_dir.h"

namespace arbor::model {
namespace {

using collective::ShmCollective;
using collective::ShmRegion;

// q_dim / 4 and ffn / 4 are whole Q4_K blocks (256) for the K-quant file, whole blocks of 32 for
// the others; the vocabulary (1001) does not split evenly 2 or 4 ways.
SynthShape small_shape(int64_t dim, int64_t ffn, int64_t head_dim = 0) {
  return SynthShape{.name = "tp", .arch = "llama", .dim = dim, .ffn = ffn, .layers = 2,
                    .heads = 8, .kv_heads = 4, .context = 256, .head_dim = head_dim,
                    .vocab = 1001};
}

class TpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("tp");
    kernels::ThreadPool pool(1);
    const auto write = [&](const SynthShape& s, gguf::GgmlType type, const std::string& name) {
      auto w = synth_model(s, type, 7, s.vocab, {}, pool);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      ASSERT_TRUE(w->write(*dir_ / name).ok());
    };
    write(small_shape(256, 512), gguf::GgmlType::kF32, "f32.gguf");
    write(small_shape(256, 512), gguf::GgmlType::kQ8_0, "q8_0.gguf");
    // q_dim 8 x 128 = 1024 and ffn 1024: four segments of whole Q4_K / Q6_K blocks (256).
    write(small_shape(256, 1024, 128), gguf::GgmlType::kF32, "big_f32.gguf");
    auto in = gguf::GgufFile::open(*dir_ / "big_f32.gguf");
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    auto recipe = gguf::parse_quantize_recipe("q4_k_m");
    ASSERT_TRUE(recipe.ok());
    auto q = gguf::quantize_model(*in, {.target = recipe->type, .mix = recipe->mix}, nullptr);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    ASSERT_TRUE(q->write(*dir_ / "q4_k_m.gguf").ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path(const std::string& name) { return *dir_ / name; }
  static test::TempDir* dir_;
};
test::TempDir* TpTest::dir_ = nullptr;

// Runs the fixed three steps on one rank; returns every logits row of every step (rank 0) or
// the first error.
Result<std::vector<float>> run_steps(const std::string& path, const TpContext& tp) {
  RunnerOptions o;
  o.num_blocks = 8;
  o.num_threads = 1;
  o.tp = tp;
  ARBOR_ASSIGN_OR_RETURN(auto runner, ModelRunner::load(path, o));
  const int32_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> table0 = {0, 1}, table1 = {2, 3};
  const std::vector<int32_t> a = {1, 17, 400, 999, 3, 250, 251}, b = {1000, 5, 500, 42};
  const std::vector<int32_t> a2 = {77}, b2 = {123}, a3 = {9};
  std::vector<float> all;
  BatchBuilder builder(16);
  const auto step = [&](std::vector<SequenceInput> seqs) -> Status {
    builder.clear();
    for (const SequenceInput& s : seqs) builder.add(s);
    std::vector<float> logits(static_cast<size_t>(builder.num_logits()) * vocab);
    ARBOR_RETURN_IF_ERROR(runner->forward(builder.batch(), logits.data()));
    all.insert(all.end(), logits.begin(), logits.end());
    return ok_status();
  };
  ARBOR_RETURN_IF_ERROR(step({{.block_table = table0, .tokens = a, .logits = LogitsMode::kAll},
                              {.block_table = table1, .tokens = b, .logits = LogitsMode::kAll}}));
  ARBOR_RETURN_IF_ERROR(step({{.block_table = table0, .num_committed = 7, .tokens = a2},
                              {.block_table = table1, .num_committed = 4, .tokens = b2}}));
  ARBOR_RETURN_IF_ERROR(step({{.block_table = table0, .num_committed = 8, .tokens = a3}}));
  return all;
}

// A shared anonymous buffer that forked children write their results into.
struct SharedBuffer {
  explicit SharedBuffer(size_t bytes) : bytes(bytes) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ARBOR_CHECK(p != MAP_FAILED);
  }
  ~SharedBuffer() { munmap(p, bytes); }
  void* p;
  size_t bytes;
};

// Runs fn(rank, tp) in `size` forked processes sharing one shm region; returns each child's exit
// code (0 = fn returned true).
template <class Fn>
std::vector<int> run_ranks(int size, const Fn& fn, int timeout_ms = 20000) {
  auto region = ShmRegion::create_anonymous({size, size_t{1} << 20});
  ARBOR_CHECK(region.ok()) << region.status().to_string();
  std::vector<pid_t> kids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    ARBOR_CHECK(pid >= 0);
    if (pid == 0) {
      TpContext tp{r, size,
                   std::make_shared<ShmCollective>(*region, r, std::chrono::milliseconds(timeout_ms))};
      _exit(fn(r, tp) ? 0 : 1);
    }
    kids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// Rank 0's logits of run_steps at TP = size (forked ranks), or an empty vector on failure.
std::vector<float> tp_logits(const std::string& path, int size, size_t n) {
  SharedBuffer out(n * sizeof(float) + 64);
  std::memset(out.p, 0, out.bytes);
  const std::vector<int> codes = run_ranks(size, [&](int rank, const TpContext& tp) {
    Result<std::vector<float>> got = run_steps(path, tp);
    if (!got.ok()) {
      fprintf(stderr, "rank %d: %s\n", rank, got.status().to_string().c_str());
      return false;
    }
    if (rank == 0) {
      if (got->size() != n) return false;
      std::memcpy(out.p, got->data(), n * sizeof(float));
    }
    return true;
  });
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << size;
    if (codes[r] != 0) return {};
  }
  const float* p = static_cast<const float*>(out.p);
  return std::vector<float>(p, p + n);
}

void expect_bitwise_equal_at_every_degree(const std::string& path, int expect_segments) {
  auto model = LlamaModel::load(path);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->num_segments(), expect_segments);
  Result<std::vector<float>> one = run_steps(path, TpContext{});
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ASSERT_EQ(one->size(), (11 + 2 + 1) * size_t{1001});
  for (float v : *one) ASSERT_TRUE(std::isfinite(v));
  for (int size : {2, 4}) {
    const std::vector<float> tp = tp_logits(path, size, one->size());
    ASSERT_EQ(tp.size(), one->size()) << "TP " << size;
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < tp.size(); ++i) {
      if (std::memcmp(&tp[i], &(*one)[i], 4) != 0 && differ++ == 0) first = i;
    }
    EXPECT_EQ(differ, 0u) << "TP " << size << ": " << differ << " logits differ from TP 1, first at "
                          << first << " (" << tp[first] << " vs " << (*one)[first] << ")";
  }
}

// On every ISA this CPU has (forked ranks inherit the choice): each ISA's kernels, packed or
// not, must give a segment the same bits wherever it is computed.
void on_every_isa(const std::string& file) {
  const kernels::Isa best = kernels::best_isa();
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (isa > best) continue;
    SCOPED_TRACE(std::string(kernels::isa_name(isa)));
    kernels::set_active_isa(isa);
    expect_bitwise_equal_at_every_degree(file, 4);
  }
  kernels::set_active_isa(best);
}

TEST_F(TpTest, LogitsBitwiseEqualAtTp124F32) { on_every_isa(path("f32.gguf")); }
TEST_F(TpTest, LogitsBitwiseEqualAtTp124Q8_0) { on_every_isa(path("q8_0.gguf")); }
TEST_F(TpTest, LogitsBitwiseEqualAtTp124Q4KM) { on_every_isa(path("q4_k_m.gguf")); }

// The segmented TP = 1 forward against the same model without segments (the old single matmul
// over K): close (only the order of f32 sums differs), which guards against a segment reading
// the wrong columns.
TEST_F(TpTest, SegmentsChangeOnlyTheSummationOrder) {
  auto model = LlamaModel::load(path("q8_0.gguf"));
  ASSERT_TRUE(model.ok());
  const LayerWeights& l = (*model)->weights().layers[0];
  ASSERT_EQ(l.o_segs.size(), 4u);
  ASSERT_EQ(l.down_segs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(l.o_segs[i].cols, 64);
    EXPECT_EQ(l.down_segs[i].cols, 128);
    EXPECT_EQ(static_cast<const uint8_t*>(l.down_segs[i].data) -
                  static_cast<const uint8_t*>(l.down.w.data),
              static_cast<ptrdiff_t>(i * 128 / 32 * 34));
    EXPECT_NE(l.down_segs[i].packed == nullptr, kernels::packing_available(l.down.w.type));
  }
  kernels::ThreadPool pool(2);
  std::vector<float> x(3 * 512), whole(3 * 256), seg(3 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * i);
  kernels::matmul_ref_quantized_act(l.down.w, x.data(), whole.data(), 3);
  CpuForwardOps ops(**model, pool);
  ops.matmul_segmented(l.down.w, l.down_segs, x.data(), seg.data(), 3);
  for (size_t i = 0; i < seg.size(); ++i) EXPECT_NEAR(seg[i], whole[i], 1e-4f * (1 + std::fabs(whole[i]))) << i;
}

TEST_F(TpTest, GreedyDecodingAtTp2EqualsTp1) {
  const std::string p = path("q4_k_m.gguf");
  constexpr int kSteps = 24;
  // Greedy through LogitsOut's argmax rows (the (max, argmax) gather at TP 2).
  const auto decode = [&](const TpContext& tp, int32_t* tokens) -> Status {
    RunnerOptions o;
    o.num_blocks = 4;
    o.num_threads = 1;
    o.tp = tp;
    ARBOR_ASSIGN_OR_RETURN(auto runner, ModelRunner::load(p, o));
    const std::vector<int32_t> table = {0, 1, 2};
    std::vector<int32_t> seq = {1, 300, 17, 42, 808};
    BatchBuilder builder(16);
    const RowOut want[] = {RowOut::kArgmax};
    for (int i = 0; i < kSteps; ++i) {
      builder.clear();
      const int32_t committed = i == 0 ? 0 : static_cast<int32_t>(seq.size()) - 1;
      const std::span<const int32_t> fresh = std::span<const int32_t>(seq).subspan(committed);
      builder.add({.block_table = table, .num_committed = committed, .tokens = fresh});
      int32_t next = -5;
      std::vector<float> logits(1001);  // the CPU computes the row in place
      LogitsOut out;
      out.logits = logits.data();
      out.want = want;
      out.argmax = &next;
      ARBOR_RETURN_IF_ERROR(runner->forward(builder.batch(), out));
      if (tp.rank == 0 && next < 0) return internal_error("no argmax at step ", i);
      // Only rank 0 has the argmax; the engine would send the token to every rank.
      if (tp.size > 1) {
        ARBOR_RETURN_IF_ERROR(tp.collective->broadcast(&next, sizeof(next), {99, 0, 0}));
      }
      tokens[i] = next;
      seq.push_back(next);
    }
    return ok_status();
  };
  std::vector<int32_t> one(kSteps);
  ASSERT_TRUE(decode(TpContext{}, one.data()).ok());
  SharedBuffer buf(kSteps * sizeof(int32_t));
  const std::vector<int> codes = run_ranks(2, [&](int rank, const TpContext& tp) {
    std::vector<int32_t> mine(kSteps);
    const Status s = decode(tp, mine.data());
    if (!s.ok()) fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
    if (rank == 0) std::memcpy(buf.p, mine.data(), kSteps * sizeof(int32_t));
    return s.ok();
  });
  ASSERT_EQ(codes, (std::vector<int>{0, 0}));
  const auto* two = static_cast<const int32_t*>(buf.p);
  EXPECT_EQ(std::vector<int32_t>(two, two + kSteps), one);
  // Not a constant sequence (a test that any argmax would pass).
  EXPECT_GT(std::set<int32_t>(one.begin(), one.end()).size(), 3u);
}

TEST_F(TpTest, EachRankHoldsItsShare) {
  const std::string p = path("q4_k_m.gguf");
  auto whole = LlamaModel::load(p);
  ASSERT_TRUE(whole.ok());
  const uint64_t embd = (*whole)->weights().token_embd.rows *
                        kernels::weight_row_bytes((*whole)->weights().token_embd.type, 256);
  const uint64_t all = (*whole)->resident_weight_bytes() - embd;
  for (int size : {2, 4}) {
    for (int rank = 0; rank < size; ++rank) {
      auto m = LlamaModel::load(p, {.tp_rank = rank, .tp_size = size});
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      const uint64_t mine = (*m)->resident_weight_bytes() - embd;
      EXPECT_LT(mine, all / size * 1.05) << "rank " << rank << " of " << size;
      EXPECT_GT(mine, all / size * 0.90) << "rank " << rank << " of " << size;
      EXPECT_EQ((*m)->weights().layers[1].q.w.rows, 1024 / size);
      EXPECT_EQ((*m)->weights().layers[1].down.w.cols, 1024 / size);
      EXPECT_EQ((*m)->weights().layers[1].down_segs.size(), 4u / size);
    }
  }
}

TEST_F(TpTest, RanksWithDifferentBatchesFail) {
  SharedBuffer msg(1024);
  const std::vector<int> codes = run_ranks(2, [&](int rank, const TpContext& tp) {
    RunnerOptions o;
    o.num_blocks = 4;
    o.num_threads = 1;
    o.tp = tp;
    auto runner = ModelRunner::load(path("f32.gguf"), o);
    if (!runner.ok()) return false;
    const std::vector<int32_t> table = {0};
    const std::vector<int32_t> tokens = {1, rank == 0 ? 2 : 3};  // a different batch per rank
    BatchBuilder builder(16);
    builder.add({.block_table = table, .tokens = tokens});
    std::vector<float> logits(1001);
    const Status s = (*runner)->forward(builder.batch(), logits.data());
    if (rank == 0) std::snprintf(static_cast<char*>(msg.p), 1024, "%s", s.to_string().c_str());
    return !s.ok();  // both ranks must see the error
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  EXPECT_NE(std::string(static_cast<const char*>(msg.p)).find("not running the same batch"),
            std::string::npos)
      << static_cast<const char*>(msg.p);
}

TEST_F(TpTest, MissingRankIsAnErrorAtTheDeadline) {
  SharedBuffer msg(1024);
  const std::vector<int> codes = run_ranks(
      2,
      [&](int rank, const TpContext& tp) {
        if (rank == 1) return true;  // dies before its first step
        RunnerOptions o;
        o.num_blocks = 4;
        o.num_threads = 1;
        o.tp = tp;
        auto runner = ModelRunner::load(path("f32.gguf"), o);
        if (!runner.ok()) return false;
        const std::vector<int32_t> table = {0}, tokens = {1, 2};
        BatchBuilder builder(16);
        builder.add({.block_table = table, .tokens = tokens});
        std::vector<float> logits(1001);
        const Status s = (*runner)->forward(builder.batch(), logits.data());
        std::snprintf(static_cast<char*>(msg.p), 1024, "%s", s.to_string().c_str());
        return !s.ok();
      },
      /*timeout_ms=*/300);
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  EXPECT_NE(std::string(static_cast<const char*>(msg.p)).find("rank 1 did not arrive within 300 ms"),
            std::string::npos)
      << static_cast<const char*>(msg.p);
}

TEST_F(TpTest, UnsupportedDegreesAreRefused) {
  auto three = LlamaModel::load(path("f32.gguf"), {.tp_rank = 0, .tp_size = 3});
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("arbor runs 1, 2 or 4"), std::string::npos);
  // A GPU device runs one rank.
  RunnerOptions o;
  o.tp = TpContext{0, 2, nullptr};
  o.make_ops = [](const LlamaModel&) -> Result<std::unique_ptr<ForwardOps>> {
    return internal_error("not reached");
  };
  auto gpu = ModelRunner::load(path("f32.gguf"), o);
  ASSERT_FALSE(gpu.ok());
  EXPECT_NE(gpu.status().message().find("runs on the CPU only"), std::string::npos)
      << gpu.status().to_string();
  // Without a collective.
  RunnerOptions no_coll;
  no_coll.num_blocks = 4;
  no_coll.tp = TpContext{1, 2, nullptr};
  auto lone = ModelRunner::load(path("f32.gguf"), no_coll);
  ASSERT_FALSE(lone.ok());
  EXPECT_NE(lone.status().message().find("needs its group's collective"), std::string::npos)
      << lone.status().to_string();
}

TEST(TpConfig, SegmentCountAndLimits) {
  ModelConfig c;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.ffn_dim = 1024;
  c.vocab_size = 1001;
  LlamaWeights w;
  w.layers.resize(1);
  w.layers[0].o.w.type = gguf::GgmlType::kQ4_K;
  w.layers[0].down.w.type = gguf::GgmlType::kQ6_K;
  // 2 kv heads: at most 2 segments, and q_dim / 2 = 256 is one Q4_K block.
  EXPECT_EQ(canonical_segments(c, w), 2);
  c.num_kv_heads = 4;  // q_dim / 4 = 128: not a whole Q4_K block
  EXPECT_EQ(canonical_segments(c, w), 2);
  w.layers[0].o.w.type = gguf::GgmlType::kQ8_0;
  EXPECT_EQ(canonical_segments(c, w), 4);
  const Status s = check_tp(c, 2, 4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("at most 2"), std::string::npos) << s.to_string();
  const TpShape last = tp_shape(c, 3, 4);
  EXPECT_EQ(last.vocab_pad, 251);
  EXPECT_EQ(last.vocab_begin, 753);
  EXPECT_EQ(last.vocab_rows, 248);
  EXPECT_EQ(last.num_heads, 2);
  EXPECT_EQ(last.ffn_dim, 256);
}

}  // namespace
}  // namespace arbor::model
