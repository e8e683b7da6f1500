#include "server/api_errors.h"

#include <nlohmann/json.hpp>

namespace arbor::server {

ApiError invalid_param(std::string_view param, std::string message) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::string(param);
  return e;
}

ApiError malformed_body(std::string message) {
  ApiError e;
  e.message = std::move(message);
  e.code = "malformed_json";
  return e;
}

ApiError route_not_found(std::string_view method, std::string_view target) {
  ApiError e;
  e.http_status = 404;
  e.message = str_cat("no route for ", method, " ", target);
  e.type = "not_found_error";
  e.code = "route_not_found";
  return e;
}

ApiError method_not_allowed(std::string_view method, std::string_view target) {
  ApiError e;
  e.http_status = 405;
  e.message = str_cat("method ", method, " is not allowed on ", target);
  e.code = "method_not_allowed";
  return e;
}

ApiError model_not_found(std::string_view model) {
  ApiError e;
  e.http_status = 404;
  e.message = str_cat("the model '", model, "' does not exist");
  e.type = "not_found_error";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

ApiError body_too_large(size_t limit_bytes) {
  ApiError e;
  e.http_status = 413;
  e.message = str_cat("request body exceeds the limit of ", limit_bytes, " bytes");
  e.code = "body_too_large";
  return e;
}

ApiError server_unavailable(std::string message) {
  ApiError e;
  e.http_status = 503;
  e.message = std::move(message);
  e.type = "service_unavailable";
  e.code = "service_unavailable";
  return e;
}

ApiError task_not_served(std::string message) {
  ApiError e;
  e.http_status = 404;
  e.message = std::move(message);
  e.type = "not_found_error";
  e.code = "task_not_served";
  return e;
}

namespace {

int http_status_of(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
    case StatusCode::kInternal:
    case StatusCode::kDataLoss:
    case StatusCode::kIoError:
      return 500;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kNotFound:
      return 400;
    case StatusCode::kUnimplemented:
      return 501;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kFailedPrecondition:
      return 503;
  }
  return 500;
}

}  // namespace

ApiError error_from_status(const Status& status, std::string_view param) {
  ApiError e;
  e.http_status = http_status_of(status.code());
  e.message = status.message();
  e.param = std::string(param);
  switch (e.http_status) {
    case 429:
      e.type = "rate_limit_error";
      e.code = "queue_full";
      break;
    case 503:
      e.type = "service_unavailable";
      break;
    case 500:
    case 501:
      e.type = "server_error";
      break;
    default:
      break;
  }
  return e;
}

int error_http_status(const ApiError& error, ApiFlavor flavor) {
  if (flavor == ApiFlavor::kTgi && error.http_status == 400) return 422;
  return error.http_status;
}

namespace {

std::string_view anthropic_type(int http_status) {
  switch (http_status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
  }
}

}  // namespace

nlohmann::json error_json(const ApiError& error, ApiFlavor flavor) {
  nlohmann::json j;
  switch (flavor) {
    case ApiFlavor::kTgi:
      j["error"] = error.message;
      j["error_type"] = error.http_status == 400 ? "validation" : error.type;
      return j;
    case ApiFlavor::kAnthropic:
      j["type"] = "error";
      j["error"] = {{"type", anthropic_type(error.http_status)}, {"message", error.message}};
      return j;
    case ApiFlavor::kOpenAi: break;
  }
  nlohmann::json body;
  body["message"] = error.message;
  body["type"] = error.type;
  body["param"] = error.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param);
  body["code"] = error.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.code);
  j["error"] = std::move(body);
  return j;
}

std::string error_body(const ApiError& error, ApiFlavor flavor) {
  return error_json(error, flavor).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace arbor::server
