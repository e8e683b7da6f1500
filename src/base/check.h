// CHECK macros: a broken invariant aborts with file, line, the condition and a message.
//
//   ARBOR_CHECK(block_id != 0) << "null block handed out";
//   ARBOR_CHECK_EQ(ref_count, table_entries);
//   ARBOR_DCHECK(...)  — only in debug and sanitizer builds.
#pragma once

#include <sstream>

namespace arbor::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};

// Lets `ARBOR_CHECK(x) << ...` be an expression of type void.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace arbor::internal

#define ARBOR_CHECK(cond)                                    \
  (cond) ? (void)0                                           \
         : ::arbor::internal::Voidify() &                    \
               ::arbor::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define ARBOR_CHECK_OP_(a, b, op)                                                        \
  ((a)op(b)) ? (void)0                                                                   \
             : ::arbor::internal::Voidify() &                                            \
                   ::arbor::internal::CheckFailure(__FILE__, __LINE__, #a " " #op " " #b) \
                           .stream()                                                     \
                       << "(" << (a) << " vs " << (b) << ") "

#define ARBOR_CHECK_EQ(a, b) ARBOR_CHECK_OP_(a, b, ==)
#define ARBOR_CHECK_NE(a, b) ARBOR_CHECK_OP_(a, b, !=)
#define ARBOR_CHECK_LT(a, b) ARBOR_CHECK_OP_(a, b, <)
#define ARBOR_CHECK_LE(a, b) ARBOR_CHECK_OP_(a, b, <=)
#define ARBOR_CHECK_GT(a, b) ARBOR_CHECK_OP_(a, b, >)
#define ARBOR_CHECK_GE(a, b) ARBOR_CHECK_OP_(a, b, >=)

#if defined(NDEBUG) && !defined(ARBOR_SANITIZE_BUILD)
#define ARBOR_DCHECK(cond) \
  while (false) ARBOR_CHECK(cond)
#else
#define ARBOR_DCHECK(cond) ARBOR_CHECK(cond)
#endif
