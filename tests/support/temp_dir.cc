#include "support/temp_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>
#include <mutex>
#include <fstream>
#include <iterator>

namespace arbor::test {

TempDir::TempDir(std::string_view tag) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") +
                      "/arbor_" + std::string(tag) + "_XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    std::perror(("mkdtemp " + templ).c_str());
    std::abort();
  }
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::operator/(std::string_view name) const {
  return path_ + "/" + std::string(name);
}

namespace {

// The paths temp_path() handed out; removed when the test process exits normally.
struct TempPaths {
  std::mutex mu;
  std::vector<std::string> paths;
  ~TempPaths() {
    std::error_code ec;
    for (const std::string& p : paths) std::filesystem::remove_all(p, ec);
  }
};

TempPaths& temp_paths() {
  static TempPaths t;
  return t;
}

}  // namespace

std::string temp_path(std::string_view name) {
  std::string path = (std::filesystem::path(::testing::TempDir()) /
                      ("arbor_" + std::to_string(getpid()) + "_" + std::string(name)))
                         .string();
  TempPaths& t = temp_paths();
  std::lock_guard<std::mutex> lock(t.mu);
  t.paths.push_back(path);
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace arbor::test
