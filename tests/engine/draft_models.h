// Test models for speculative decoding: stories260K's first layers as draft models.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "base/status.h"
#include "convert/llama2c.h"
#include "convert/model_plan.h"
#include "support/shared_data.h"

namespace arbor::engine::testing {

// A shared data file's path; fails the current test, naming it, when it is missing.
inline std::string shared(const std::string& rel) {
  EXPECT_TRUE(::arbor::test::require_shared_file(rel));
  return ::arbor::test::shared_path(rel);
}

// Removes the files in it when the test program exits.
struct TempFiles {
  std::map<int, std::string> paths;
  ~TempFiles() {
    for (const auto& [k, p] : paths) std::filesystem::remove(p);
  }
};

// The stories260K cut to its first `layers` layers, converted once per test run.
inline const std::string& draft_gguf(int layers) {
  static TempFiles files;
  std::map<int, std::string>& paths = files.paths;
  auto it = paths.find(layers);
  if (it != paths.end()) return it->second;
  const std::string src =
      shared(str_cat("models/stories260K/stories260K-first", layers, "layers.bin"));
  const std::string tok = shared("models/stories260K/tok512.bin");
  const std::string out =
      (std::filesystem::temp_directory_path() / str_cat("arbor_spec_draft", layers, "_", getpid(), ".gguf"))
          .string();
  auto model = convert::load_llama2c(src, tok);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (model.ok()) {
    const Status st = convert::write_plan(model->plan, convert::OutputType{}, out);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  return paths.emplace(layers, out).first->second;
}

}  // namespace arbor::engine::testing
