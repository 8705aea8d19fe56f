#include "meshtrain/runtime/spike_detector.h"

#include <cmath>
#include <iomanip>
#include <sstream>

namespace meshtrain::runtime {
namespace {

// How many standard deviations `x` lies above the mean of `xs` (0 when they do not vary).
double z_of(const std::deque<double>& xs, double x) {
  double mean = 0;
  for (double v : xs) mean += v;
  mean /= static_cast<double>(xs.size());
  double var = 0;
  for (double v : xs) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / static_cast<double>(xs.size()));
  // A flat window (a plateau to the last bit) would make any change infinitely unusual: the
  // spread is taken as at least 1e-6 of the mean.
  return (x - mean) / std::max(sd, 1e-6 * std::fabs(mean) + 1e-12);
}

}  // namespace

SpikeDetector::SpikeDetector(double zscore, size_t window, size_t min_samples)
    : zscore_(zscore), window_(window), min_samples_(min_samples) {}

bool SpikeDetector::is_spike(double loss, double grad_norm, std::string* why) const {
  if (!enabled() || losses_.size() < min_samples_) return false;
  const double zl = z_of(losses_, loss), zn = z_of(norms_, grad_norm);
  if (zl <= zscore_ && zn <= zscore_) return false;
  if (why != nullptr) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1);
    if (zl > zscore_) os << "loss z=" << zl;
    if (zl > zscore_ && zn > zscore_) os << ", ";
    if (zn > zscore_) os << "gradient norm z=" << zn;
    *why = os.str();
  }
  return true;
}

void SpikeDetector::accept(double loss, double grad_norm) {
  if (!enabled() || !std::isfinite(loss) || !std::isfinite(grad_norm)) return;
  losses_.push_back(loss);
  norms_.push_back(grad_norm);
  if (losses_.size() > window_) {
    losses_.pop_front();
    norms_.pop_front();
  }
}

}  // namespace meshtrain::runtime
