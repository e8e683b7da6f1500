// Temporary files and folders for tests, and reading a file back.
#pragma once

#include <string>
#include <string_view>

namespace arbor::test {

// A fresh folder $TMPDIR/arbor_<tag>_XXXXXX (TMPDIR defaults to /tmp), removed with everything
// in it on destruction. CHECK-fails when the folder cannot be made.
class TempDir {
 public:
  explicit TempDir(std::string_view tag = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string operator/(std::string_view name) const;

 private:
  std::string path_;
};

// A path for a scratch file in GoogleTest's temp folder, unique to this process (the pid is in
// the name, so tests that CTest runs in parallel do not collide); removed (file or directory) when
// the test process exits normally. `name` keeps its extension at the end.
std::string temp_path(std::string_view name);

// The whole file as bytes; empty when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace arbor::test
