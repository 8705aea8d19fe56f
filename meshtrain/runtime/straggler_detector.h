// Names a straggler from per-unit step times (a unit is a node, or a rank in a job of one
// node): the unit whose time exceeds `factor` x the median of the other units' times on
// `steps` consecutive steps. One step within the factor starts its count over. Pure arithmetic
// on the times it is given: every rank feeds it the same gathered times (StepOutcome's
// rank_step_s), so every rank names the same unit at the same step without a word between them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace meshtrain::runtime {

struct StragglerVerdict {
  int unit = 0;
  // The unit's time over the median of the others', averaged over its slow streak.
  double factor = 0;
};

class StragglerDetector {
 public:
  // factor <= 0: never names anyone (elastic.straggler_factor = 0).
  StragglerDetector(double factor, int64_t steps);

  // One step's times, one per unit (the same number every step). Returns a unit the step its
  // streak reaches `steps`, once per unit; when two complete theirs at once, the slower (then
  // the lower index).
  std::optional<StragglerVerdict> observe(std::span<const double> times);
  // Consecutive slow steps of `unit` so far.
  int64_t streak(int unit) const;

 private:
  double factor_;
  int64_t steps_;
  std::vector<int64_t> streak_;
  std::vector<double> ratio_sum_;  // over the current streak
  std::vector<bool> named_;
};

// The median of `times` without the element at `unit` (the mean of the middle two for an even
// count); 0 for fewer than two times.
double median_of_others(std::span<const double> times, size_t unit);

}  // namespace meshtrain::runtime
