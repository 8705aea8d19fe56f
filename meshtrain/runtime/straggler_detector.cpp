#include "meshtrain/runtime/straggler_detector.h"

#include <algorithm>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

double median_of_others(std::span<const double> times, size_t unit) {
  std::vector<double> others;
  for (size_t i = 0; i < times.size(); ++i)
    if (i != unit) others.push_back(times[i]);
  if (others.empty()) return 0;
  std::sort(others.begin(), others.end());
  const size_t n = others.size();
  return n % 2 == 1 ? others[n / 2] : 0.5 * (others[n / 2 - 1] + others[n / 2]);
}

StragglerDetector::StragglerDetector(double factor, int64_t steps)
    : factor_(factor), steps_(steps) {
  MT_CHECK(steps_ >= 1, "a straggler needs at least one slow step, got ", steps_);
}

std::optional<StragglerVerdict> StragglerDetector::observe(std::span<const double> times) {
  if (factor_ <= 0 || times.size() < 2) return std::nullopt;
  if (streak_.empty()) {
    streak_.assign(times.size(), 0);
    ratio_sum_.assign(times.size(), 0.0);
    named_.assign(times.size(), false);
  }
  MT_CHECK(times.size() == streak_.size(), "straggler detector: ", times.size(),
           " step times after ", streak_.size(), " per step before");
  std::optional<StragglerVerdict> verdict;
  for (size_t u = 0; u < times.size(); ++u) {
    const double others = median_of_others(times, u);
    // A unit is slow only against others that measured something: all-zero times (a step
    // too short for the clock) name nobody.
    if (others > 0 && times[u] > factor_ * others) {
      ++streak_[u];
      ratio_sum_[u] += times[u] / others;
    } else {
      streak_[u] = 0;
      ratio_sum_[u] = 0;
    }
    if (streak_[u] < steps_ || named_[u]) continue;
    const double mean = ratio_sum_[u] / static_cast<double>(streak_[u]);
    if (!verdict || mean > verdict->factor) verdict = StragglerVerdict{static_cast<int>(u), mean};
  }
  if (verdict) named_[static_cast<size_t>(verdict->unit)] = true;
  return verdict;
}

int64_t StragglerDetector::streak(int unit) const {
  return unit >= 0 && static_cast<size_t>(unit) < streak_.size()
             ? streak_[static_cast<size_t>(unit)]
             : 0;
}

}  // namespace meshtrain::runtime
