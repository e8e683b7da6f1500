// The load generator's HTTP side: drives one run of streaming requests against a server on
// this machine, on one thread, and times every streamed chunk.
//
// Design. One Boost.Asio io_context on the calling thread runs everything: a timer issues each
// request at its arrival offset (late arrivals are issued at once, so the offered load keeps
// its Poisson shape; how late is recorded as `issue_lag`), an optional concurrency cap queues
// requests for a free slot, and each request is connect (or a pooled keep-alive connection) ->
// one write of the prebuilt HTTP/1.1 request -> reads. Every read is timestamped with
// steady_clock the moment it completes, then fed through Beast's response parser (chunked
// decoding) into an SseParser and classify_chunk(); all chunks of one read share its timestamp.
// A second deadline timer (--max-seconds) stops issuing and closes every in-flight request.
// Request bodies and HTTP text are built before the run starts, so the timed path does no JSON
// serialisation and no JSON tree building. Beast and Asio appear only in client.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "loadgen/metrics.h"
#include "loadgen/url.h"

namespace arbor::loadgen {

// "POST /v1/completions HTTP/1.1" with Host, Content-Type, Accept, Content-Length and
// keep-alive headers, then the body.
std::string http_post_text(const ServerUrl& server, const std::string& path,
                           const std::string& body);

struct LoadOptions {
  ServerUrl server;
  bool chat = false;            // the stream is /v1/chat/completions (how chunks are read)
  int32_t max_concurrency = 0;  // requests in flight at most; 0 = no cap
  double max_seconds = 0;       // deadline from the start; 0 = none
  bool keep_alive = true;       // reuse connections between requests
  // Called on the run's thread after each request ends: (ended, total).
  std::function<void(int64_t, int64_t)> on_progress;
};

struct LoadResult {
  std::vector<RequestRecord> records;  // [requests], in plan order
  double duration_s = 0;               // first send until the last response ended / deadline
  std::vector<double> send_s;          // [sent requests] send offsets from the start, ascending
  std::vector<double> issue_lag_s;     // [issued requests] issue time - scheduled time
  int32_t max_in_flight = 0;
  int64_t connections_opened = 0;
  bool deadline_hit = false;
};

// Runs `requests[i]` (full HTTP request text, see http_post_text) at `arrivals_s[i]` seconds
// from the start ([requests], ascending). `prompt_lens[i]` (-1 = unknown) is the prompt-token
// count used when the server reports no usage. Blocks until every request ended or the
// deadline. Per-request failures are in the records; a Status only for bad arguments.
Result<LoadResult> run_load(const LoadOptions& options, const std::vector<std::string>& requests,
                            const std::vector<double>& arrivals_s,
                            const std::vector<int64_t>& prompt_lens);

struct HttpReply {
  int status = 0;
  std::string body;
};
// One plain request (GET /v1/models, a health check), waiting at most `timeout_s`.
Result<HttpReply> http_request(const ServerUrl& server, const std::string& method,
                               const std::string& path, const std::string& body, double timeout_s);

}  // namespace arbor::loadgen
