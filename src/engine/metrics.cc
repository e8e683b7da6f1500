#include "engine/metrics.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "base/check.h"

namespace arbor::engine {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  ARBOR_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
}

Histogram Histogram::exponential(double first, double factor, int count) {
  std::vector<double> b;
  double v = first;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return Histogram(std::move(b));
}

void Histogram::observe(double value) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++counts_[static_cast<size_t>(it - bounds_.begin())];
  ++count_;
  sum_ += value;
}

double Histogram::quantile_upper_bound(double q) const {
  if (count_ == 0) return 0.0;
  const auto target = static_cast<uint64_t>(q * static_cast<double>(count_));
  uint64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen > target || seen == count_) {
      return i < bounds_.size() ? bounds_[i] : std::numeric_limits<double>::infinity();
    }
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace arbor::engine
