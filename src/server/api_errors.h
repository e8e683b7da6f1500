// The one place that maps failures to HTTP: a Status (engine, tokenizer) or a request-validation
// error becomes an HTTP status code and a JSON body, in OpenAI's shape
//
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
//              "code": null}}
//
// or, on TGI routes, in TGI's shape ({"error": "...", "error_type": "validation"}), or, on
// Anthropic's routes (/v1/messages), in Anthropic's:
//
//   {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
//
// with Anthropic's error type for the status (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
// rate_limit_error, 503 overloaded_error, others api_error).
//
// Status codes: 400 malformed JSON, wrong types and out-of-range values (OpenAI and vLLM use 400
// for every validation error; TGI routes use 422 as TGI does), 404 unknown route or model, 405
// wrong method, 413 body too large, 429 waiting queue full, 503 loading or draining, 500 bugs.
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace arbor::server {

enum class ApiFlavor { kOpenAi, kTgi, kAnthropic };

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // OpenAI "type"
  std::string param;                           // the offending field; "" = null
  std::string code;                            // OpenAI "code"; "" = null
};

// A field of the request body is missing, has the wrong type or is out of range.
ApiError invalid_param(std::string_view param, std::string message);
// The body is not JSON (or not a JSON object).
ApiError malformed_body(std::string message);
ApiError route_not_found(std::string_view method, std::string_view target);
ApiError method_not_allowed(std::string_view method, std::string_view target);
ApiError model_not_found(std::string_view model);
ApiError body_too_large(size_t limit_bytes);
ApiError server_unavailable(std::string message);
// A route of a task this server does not run (`arbor serve --task`): 404, code task_not_served
// (as vLLM answers a route its model cannot serve).
ApiError task_not_served(std::string message);
// An engine or tokenizer Status: kInvalidArgument/kOutOfRange/kNotFound -> 400,
// kResourceExhausted -> 429, kFailedPrecondition -> 503, kUnimplemented -> 501, others -> 500.
ApiError error_from_status(const Status& status, std::string_view param = "");

// The JSON body of `error` in the flavor's shape.
std::string error_body(const ApiError& error, ApiFlavor flavor);
// The same as a JSON value (an error event in a stream).
nlohmann::json error_json(const ApiError& error, ApiFlavor flavor);
// The HTTP status of `error` on a route of `flavor` (TGI answers validation errors with 422).
int error_http_status(const ApiError& error, ApiFlavor flavor);

}  // namespace arbor::server
