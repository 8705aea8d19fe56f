// Loss-spike detection: a step whose loss or global gradient norm lies more than `zscore`
// standard deviations above the mean of the last `window` accepted steps is skipped. The inputs
// are the engine's step outcome, which has the same bits on every rank, so every rank takes the
// same decision without a collective of its own.
#pragma once

#include <cstddef>
#include <deque>
#include <string>

namespace meshtrain::runtime {

class SpikeDetector {
 public:
  // zscore <= 0: never a spike. A spike needs at least `min_samples` accepted steps before it.
  SpikeDetector(double zscore, size_t window, size_t min_samples = 10);

  // Whether (loss, norm) is a spike against the window; `why` names the measure and its z-score.
  bool is_spike(double loss, double grad_norm, std::string* why) const;
  // Adds an accepted step to the window (skipped steps are not added).
  void accept(double loss, double grad_norm);
  bool enabled() const { return zscore_ > 0; }

 private:
  double zscore_;
  size_t window_;
  size_t min_samples_;
  std::deque<double> losses_;
  std::deque<double> norms_;
};

}  // namespace meshtrain::runtime
