#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace arbor::loadgen {

double tpot_s(const RequestRecord& r) {
  if (r.output_tokens <= 1) return 0;
  return (r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1);
}

double percentile(std::vector<double> values, double p) {
  ARBOR_CHECK(p >= 0 && p <= 100) << "percentile " << p;
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

Distribution summarize(const std::vector<double>& values) {
  Distribution d;
  if (values.empty()) return d;
  d.count = static_cast<int64_t>(values.size());
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  double sq = 0;
  for (double v : values) sq += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(sq / static_cast<double>(values.size()));
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  d.median = percentile(sorted, 50);
  d.p90 = percentile(sorted, 90);
  d.p99 = percentile(sorted, 99);
  d.max = sorted.back();
  return d;
}

Result<SloSpec> parse_slos(const std::vector<std::string>& items) {
  SloSpec s;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      return invalid_argument("--goodput item '", item, "' must be NAME:MILLISECONDS");
    }
    const std::string name = item.substr(0, colon);
    const std::string num = item.substr(colon + 1);
    char* end = nullptr;
    const double ms = std::strtod(num.c_str(), &end);
    if (num.empty() || *end != '\0' || !(ms > 0) || !std::isfinite(ms)) {
      return invalid_argument("--goodput item '", item, "': '", num,
                              "' is not a positive number of milliseconds");
    }
    std::optional<double>* slot = name == "ttft"   ? &s.ttft_ms
                                  : name == "tpot" ? &s.tpot_ms
                                  : name == "e2el" ? &s.e2el_ms
                                                   : nullptr;
    if (slot == nullptr) {
      return invalid_argument("--goodput item '", item, "': unknown metric '", name,
                              "' (ttft, tpot, e2el)");
    }
    if (slot->has_value()) return invalid_argument("--goodput gives '", name, "' twice");
    *slot = ms;
  }
  return s;
}

bool meets_slos(const RequestRecord& r, const SloSpec& slos) {
  if (r.outcome != Outcome::kOk) return false;
  if (slos.ttft_ms && r.ttft_s * 1000.0 > *slos.ttft_ms) return false;
  if (slos.tpot_ms && tpot_s(r) * 1000.0 > *slos.tpot_ms) return false;
  if (slos.e2el_ms && r.e2e_s * 1000.0 > *slos.e2el_ms) return false;
  return true;
}

ServingMetrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                               const SloSpec& slos) {
  ServingMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    switch (r.outcome) {
      case Outcome::kOk:
        break;
      case Outcome::kFailed:
        ++m.failed;
        continue;
      case Outcome::kAborted:
        ++m.aborted;
        continue;
      case Outcome::kNotSent:
        ++m.not_sent;
        continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s);
    e2el.push_back(r.e2e_s);
    if (r.output_tokens > 1) tpot.push_back(tpot_s(r));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    if (!slos.empty() && meets_slos(r, slos)) ++m.good_completed;
  }
  if (!records.empty()) ARBOR_CHECK(duration_s > 0) << "duration " << duration_s;
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
    m.total_token_throughput =
        static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
    m.request_goodput = static_cast<double>(m.good_completed) / duration_s;
  }
  m.ttft = summarize(ttft);
  m.tpot = summarize(tpot);
  m.itl = summarize(itl);
  m.e2el = summarize(e2el);
  return m;
}

}  // namespace arbor::loadgen
