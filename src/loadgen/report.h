// Reports of `arbor bench serve`: one RunReport per request rate, written as JSON (vLLM's
// field names, milliseconds), a Markdown table, and latency-versus-rate plots through gnuplot.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "loadgen/client.h"
#include "loadgen/metrics.h"

namespace arbor::loadgen {

struct RunReport {
  double request_rate = 0;      // requested; infinity = all at once
  int32_t max_concurrency = 0;  // 0 = no cap
  int64_t num_requests = 0;
  ServingMetrics metrics;
  // (n - 1) / (last - first arrival) of the drawn schedule: a Poisson sample's own rate, which
  // differs from the requested one by chance (~1/sqrt(n)); 0 with rate inf.
  double scheduled_rate = 0;
  // The same over the actual send times: the rate the client really offered. Equal to
  // scheduled_rate when the client keeps up; with rate inf, how fast it can open requests.
  double achieved_send_rate = 0;
  Distribution issue_lag;  // how late requests were issued relative to their schedule
  int32_t max_in_flight = 0;
  int64_t connections_opened = 0;
  bool deadline_hit = false;
  std::vector<std::string> first_errors;  // up to kMaxErrors distinct messages, in order
};

constexpr size_t kMaxErrors = 5;

// `arrivals_s`: the schedule the run was given ([requests]).
RunReport make_run_report(double request_rate, int32_t max_concurrency,
                          const std::vector<double>& arrivals_s, const LoadResult& load,
                          const SloSpec& slos);

// "inf" or the number as written ("4", "0.5").
std::string rate_string(double rate);

// {"request_rate", "completed", "failed", ..., "mean_ttft_ms", "p99_itl_ms", ...}.
nlohmann::json run_json(const RunReport& r);

// One row per run: rate, completed/failed, req/s, output tok/s, TTFT/TPOT/ITL/E2E p50 and p99 in
// ms, and goodput when SLOs were given.
std::string markdown_table(const std::vector<RunReport>& runs, const SloSpec& slos);

// A gnuplot script drawing TTFT, TPOT and ITL (p50 and p99, ms) against the request rate (log
// scale; an "inf" run is drawn one octave right of the highest finite rate) into
// PREFIX.svg and PREFIX.png.
std::string gnuplot_script(const std::vector<RunReport>& runs, const std::string& prefix);

// Writes PREFIX.gp and runs gnuplot on it. kFailedPrecondition when gnuplot is not installed
// (the caller warns and goes on), kIoError when it fails.
Status write_plots(const std::vector<RunReport>& runs, const std::string& prefix);

}  // namespace arbor::loadgen
