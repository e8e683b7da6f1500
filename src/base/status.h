// Status and Result<T>: how arbor reports failures that input or the environment can cause.
//
// A broken invariant is a CHECK (check.h), never a Status. Nothing throws across a module
// boundary; third-party exceptions are caught at the edge and turned into a Status.
// Messages carry the numbers: "prompt has 9000 tokens, max_model_len is 8192".
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "base/check.h"

namespace arbor {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad flag, bad request field)
  kNotFound,            // a file, tensor, key or request id does not exist
  kOutOfRange,          // a value exceeds a limit (context length, vocabulary size)
  kDataLoss,            // a file is corrupt or truncated
  kUnimplemented,       // valid, but arbor does not support it (yet)
  kResourceExhausted,   // a queue or pool is full
  kFailedPrecondition,  // the system is not in a state to do it (loading, draining)
  kIoError,             // the operating system refused (open, read, write, mmap)
  kInternal,            // a bug surfaced as a value (prefer CHECK)
};

std::string_view status_code_name(StatusCode code);

// Concatenates anything with operator<< into a string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: message"
  std::string to_string() const;
  // Returns a copy with "context: " prefixed to the message.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
template <typename... Args>
Status invalid_argument(const Args&... a) { return Status(StatusCode::kInvalidArgument, str_cat(a...)); }
template <typename... Args>
Status not_found(const Args&... a) { return Status(StatusCode::kNotFound, str_cat(a...)); }
template <typename... Args>
Status out_of_range(const Args&... a) { return Status(StatusCode::kOutOfRange, str_cat(a...)); }
template <typename... Args>
Status data_loss(const Args&... a) { return Status(StatusCode::kDataLoss, str_cat(a...)); }
template <typename... Args>
Status unimplemented(const Args&... a) { return Status(StatusCode::kUnimplemented, str_cat(a...)); }
template <typename... Args>
Status resource_exhausted(const Args&... a) { return Status(StatusCode::kResourceExhausted, str_cat(a...)); }
template <typename... Args>
Status failed_precondition(const Args&... a) { return Status(StatusCode::kFailedPrecondition, str_cat(a...)); }
template <typename... Args>
Status io_error(const Args&... a) { return Status(StatusCode::kIoError, str_cat(a...)); }
template <typename... Args>
Status internal_error(const Args&... a) { return Status(StatusCode::kInternal, str_cat(a...)); }

// Either a T or a non-ok Status. Accessing value() of an error is a CHECK failure.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    ARBOR_CHECK(!std::get<Status>(v_).ok()) << "Result constructed from an ok Status";
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    ARBOR_CHECK(ok()) << status().to_string();
    return std::get<T>(v_);
  }
  const T& value() const& {
    ARBOR_CHECK(ok()) << status().to_string();
    return std::get<T>(v_);
  }
  T&& value() && {
    ARBOR_CHECK(ok()) << status().to_string();
    return std::get<T>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal {
inline const Status& status_of(const Status& s) { return s; }
inline Status status_of(Status&& s) { return std::move(s); }
template <typename T>
const Status& status_of(const Result<T>& r) { return r.status(); }
}  // namespace internal

}  // namespace arbor

#define ARBOR_CONCAT_INNER_(a, b) a##b
#define ARBOR_CONCAT_(a, b) ARBOR_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status or Result) is an error.
// The status is copied (moved, for a Status prvalue) out of `expr` within the statement that
// evaluates it: `expr` may refer into a temporary that dies at the end of that statement, e.g.
// make_result().status() (binding a reference to it instead would leave the reference dangling).
// On success the copy is of an empty Status: no allocation.
#define ARBOR_RETURN_IF_ERROR(expr)                                          \
  do {                                                                       \
    ::arbor::Status arbor_status_ = ::arbor::internal::status_of((expr));    \
    if (!arbor_status_.ok()) return arbor_status_;                           \
  } while (0)

// ARBOR_ASSIGN_OR_RETURN(auto x, make_x()); returns the error, else moves the value into x.
#define ARBOR_ASSIGN_OR_RETURN(lhs, expr) \
  ARBOR_ASSIGN_OR_RETURN_IMPL_(ARBOR_CONCAT_(arbor_result_, __LINE__), lhs, expr)
#define ARBOR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
