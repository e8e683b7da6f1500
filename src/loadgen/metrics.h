// Serving metrics with vLLM's definitions (benchmarks/benchmark_serving.py). Pure functions.
//
// Per request, all times from the moment the request is sent (connect included):
//   TTFT  until the first chunk that carries output (see openai_chunk.h for "carries output")
//   ITL   every gap between successive output chunks (pooled over all requests)
//   E2E   until the last byte of the response (vLLM stops at the last output chunk; the
//         difference is the usage chunk and "[DONE]", which arrive with or right after it)
//   TPOT  (E2E - TTFT) / (output_tokens - 1), for requests with more than one output token
// Over a run of `duration` seconds (first send until the last response ended, or the deadline):
//   request throughput       completed / duration
//   output token throughput  sum of output tokens of completed requests / duration
//   total token throughput   (prompt + output tokens of completed requests) / duration
//   goodput                  completed requests meeting every given SLO / duration; a request
//                            with one output token has TPOT 0 for this purpose (as in vLLM)
// Distributions report mean, population standard deviation, median and percentiles with
// numpy's default (linear interpolation between closest ranks). An empty set gives zeros.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace arbor::loadgen {

enum class Outcome : uint8_t {
  kOk,       // a 200 response with at least one output chunk and no error chunk
  kFailed,   // connection error, HTTP error status, error chunk, malformed or empty stream
  kAborted,  // still running at the --max-seconds deadline; closed by the client
  kNotSent,  // not sent before the deadline
};

struct RequestRecord {
  Outcome outcome = Outcome::kNotSent;
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> itl_s;  // [output chunks - 1]
  int64_t prompt_tokens = 0;  // usage.prompt_tokens, else the planned length, else 0
  int64_t output_tokens = 0;  // usage.completion_tokens, else the number of output chunks
  std::string error;          // kFailed / kAborted: what happened
};

// TPOT of one request in seconds; 0 when it has fewer than two output tokens.
double tpot_s(const RequestRecord& r);

// numpy.percentile(values, p) with linear interpolation; p in [0, 100]; 0 for no values.
double percentile(std::vector<double> values, double p);

struct Distribution {  // seconds
  int64_t count = 0;
  double mean = 0;
  double std = 0;  // population (numpy.std)
  double median = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};
Distribution summarize(const std::vector<double>& values);

// Service-level objectives for goodput, in milliseconds; a request is good when each given
// metric is <= its objective.
struct SloSpec {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};
// Parses vLLM's --goodput form: "ttft:500", "tpot:50", "e2el:2000" (any subset, each once,
// value > 0). Errors name the bad item.
Result<SloSpec> parse_slos(const std::vector<std::string>& items);
bool meets_slos(const RequestRecord& r, const SloSpec& slos);

struct ServingMetrics {
  double duration_s = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t aborted = 0;
  int64_t not_sent = 0;
  int64_t total_input_tokens = 0;   // completed requests
  int64_t total_output_tokens = 0;  // completed requests
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  int64_t good_completed = 0;          // meeting the SLOs (0 when none given)
  double request_goodput = 0;          // good_completed / duration (0 when no SLOs)
  Distribution ttft, tpot, itl, e2el;  // completed requests; TPOT only those with > 1 token
};

// `duration_s` must be > 0 unless there are no records.
ServingMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                               const SloSpec& slos);

}  // namespace arbor::loadgen
