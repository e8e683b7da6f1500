// End to end: the real `arbor gguf-info` and `arbor quantize` on the shared model files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "test_files.h"

namespace arbor::gguf {
namespace {

using test::CommandResult;
using test::run_arbor;

std::string stories() { return test::shared_path(test::kStories260K); }

std::string temp_path(const std::string& name) { return test::temp_path(name + ".gguf"); }

TEST(GgufCli, InfoPrintsMetadataAndTensors) {
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  const CommandResult r = run_arbor("gguf-info " + stories());
  ASSERT_EQ(r.exit_code, 0) << r.output();
  EXPECT_NE(r.output().find("GGUF version 3, alignment 32, 19 metadata keys, 48 tensors"),
            std::string::npos);
  EXPECT_NE(r.output().find("llama.block_count"), std::string::npos);
  EXPECT_NE(r.output().find("array[string; 512]"), std::string::npos);
  EXPECT_NE(r.output().find("... (512 items)]"), std::string::npos);
  EXPECT_NE(r.output().find("blk.0.ffn_down.weight"), std::string::npos);
}

TEST(GgufCli, InfoJson) {
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  const CommandResult r = run_arbor("gguf-info --json --max-items 2 " + stories());
  ASSERT_EQ(r.exit_code, 0) << r.output();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["tensors"].size(), 48u);
  EXPECT_EQ(j["totals"]["bytes"], 1171200u);
  bool found = false;
  for (const auto& kv : j["metadata"]) {
    if (kv["key"] == "tokenizer.ggml.tokens") {
      EXPECT_EQ(kv["value"]["length"], 512);
      EXPECT_EQ(kv["value"]["items"].size(), 2u);
      found = true;
    }
    if (kv["key"] == "llama.block_count") {
      EXPECT_EQ(kv["value"], 5);
    }
  }
  EXPECT_TRUE(found);
}

TEST(GgufCli, InfoReportsMissingAndCorruptFiles) {
  CommandResult r = run_arbor("gguf-info /nonexistent.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output().find("error: cannot open /nonexistent.gguf"), std::string::npos) << r.output();
  const std::string bad = temp_path("cli_corrupt");
  test_files::Bytes b;
  b.header(3, 0, 1).u64(1000).raw("abcdefghijklm");
  std::FILE* f = std::fopen(bad.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(b.data().data(), 1, b.size(), f);
  std::fclose(f);
  r = run_arbor("gguf-info " + bad);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output().find("error: " + bad + ": at offset 24: key has length 1000"),
            std::string::npos)
      << r.output();
  std::filesystem::remove(bad);
}

TEST(GgufCli, QuantizeWritesALoadableModel) {
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  const std::string out = temp_path("cli_q8");
  const CommandResult r = run_arbor("quantize " + stories() + " " + out + " q8_0");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  EXPECT_NE(r.output().find("37 tensors converted (5 with a fallback type), 11 kept"),
            std::string::npos)
      << r.output();
  auto f = GgufFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_u32("general.file_type"), 7u);
  EXPECT_EQ(f->find_tensor("blk.1.attn_q.weight")->type, GgmlType::kQ8_0);
  std::filesystem::remove(out);
}

TEST(GgufCli, QuantizeRejectsUnknownType) {
  const CommandResult r = run_arbor("quantize " + stories() + " " + temp_path("cli_bad") + " q3_0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output().find("unknown or unsupported quantisation type 'q3_0'; accepted: f32, f16"),
            std::string::npos)
      << r.output();
}

}  // namespace
}  // namespace arbor::gguf
