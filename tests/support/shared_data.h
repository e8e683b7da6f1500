// Where the tests find the shared models, tokenizers and goldens, and the check that fails a
// test when a file it needs is missing.
//
// A test that needs shared data FAILS, never skips, when the data is missing: a skip counts as a
// pass in CTest, so a renamed model file would turn golden, tokenizer and conversion tests
// silently green. This holds inside and outside CI (CI=true changes nothing): with no data there
// is no honest result to report.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace arbor::test {

// The shared data folder: $ARBOR_SHARED_DIR when set and non-empty, else the folder the build
// was configured with (CMake cache variable ARBOR_SHARED_DIR, default ../shared beside the
// checkout). Read at every call, so a test process sees its own environment.
std::string shared_dir();

// shared_dir() + "/" + rel (rel like "models/stories260K/stories260K.gguf"). Does not check that
// the file exists: pair it with require_shared_file().
std::string shared_path(std::string_view rel);

// Success when shared_path(rel) exists (a file or a folder); otherwise a failure whose message
// names the full missing path and how to point ARBOR_SHARED_DIR at the data. Use it as
//   ASSERT_TRUE(test::require_shared_file("models/stories260K/stories260K.gguf"));
::testing::AssertionResult require_shared_file(std::string_view rel);

// The same check for helpers that cannot return from the test: records the failure (non-fatal)
// and returns false when the file is missing, so the helper can bail out.
bool expect_shared_file(std::string_view rel);

// The stories260K model, used by most end-to-end tests.
inline constexpr char kStories260K[] = "models/stories260K/stories260K.gguf";

}  // namespace arbor::test
