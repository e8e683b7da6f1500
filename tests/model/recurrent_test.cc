// Qwen3.5's hybrid models (Gated DeltaNet layers with per-sequence state; docs/qwen35.md) on
// the runner, bit for bit:
//   * a prompt run in one step equals the same prompt in chunks of 1, 5 and 16 tokens (the
//     state carried between steps equals the state within one), every row's logits;
//   * a batch of sequences in distinct state slots — a prefill, a decode and a chunk, of
//     different lengths — equals each sequence run alone, F32 and Q8_0, 1 and 2 threads;
//   * a sequence that starts at position 0 in a slot another sequence used starts from zero;
//   * the batch's state slots are validated (count, range, duplicates; no token trees).
// The kernel's arithmetic against a double-precision transcription of the reference recurrence
// is tests/kernels/gated_delta_net_test.cc's; the agreement with llama.cpp
// tests/model/arch_reference_test.cc's.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/batch_builder.h"
#include "model/runner.h"
#include "model/synth_model.h"
#include "support/temp_dir.h"

namespace arbor::model::recurrent_testing {
namespace {

using gguf::GgmlType;

constexpr int64_t kVocab = 512;
constexpr int32_t kBlocks = 32;  // 16 tokens each, 8 per sequence below

std::string write_model(const std::string& preset, GgmlType type, const test::TempDir& dir) {
  SynthShape s = *find_synth_preset(preset);
  s.vocab = 0;
  kernels::ThreadPool pool(2);
  auto w = synth_model(s, type, 7, kVocab, {}, pool);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  const std::string path = dir / (preset + "-" + std::string(gguf::ggml_type_name(type)) + ".gguf");
  EXPECT_TRUE(w->write(path).ok());
  return path;
}

std::vector<int32_t> prompt(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = 1 + static_cast<int32_t>(rng() % (kVocab - 1));
  return ids;
}

std::unique_ptr<ModelRunner> load(const std::string& path, int threads, int32_t slots = 4) {
  RunnerOptions o{.block_size = 16, .num_blocks = kBlocks, .kv_dtype = kernels::KvDtype::kF32,
                  .num_threads = threads};
  o.state_slots = slots;
  auto r = ModelRunner::load(path, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Every row's logits of `ids` appended in chunks of `chunk` (0: one step).
std::vector<float> chunked_logits(ModelRunner& runner, const std::vector<int32_t>& ids,
                                  int32_t chunk) {
  SingleSequence seq(runner, SingleSequence::contiguous_blocks(0, 8));
  std::vector<float> out;
  const size_t step = chunk > 0 ? static_cast<size_t>(chunk) : ids.size();
  for (size_t i = 0; i < ids.size(); i += step) {
    const size_t n = std::min(step, ids.size() - i);
    auto l = seq.append_all_logits(std::span<const int32_t>(ids).subspan(i, n));
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    if (!l.ok()) return {};
    out.insert(out.end(), l->begin(), l->end());
  }
  return out;
}

TEST(Qwen35Runner, ChunkedPrefillEqualsOneStepBitForBit) {
  test::TempDir dir("qwen35_chunks");
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe"}) {
    SCOPED_TRACE(preset);
    const std::string path = write_model(preset, GgmlType::kF32, dir);
    auto runner = load(path, 2);
    ASSERT_NE(runner, nullptr);
    EXPECT_EQ(runner->config().num_recurrent_layers(), 3);
    // K/V pools for the one attention layer only: a block is a quarter of a 4-layer model's.
    EXPECT_EQ(runner->kv_cache().shape().num_pools(), 1);
    EXPECT_EQ(PagedKvCache::bytes_per_block(runner->kv_cache().shape()),
              size_t{2} * 2 * 16 * 64 * sizeof(float));  // K and V, 2 kv heads, 16 tokens, 64
    const std::vector<int32_t> ids = prompt(70, 3);
    const std::vector<float> whole = chunked_logits(*runner, ids, 0);
    ASSERT_EQ(whole.size(), ids.size() * kVocab);
    for (int32_t chunk : {1, 5, 16}) {
      const std::vector<float> parts = chunked_logits(*runner, ids, chunk);
      ASSERT_EQ(parts.size(), whole.size());
      EXPECT_EQ(std::memcmp(parts.data(), whole.data(), whole.size() * sizeof(float)), 0)
          << "chunks of " << chunk;
    }
  }
}

struct Seq {
  std::vector<int32_t> ids;
  int32_t slot;
  int32_t first_block;
};

// Runs `seqs` (each from its first token) in steps of `steps[i]` tokens per sequence per step,
// all in one batch per step, and returns each sequence's logits rows, in order.
std::vector<std::vector<float>> run_batched(ModelRunner& runner, const std::vector<Seq>& seqs,
                                            const std::vector<std::vector<int32_t>>& steps) {
  std::vector<std::vector<float>> out(seqs.size());
  std::vector<int32_t> done(seqs.size(), 0);
  BatchBuilder builder(16);
  std::vector<std::vector<int32_t>> tables;
  for (const Seq& s : seqs) tables.push_back(SingleSequence::contiguous_blocks(s.first_block, 8));
  for (size_t step = 0;; ++step) {
    builder.clear();
    std::vector<size_t> in_batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (step >= steps[i].size()) continue;
      const int32_t n = steps[i][step];
      SequenceInput in;
      in.block_table = tables[i];
      in.num_committed = done[i];
      in.tokens = std::span<const int32_t>(seqs[i].ids).subspan(done[i], n);
      in.logits = LogitsMode::kAll;
      in.state_slot = seqs[i].slot;
      builder.add(in);
      in_batch.push_back(i);
    }
    if (in_batch.empty()) break;
    std::vector<float> logits(static_cast<size_t>(builder.num_logits()) * kVocab);
    const Status st = runner.forward(builder.batch(), logits.data());
    EXPECT_TRUE(st.ok()) << st.to_string();
    size_t row = 0;
    for (size_t i : in_batch) {
      const int32_t n = steps[i][step];
      out[i].insert(out[i].end(), logits.begin() + row * kVocab,
                    logits.begin() + (row + n) * kVocab);
      row += n;
      done[i] += n;
    }
  }
  return out;
}

TEST(Qwen35Runner, BatchedEqualsAloneBitForBit) {
  test::TempDir dir("qwen35_batch");
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
    const std::string path = write_model("tiny-qwen35", type, dir);
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(gguf::ggml_type_name(type)) + " threads " + std::to_string(threads));
      auto runner = load(path, threads);
      ASSERT_NE(runner, nullptr);
      // Sequence 0 prefills 24 then decodes; 1 runs chunks of 9; 2 decodes token by token.
      const std::vector<Seq> seqs = {{prompt(30, 1), 2, 0}, {prompt(27, 2), 0, 8},
                                     {prompt(6, 3), 3, 16}};
      const std::vector<std::vector<int32_t>> steps = {
          {24, 1, 1, 1, 1, 1, 1}, {9, 9, 9}, {1, 1, 1, 1, 1, 1}};
      const auto together = run_batched(*runner, seqs, steps);
      for (size_t i = 0; i < seqs.size(); ++i) {
        const auto alone = run_batched(*runner, {seqs[i]}, {steps[i]});
        ASSERT_EQ(alone[0].size(), together[i].size());
        EXPECT_EQ(std::memcmp(alone[0].data(), together[i].data(),
                              alone[0].size() * sizeof(float)),
                  0)
            << "sequence " << i;
      }
    }
  }
}

TEST(Qwen35Runner, AFreshSequenceIgnoresItsSlotsOldState) {
  test::TempDir dir("qwen35_fresh");
  const std::string path = write_model("tiny-qwen35", GgmlType::kF32, dir);
  auto runner = load(path, 2);
  ASSERT_NE(runner, nullptr);
  const std::vector<int32_t> a = prompt(20, 4), b = prompt(12, 5);
  const auto clean = run_batched(*runner, {{b, 1, 0}}, {{12}});
  run_batched(*runner, {{a, 1, 8}}, {{20}});  // slot 1 now holds a's state
  const auto reused = run_batched(*runner, {{b, 1, 0}}, {{12}});
  ASSERT_EQ(clean[0].size(), reused[0].size());
  EXPECT_EQ(std::memcmp(clean[0].data(), reused[0].data(), clean[0].size() * sizeof(float)), 0);
}

TEST(Qwen35Runner, StateSlotsAreValidated) {
  test::TempDir dir("qwen35_validate");
  const std::string path = write_model("tiny-qwen35", GgmlType::kF32, dir);
  auto runner = load(path, 1, 2);
  ASSERT_NE(runner, nullptr);
  const std::vector<int32_t> ids = prompt(4, 6);
  const std::vector<int32_t> t0 = SingleSequence::contiguous_blocks(0, 2),
                             t1 = SingleSequence::contiguous_blocks(2, 2);
  auto forward = [&](int32_t s0, int32_t s1, bool tree) {
    BatchBuilder b(16);
    std::vector<uint8_t> mask(2, 0xff);  // every bit: a 4 x 4 mask whose diagonal is set
    for (int i = 0; i < 2; ++i) {
      SequenceInput in;
      in.block_table = i == 0 ? t0 : t1;
      in.tokens = ids;
      in.state_slot = i == 0 ? s0 : s1;
      if (tree && i == 1) in.mask_bits = mask;
      b.add(in);
    }
    std::vector<float> logits(2 * kVocab);
    return runner->forward(b.batch(), logits.data());
  };
  EXPECT_TRUE(forward(0, 1, false).ok());
  const Status dup = forward(1, 1, false);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("shared with another sequence"), std::string::npos) << dup.to_string();
  const Status range = forward(0, 2, false);
  EXPECT_NE(range.message().find("the model has 2 state slots"), std::string::npos) << range.to_string();
  const Status tree = forward(0, 1, true);
  EXPECT_EQ(tree.code(), StatusCode::kUnimplemented) << tree.to_string();
  // No slots at all.
  BatchBuilder b(16);
  SequenceInput in;
  in.block_table = t0;
  in.tokens = ids;
  b.add(in);
  std::vector<float> logits(kVocab);
  const Status none = runner->forward(b.batch(), logits.data());
  EXPECT_NE(none.message().find("state_slots has 0 entries"), std::string::npos) << none.to_string();
}

// Speculation's rollback: a chain of 1 + 4 tokens verified in a scratch slot leaves the
// sequence's slot untouched (its rows' logits equal a plain run's), and replaying the first
// 1 + a of them (a = 0 .. 4 accepted) into the slot gives the state a plain run over those tokens
// leaves: the next token's logits are equal, bit for bit.
TEST(Qwen35Runner, ScratchVerificationAndCommitEqualAPlainRun) {
  test::TempDir dir("qwen35_commit");
  const std::string path = write_model("tiny-qwen35", GgmlType::kF32, dir);
  auto runner = load(path, 2);
  ASSERT_NE(runner, nullptr);
  const std::vector<int32_t> ids = prompt(26, 8);  // 20 prompt, 5 verified, 1 next
  const std::vector<int32_t> table = SingleSequence::contiguous_blocks(0, 8);
  auto step = [&](int32_t committed, int32_t n, int32_t scratch, std::vector<float>& logits) {
    BatchBuilder b(16);
    SequenceInput in;
    in.block_table = table;
    in.num_committed = committed;
    in.tokens = std::span<const int32_t>(ids).subspan(committed, n);
    in.logits = LogitsMode::kAll;
    in.state_slot = 1;
    in.state_scratch = scratch;
    b.add(in);
    logits.resize(static_cast<size_t>(n) * kVocab);
    return runner->forward(b.batch(), logits.data());
  };
  for (int32_t accepted = 0; accepted <= 4; ++accepted) {
    SCOPED_TRACE(accepted);
    std::vector<float> plain_verify, plain_next, verify, next, unused;
    // Plain: the prompt, then the 5 tokens in place, then (from a fresh run) the prompt,
    // 1 + accepted tokens and the next one.
    ASSERT_TRUE(step(0, 20, -1, unused).ok());
    ASSERT_TRUE(step(20, 5, -1, plain_verify).ok());
    ASSERT_TRUE(step(0, 21 + accepted, -1, unused).ok());
    ASSERT_TRUE(step(21 + accepted, 1, -1, plain_next).ok());
    // Speculative: the prompt, the 5 tokens into scratch slot 3, the accepted rows committed.
    ASSERT_TRUE(step(0, 20, -1, unused).ok());
    ASSERT_TRUE(step(20, 5, 3, verify).ok());
    EXPECT_EQ(std::memcmp(verify.data(), plain_verify.data(), verify.size() * sizeof(float)), 0);
    StateCommit c{1, {}};
    for (int32_t r = 0; r <= accepted; ++r) c.rows.push_back(r);
    ASSERT_TRUE(runner->commit_states({&c, 1}).ok());
    ASSERT_TRUE(step(21 + accepted, 1, -1, next).ok());
    EXPECT_EQ(std::memcmp(next.data(), plain_next.data(), next.size() * sizeof(float)), 0);
  }
  // A commit needs a speculative forward before it, and rows of it.
  StateCommit c{1, {0}};
  EXPECT_EQ(runner->commit_states({&c, 1}).code(), StatusCode::kFailedPrecondition);
  // Only the verifying sequence's rows are kept: a prompt beside it is not (its rows are not
  // copied, so they cannot be committed).
  BatchBuilder b(16);
  const std::vector<int32_t> other = SingleSequence::contiguous_blocks(8, 8);
  SequenceInput verify;
  verify.block_table = table;
  verify.num_committed = 20;
  verify.tokens = std::span<const int32_t>(ids).subspan(20, 5);
  verify.state_slot = 1;
  verify.state_scratch = 3;
  b.add(verify);
  SequenceInput prompt_in;
  prompt_in.block_table = other;
  prompt_in.tokens = std::span<const int32_t>(ids).first(12);
  prompt_in.state_slot = 2;
  b.add(prompt_in);
  EXPECT_EQ(b.batch().replay_rows.size(), 5u);
  std::vector<float> logits(2 * kVocab);
  ASSERT_TRUE(runner->forward(b.batch(), logits.data()).ok());
  StateCommit stray{2, {5}};
  const Status refused = runner->commit_states({&stray, 1});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  StateCommit kept{1, {0, 1}};
  EXPECT_TRUE(runner->commit_states({&kept, 1}).ok());
}

// The file's keys: what the loader refuses, naming the key.
TEST(Qwen35Runner, RefusesInconsistentKeys) {
  test::TempDir dir("qwen35_keys");
  SynthShape s = *find_synth_preset("tiny-qwen35");
  s.vocab = 0;
  s.nextn = 0;  // 4 blocks, all trunk
  kernels::ThreadPool pool(2);
  struct Case {
    std::string key;
    gguf::Value value;
    std::string needle;
  };
  const Case cases[] = {
      {"qwen35.ssm.inner_size", gguf::Value::u32(96), "qwen35.ssm.inner_size = 96 must be"},
      {"qwen35.ssm.time_step_rank", gguf::Value::u32(3), "a multiple of group_count (2)"},
      {"qwen35.ssm.state_size", gguf::Value::u32(12), "state sizes that are multiples of 8"},
      {"qwen35.rope.dimension_sections", gguf::Value::i32_array({8, 8, 8, 0}),
       "must be non-negative and sum to at most rope.dimension_count / 2 = 8"},
      {"qwen35.nextn_predict_layers", gguf::Value::u32(4), "nextn_predict_layers = 4 of 4"},
  };
  for (const Case& c : cases) {
    auto w = synth_model(s, GgmlType::kF32, 1, kVocab, {}, pool);
    ASSERT_TRUE(w.ok());
    w->set(c.key, c.value);
    const std::string path = dir / "edited.gguf";
    ASSERT_TRUE(w->write(path).ok());
    auto m = LlamaModel::load(path);
    ASSERT_FALSE(m.ok()) << c.key;
    EXPECT_NE(m.status().message().find(c.needle), std::string::npos) << m.status().to_string();
  }
  // A trailing MTP block is counted by block_count and skipped: 4 blocks, 1 of them MTP, is a
  // 3-layer trunk whose last layer (2) is recurrent and blk.3.* are left alone.
  auto w = synth_model(s, GgmlType::kF32, 1, kVocab, {}, pool);
  ASSERT_TRUE(w.ok());
  w->set("qwen35.nextn_predict_layers", gguf::Value::u32(1));
  const std::string path = dir / "mtp.gguf";
  ASSERT_TRUE(w->write(path).ok());
  auto m = LlamaModel::load(path);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->config().num_layers, 3);
  EXPECT_EQ((*m)->config().num_nextn_layers, 1);
  EXPECT_EQ((*m)->config().num_recurrent_layers(), 3);
  // Bound for --spec mtp: blk.3 is then the MTP block, a full-attention layer — and this
  // file's blk.3 is a trunk layer's attention shape too, so it binds; a Gated DeltaNet block
  // there would not (its tensors are not an attention layer's).
  auto mtp = LlamaModel::load(path, {.load_mtp = true});
  EXPECT_FALSE(mtp.ok()) << "blk.3 has no nextn.* tensors";
  if (!mtp.ok()) {
    EXPECT_NE(mtp.status().message().find("nextn.eh_proj"), std::string::npos)
        << mtp.status().to_string();
  }
  // A file written with its MTP block (the preset's) loads with and without it.
  SynthShape with = *find_synth_preset("tiny-qwen35");
  with.vocab = 0;
  auto f = synth_model(with, GgmlType::kF32, 1, kVocab, {}, pool);
  ASSERT_TRUE(f.ok());
  const std::string mtp_path = dir / "with_mtp.gguf";
  ASSERT_TRUE(f->write(mtp_path).ok());
  auto plain = LlamaModel::load(mtp_path);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_TRUE(plain->get()->weights().mtp_layers.empty());
  EXPECT_FALSE(plain->get()->mtp_model().ok()) << "not loaded with load_mtp";
  auto loaded = LlamaModel::load(mtp_path, {.load_mtp = true});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto head = loaded->get()->mtp_model();
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  EXPECT_EQ(head->get()->config().num_layers, 1);
  EXPECT_FALSE(head->get()->config().layers[0].recurrent);
  EXPECT_FALSE(head->get()->config().has_recurrent_layers());
  EXPECT_TRUE(head->get()->weights().is_mtp_view);
  // A file without MTP blocks refuses --spec mtp, naming the key.
  auto none = LlamaModel::load(dir / "edited.gguf", {.load_mtp = true});
  EXPECT_FALSE(none.ok());
}

}  // namespace
}  // namespace arbor::model::recurrent_testing
