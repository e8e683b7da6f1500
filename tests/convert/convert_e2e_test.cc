// Runs the real `arbor convert` binary.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "test_util.h"

namespace arbor::convert {
namespace {

using test::run_arbor;

const std::string kStories = test::shared_path("models/stories260K") + "/";

TEST(ConvertE2eTest, Llama2cWritesTheReferenceTensors) {
  ASSERT_TRUE(test::require_shared_file("models/stories260K/stories260K.gguf"));
  ASSERT_TRUE(test::require_shared_file("models/stories260K/stories260K.bin"));
  ASSERT_TRUE(test::require_shared_file("models/stories260K/tok512.bin"));
  const std::string out = testing::temp_path("e2e_stories260K.gguf");
  std::filesystem::remove(out);
  const auto r = run_arbor("convert llama2c " + kStories + "stories260K.bin " + kStories +
                           "tok512.bin -o " + out + " --type f32");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  EXPECT_NE(
      r.output().find(
          "llama2.c legacy checkpoint, shared classifier: arch llama, dim 64, ffn 172, 5 layers"),
      std::string::npos)
      << r.output();
  auto ours = gguf::GgufFile::open(out);
  auto ref = gguf::GgufFile::open(kStories + "stories260K.gguf");
  ASSERT_TRUE(ours.ok()) << ours.status().to_string();
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(ours->tensors().size(), 48u);
  for (size_t i = 0; i < ref->tensors().size(); ++i) {
    const auto& a = ours->tensors()[i];
    const auto& b = ref->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    ASSERT_EQ(a.size_bytes, b.size_bytes) << b.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.size_bytes), 0) << b.name;
  }
}

TEST(ConvertE2eTest, HfQ80) {
  ASSERT_TRUE(test::require_shared_file("models/tinystories-656K/model.safetensors"));
  const std::string dir = test::shared_path("models/tinystories-656K");
  const std::string out = testing::temp_path("e2e_tinystories_q8.gguf");
  const auto r = run_arbor("convert hf " + dir + " -o " + out + " --type q8_0");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  auto f = gguf::GgufFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, gguf::GgmlType::kQ8_0);
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, gguf::GgmlType::kF32);
}

TEST(ConvertE2eTest, Errors) {
  const std::string out = testing::temp_path("e2e_bad.gguf");
  const std::string bad = testing::temp_path("e2e_bad_model.bin");
  testing::write_text(bad, std::string(20, 'x'));
  auto r = run_arbor("convert llama2c " + bad + " " + bad + " -o " + out);
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_NE(r.output().find("error: " + bad + ": file has 20 bytes, too small for a llama2.c header"),
            std::string::npos)
      << r.output();
  EXPECT_FALSE(std::filesystem::exists(out));

  ASSERT_TRUE(test::require_shared_file("models/stories260K/stories260K.bin"));
  r = run_arbor("convert llama2c " + kStories + "stories260K.bin " + kStories + "tok512.bin -o " +
                out + " --type q9_9");
  EXPECT_EQ(r.exit_code, 2) << r.output();
  EXPECT_NE(r.output().find("--type 'q9_9'"), std::string::npos) << r.output();
  r = run_arbor("convert hf /nonexistent-dir -o " + out);
  EXPECT_NE(r.exit_code, 0);
}

TEST(ConvertE2eTest, HelpShowsDefaults) {
  const auto r = run_arbor("convert llama2c --help");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_NE(r.output().find("--type"), std::string::npos) << r.output();
  EXPECT_NE(r.output().find("--type TEXT=f32"), std::string::npos) << r.output();
}

}  // namespace
}  // namespace arbor::convert
