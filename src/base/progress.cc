#include "base/progress.h"

#include <unistd.h>

#include <cstdio>

#include "base/log.h"

namespace arbor {

ProgressBar::ProgressBar(std::string label, uint64_t total, std::string unit,
                         std::chrono::milliseconds log_every)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      tty_(::isatty(STDERR_FILENO) == 1),
      log_every_(log_every),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::set(uint64_t done) {
  done_ = done;
  if (finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!tty_) {
    if (now - last_draw_ < log_every_ || done_ >= total_) return;
    last_draw_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double pct = total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_)
                              : 100.0;
    ARBOR_LOG(kInfo) << label_ << ": " << done_ << "/" << total_ << " " << unit_ << " ("
                     << static_cast<int>(pct) << " %) after " << static_cast<int64_t>(secs)
                     << " s";
    return;
  }
  if (now - last_draw_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_draw_ = now;
  draw(false);
}

void ProgressBar::draw(bool final) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = '\0';
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %llu/%llu %s %.1fs%s", label_.c_str(), bar, frac * 100,
               static_cast<unsigned long long>(done_), static_cast<unsigned long long>(total_),
               unit_.c_str(), secs, final ? "\n" : "");
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) {
    draw(true);
  } else {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    ARBOR_LOG(kInfo) << label_ << ": " << done_ << "/" << total_ << " " << unit_ << " in "
                     << secs << " s";
  }
}

}  // namespace arbor
