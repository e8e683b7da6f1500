#include "loadgen/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace arbor::loadgen {

using nlohmann::json;

std::string rate_string(double rate) {
  if (std::isinf(rate)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", rate);
  return buf;
}

RunReport make_run_report(double request_rate, int32_t max_concurrency,
                          const std::vector<double>& arrivals_s, const LoadResult& load,
                          const SloSpec& slos) {
  RunReport r;
  if (arrivals_s.size() >= 2 && arrivals_s.back() > arrivals_s.front()) {
    r.scheduled_rate =
        static_cast<double>(arrivals_s.size() - 1) / (arrivals_s.back() - arrivals_s.front());
  }
  r.request_rate = request_rate;
  r.max_concurrency = max_concurrency;
  r.num_requests = static_cast<int64_t>(load.records.size());
  r.metrics = compute_metrics(load.records, load.duration_s, slos);
  if (load.send_s.size() >= 2) {
    const double span = load.send_s.back() - load.send_s.front();
    if (span > 0) r.achieved_send_rate = static_cast<double>(load.send_s.size() - 1) / span;
  }
  r.issue_lag = summarize(load.issue_lag_s);
  r.max_in_flight = load.max_in_flight;
  r.connections_opened = load.connections_opened;
  r.deadline_hit = load.deadline_hit;
  for (const RequestRecord& rec : load.records) {
    if (rec.outcome != Outcome::kFailed || r.first_errors.size() >= kMaxErrors) continue;
    if (std::find(r.first_errors.begin(), r.first_errors.end(), rec.error) ==
        r.first_errors.end()) {
      r.first_errors.push_back(rec.error);
    }
  }
  return r;
}

namespace {

void put_distribution(json& j, const std::string& name, const Distribution& d) {
  j["mean_" + name + "_ms"] = d.mean * 1000;
  j["median_" + name + "_ms"] = d.median * 1000;
  j["std_" + name + "_ms"] = d.std * 1000;
  j["p90_" + name + "_ms"] = d.p90 * 1000;
  j["p99_" + name + "_ms"] = d.p99 * 1000;
  j["max_" + name + "_ms"] = d.max * 1000;
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), s * 1000 < 10 ? "%.2f" : "%.1f", s * 1000);
  return buf;
}

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

json run_json(const RunReport& r) {
  const ServingMetrics& m = r.metrics;
  json j;
  if (std::isinf(r.request_rate)) {
    j["request_rate"] = "inf";
  } else {
    j["request_rate"] = r.request_rate;
  }
  j["max_concurrency"] = r.max_concurrency > 0 ? json(r.max_concurrency) : json(nullptr);
  j["num_prompts"] = r.num_requests;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["aborted"] = m.aborted;
  j["not_sent"] = m.not_sent;
  j["deadline_hit"] = r.deadline_hit;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["good_completed"] = m.good_completed;
  j["request_goodput"] = m.request_goodput;
  put_distribution(j, "ttft", m.ttft);
  put_distribution(j, "tpot", m.tpot);
  put_distribution(j, "itl", m.itl);
  put_distribution(j, "e2el", m.e2el);
  j["scheduled_rate"] = r.scheduled_rate;
  j["achieved_send_rate"] = r.achieved_send_rate;
  put_distribution(j, "issue_lag", r.issue_lag);
  j["max_in_flight"] = r.max_in_flight;
  j["connections_opened"] = r.connections_opened;
  j["errors"] = r.first_errors;
  return j;
}

std::string markdown_table(const std::vector<RunReport>& runs, const SloSpec& slos) {
  std::string out =
      "| rate req/s | sent req/s | ok | failed / aborted | seconds | req/s | out tok/s | TTFT p50 "
      "/ p99 ms | "
      "TPOT p50 / p99 ms | ITL p50 / p99 ms | E2E p50 / p99 ms |";
  std::string rule = "|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|";
  if (!slos.empty()) {
    out += " goodput req/s |";
    rule += "---:|";
  }
  out += "\n" + rule + "\n";
  for (const RunReport& r : runs) {
    const ServingMetrics& m = r.metrics;
    const std::string cap =
        r.max_concurrency > 0 ? str_cat(" (max ", r.max_concurrency, ")") : std::string();
    out += str_cat("| ", rate_string(r.request_rate), cap, " | ", fixed(r.achieved_send_rate, 1),
                   " | ", m.completed, " | ", m.failed, " / ", m.aborted, " | ",
                   fixed(m.duration_s, 2), " | ", fixed(m.request_throughput, 2), " | ",
                   fixed(m.output_throughput, 1), " | ", ms(m.ttft.median), " / ", ms(m.ttft.p99),
                   " | ", ms(m.tpot.median), " / ", ms(m.tpot.p99), " | ", ms(m.itl.median), " / ",
                   ms(m.itl.p99), " | ", ms(m.e2el.median), " / ", ms(m.e2el.p99), " |");
    if (!slos.empty()) out += str_cat(" ", fixed(m.request_goodput, 2), " |");
    out += "\n";
  }
  return out;
}

std::string gnuplot_script(const std::vector<RunReport>& runs, const std::string& prefix) {
  double max_finite = 0;
  for (const RunReport& r : runs) {
    if (!std::isinf(r.request_rate)) max_finite = std::max(max_finite, r.request_rate);
  }
  const double inf_x = max_finite > 0 ? max_finite * 2 : 1;
  std::vector<std::pair<double, const RunReport*>> points;
  for (const RunReport& r : runs) {
    points.emplace_back(std::isinf(r.request_rate) ? inf_x : r.request_rate, &r);
  }
  std::sort(points.begin(), points.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string s = "$data << EOD\n# rate ttft_p50 ttft_p99 tpot_p50 tpot_p99 itl_p50 itl_p99 (ms)\n";
  std::string tics;
  for (const auto& [x, r] : points) {
    const ServingMetrics& m = r->metrics;
    char line[256];
    std::snprintf(line, sizeof(line), "%g %g %g %g %g %g %g\n", x, m.ttft.median * 1000,
                  m.ttft.p99 * 1000, m.tpot.median * 1000, m.tpot.p99 * 1000, m.itl.median * 1000,
                  m.itl.p99 * 1000);
    s += line;
    if (!tics.empty()) tics += ", ";
    tics += str_cat("\"", rate_string(r->request_rate), "\" ", rate_string(x));
  }
  s += "EOD\n";
  std::string body = "set logscale x 2\nset xtics (" + tics +
                     ")\nset xlabel 'request rate (req/s)'\n"
                     "set ylabel 'ms'\nset grid\nset key top left\nset yrange [0:*]\n"
                     "set offsets graph 0.05, graph 0.05, 0, 0\n"
                     "set multiplot layout 1,3\n";
  const char* names[] = {"TTFT", "TPOT", "ITL"};
  for (int k = 0; k < 3; ++k) {
    const int c = 2 + 2 * k;
    body += str_cat("set title '", names[k], "'\nplot $data using 1:", c,
                    " with linespoints pt 7 title 'p50', $data using 1:", c + 1,
                    " with linespoints pt 5 title 'p99'\n");
  }
  body += "unset multiplot\n";
  s += "set terminal svg size 1200,400 dynamic enhanced font 'sans,11'\nset output '" + prefix +
       ".svg'\n" + body;
  s += "set terminal png size 1200,400\nset output '" + prefix + ".png'\n" + body;
  s += "set output\n";
  return s;
}

Status write_plots(const std::vector<RunReport>& runs, const std::string& prefix) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return failed_precondition("gnuplot is not installed (Debian: gnuplot-nox); no plots drawn");
  }
  const std::string gp = prefix + ".gp";
  {
    std::ofstream f(gp);
    if (!f) return io_error("cannot write '", gp, "'");
    f << gnuplot_script(runs, prefix);
  }
  const std::string cmd = "gnuplot '" + gp + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return io_error("cannot run gnuplot");
  std::string out;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return io_error("gnuplot '", gp, "' failed (status ", rc, "): ", out);
  return ok_status();
}

}  // namespace arbor::loadgen
