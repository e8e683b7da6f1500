#include "golden_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "support/temp_dir.h"

namespace arbor::model::testing {
namespace {

// shared/<rel> parsed; null (and the test failed) when the file is missing.
nlohmann::json read_shared_json(const std::string& rel) {
  if (!test::expect_shared_file(rel)) return nlohmann::json();
  return nlohmann::json::parse(test::read_file(shared_path(rel)));
}

// Replaces SentencePiece's U+2581 with a space.
std::string piece_text(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size(); ++i) {
    if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += piece[i];
    }
  }
  return out;
}

}  // namespace

std::vector<GoldenCase> load_stories260k_golden(const gguf::GgufFile& vocab_file) {
  auto pieces = vocab_file.get_string_array("tokenizer.ggml.tokens");
  EXPECT_TRUE(pieces.ok());
  const nlohmann::json j = read_shared_json("goldens/stories260K_greedy.json");
  std::vector<GoldenCase> cases;
  for (const auto& jc : j["cases"]) {
    GoldenCase c;
    c.prompt = jc["prompt"].get<std::string>();
    c.ids = {1};
    for (int id : jc["ids_after_bos"]) c.ids.push_back(id);
    c.max_len = jc["steps"].get<int>() + 1;
    c.stop_id = 1;
    const std::string target = c.prompt.empty() ? "" : " " + c.prompt;
    std::string text;
    c.prompt_len = -1;
    for (size_t k = 1; k <= c.ids.size(); ++k) {
      if (text == target) {
        c.prompt_len = (int32_t)k;
        break;
      }
      if (k < c.ids.size()) text += piece_text((*pieces)[c.ids[k]]);
    }
    EXPECT_GT(c.prompt_len, 0) << "prompt \"" << c.prompt << "\" does not match the ids";
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<GoldenCase> load_tinystories_golden() {
  const nlohmann::json j = read_shared_json("goldens/tinystories656K_greedy.json");
  std::vector<GoldenCase> cases;
  for (const auto& jc : j["cases"]) {
    GoldenCase c;
    c.prompt = jc["prompt"].get<std::string>();
    c.ids = jc["ids"].get<std::vector<int32_t>>();
    c.prompt_len = (int32_t)jc["prompt_ids"].size();
    c.max_len = jc["steps"].get<int>() + 1;
    c.stop_id = 2;
    cases.push_back(std::move(c));
  }
  return cases;
}

int32_t argmax(const float* logits, int32_t n) {
  return (int32_t)(std::max_element(logits, logits + n) - logits);
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

namespace {

struct SeqState {
  std::vector<int32_t> ids;     // produced so far (prompt included)
  int32_t committed = 0;        // ids already in the cache
  std::vector<int32_t> blocks;  // block table
  bool done = false;
};

// Adds sequence s's next chunk (prompt tokens still pending, else its last produced token).
void add_step(BatchBuilder& builder, const SeqState& s, int32_t chunk) {
  const int32_t pending = (int32_t)s.ids.size() - s.committed;
  const int32_t n = chunk > 0 ? std::min(chunk, pending) : pending;
  SequenceInput in;
  in.block_table = s.blocks;
  in.num_committed = s.committed;
  in.tokens = std::span<const int32_t>(s.ids).subspan(s.committed, n);
  in.logits = LogitsMode::kLast;
  builder.add(in);
}

}  // namespace

std::vector<std::vector<int32_t>> greedy_batched(ModelRunner& runner,
                                                 const std::vector<GoldenCase>& cases,
                                                 const GreedyOptions& options) {
  const int32_t bs = runner.kv_cache().block_size();
  const int32_t vocab = runner.config().vocab_size;
  std::vector<SeqState> seqs(cases.size());
  int32_t max_blocks = 0;
  for (const GoldenCase& c : cases) max_blocks = std::max(max_blocks, (c.max_len + bs - 1) / bs);
  for (size_t b = 0; b < cases.size(); ++b) {
    const int32_t prefix = std::max(cases[b].prompt_len, options.forced_prefix);
    seqs[b].ids.assign(cases[b].ids.begin(), cases[b].ids.begin() + prefix);
    // Interleaved ids: sequence b owns blocks b, b + B, b + 2B, ...
    for (int32_t i = 0; i < max_blocks; ++i) {
      seqs[b].blocks.push_back((int32_t)b + i * (int32_t)cases.size());
    }
  }
  BatchBuilder builder(bs);
  std::vector<float> logits;
  std::vector<size_t> active;
  while (true) {
    builder.clear();
    active.clear();
    for (size_t b = 0; b < seqs.size(); ++b) {
      if (seqs[b].done) continue;
      add_step(builder, seqs[b], options.prefill_chunk);
      active.push_back(b);
    }
    if (active.empty()) break;
    const ForwardBatch batch = builder.batch();
    logits.resize((size_t)batch.num_logits() * vocab);
    const Status st = runner.forward(batch, logits.data());
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
    for (size_t a = 0; a < active.size(); ++a) {
      SeqState& s = seqs[active[a]];
      s.committed += batch.qo_indptr[a + 1] - batch.qo_indptr[a];
      if (s.committed < (int32_t)s.ids.size()) continue;  // prompt chunks left
      const int32_t next = argmax(logits.data() + a * vocab, vocab);
      const GoldenCase& c = cases[active[a]];
      if (next == c.stop_id) {
        s.done = true;
        continue;
      }
      s.ids.push_back(next);
      if ((int32_t)s.ids.size() >= c.max_len) s.done = true;
    }
  }
  std::vector<std::vector<int32_t>> out;
  for (SeqState& s : seqs) out.push_back(std::move(s.ids));
  return out;
}

std::vector<int32_t> greedy_single(ModelRunner& runner, const GoldenCase& c,
                                   int32_t prefill_chunk) {
  const int32_t bs = runner.kv_cache().block_size();
  const int32_t vocab = runner.config().vocab_size;
  SingleSequence seq(runner, SingleSequence::contiguous_blocks(0, (c.max_len + bs - 1) / bs));
  std::vector<int32_t> ids(c.ids.begin(), c.ids.begin() + c.prompt_len);
  auto logits = seq.append(ids, prefill_chunk);
  while (logits.ok() && (int32_t)ids.size() < c.max_len) {
    const int32_t next = argmax(logits->data(), vocab);
    if (next == c.stop_id) break;
    ids.push_back(next);
    if ((int32_t)ids.size() >= c.max_len) break;
    logits = seq.append(std::span<const int32_t>(&ids.back(), 1));
  }
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  return ids;
}

}  // namespace arbor::model::testing
