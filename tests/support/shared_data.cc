#include "support/shared_data.h"

#include <cstdlib>
#include <filesystem>

namespace arbor::test {

std::string shared_dir() {
  const char* env = std::getenv("ARBOR_SHARED_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return ARBOR_DEFAULT_SHARED_DIR;
}

std::string shared_path(std::string_view rel) {
  return (std::filesystem::path(shared_dir()) / rel).string();
}

::testing::AssertionResult require_shared_file(std::string_view rel) {
  const std::string path = shared_path(rel);
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return ::testing::AssertionSuccess();
  const char* env = std::getenv("ARBOR_SHARED_DIR");
  return ::testing::AssertionFailure()
         << "shared test data missing: " << path << "\n  the shared folder is " << shared_dir()
         << (env != nullptr && env[0] != '\0' ? " (from $ARBOR_SHARED_DIR)"
                                              : " (the build's default; $ARBOR_SHARED_DIR is unset)")
         << "\n  point ARBOR_SHARED_DIR at the folder that holds models/, tokenizers/ and goldens/"
         << " (e.g. ARBOR_SHARED_DIR=/path/to/shared ctest ...), or configure with"
         << " cmake -DARBOR_SHARED_DIR=/path/to/shared";
}

bool expect_shared_file(std::string_view rel) {
  const ::testing::AssertionResult present = require_shared_file(rel);
  if (!present) ADD_FAILURE() << present.message();
  return static_cast<bool>(present);
}

}  // namespace arbor::test
