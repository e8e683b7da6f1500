#include "server/request_log.h"

#include <cstdio>
#include <random>

#include "base/log.h"

namespace arbor::server {

namespace {

constexpr size_t kMaxClientRequestId = 128;

// Visible ASCII only: the id goes into a header, a JSON string and one token of a log line.
bool usable_request_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxClientRequestId) return false;
  for (const char c : id) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

std::string new_request_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace

std::string request_id_for(const http::HttpRequest& request) {
  const std::string_view sent = request.header("X-Request-Id");
  if (usable_request_id(sent)) return std::string(sent);
  if (!sent.empty()) {
    ARBOR_LOG(kDebug) << "ignoring an X-Request-Id of " << sent.size()
                      << " bytes that are not 1-128 visible ASCII characters";
  }
  return new_request_id();
}

LoggedExchange::LoggedExchange(std::shared_ptr<http::HttpExchange> inner, std::string method,
                               std::string path, std::string request_id)
    : inner_(std::move(inner)), method_(std::move(method)), path_(std::move(path)),
      request_id_(std::move(request_id)), start_(std::chrono::steady_clock::now()) {
  inner_->add_header("X-Request-Id", request_id_);
}

LoggedExchange::~LoggedExchange() { log_line(); }

void LoggedExchange::respond(http::HttpResponse response) {
  inner_->respond(std::move(response));
  log_line();
}

void LoggedExchange::start_stream(int status, const std::string& content_type) {
  inner_->start_stream(status, content_type);
}

void LoggedExchange::write(std::string data) { inner_->write(std::move(data)); }

void LoggedExchange::finish_stream() {
  inner_->finish_stream();
  log_line();
}

void LoggedExchange::add_header(std::string name, std::string value) {
  inner_->add_header(std::move(name), std::move(value));
}

void LoggedExchange::set_on_disconnect(std::function<void()> fn) {
  inner_->set_on_disconnect(std::move(fn));
}

bool LoggedExchange::disconnected() const { return inner_->disconnected(); }

int LoggedExchange::sent_status() const { return inner_->sent_status(); }

void LoggedExchange::log_line() {
  if (logged_) return;
  logged_ = true;
  const int status = inner_->sent_status();
  const bool quiet = quiet_success_ && status > 0 && status < 400;
  if (!log_enabled(quiet ? LogLevel::kDebug : LogLevel::kInfo)) return;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  std::string line =
      str_cat(method_, " ", path_, " ", status > 0 ? std::to_string(status) : std::string("-"),
              " ", response_id_.empty() ? request_id_ : response_id_, " ", ms, "ms");
  if (!detail_.empty()) line += str_cat(" ", detail_);
  if (!error_.empty()) line += str_cat(": ", error_);
  if (inner_->disconnected()) line += " (client gone)";
  if (quiet) {
    ARBOR_LOG(kDebug) << line;
  } else {
    ARBOR_LOG(kInfo) << line;
  }
}

}  // namespace arbor::server
