#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace arbor::internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  os_ << "CHECK failed at " << file << ":" << line << ": " << condition << " ";
}

CheckFailure::~CheckFailure() {
  const std::string msg = os_.str();
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace arbor::internal
