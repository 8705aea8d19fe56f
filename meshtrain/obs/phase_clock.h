// Splits one training step into consecutive phases (data wait, forward, backward, exposed
// communication, optimizer). The loop calls end(phase) after each part; the time since the
// previous mark is charged to that phase and, when tracing is on, recorded as a span, so the
// breakdown in metrics.jsonl, on /metrics and in the trace come from the same clock readings.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "meshtrain/tensor/cpu/kernel_clock.h"

namespace meshtrain::obs {

enum class Phase { kData = 0, kForward, kBackward, kComm, kOptimizer };
inline constexpr size_t kNumPhases = 5;
// "data", "forward", "backward", "comm", "optimizer"
std::string_view phase_name(Phase phase);

class PhaseClock {
 public:
  PhaseClock();  // the step starts now

  // Charges the time since the previous mark (or the start) to `phase`.
  void end(Phase phase);
  // Charges time measured elsewhere (a reducer's wait for its last bucket) without moving the
  // mark; the caller must not also include it in another phase.
  void add(Phase phase, double seconds);

  double seconds(Phase phase) const { return seconds_[static_cast<size_t>(phase)]; }
  // With kernel timing on (cpu::set_kernel_timing): the calling thread's CPU kernel time by kind
  // within each phase, taken at each mark.
  const cpu::KernelSeconds& kernels(Phase phase) const {
    return kernels_[static_cast<size_t>(phase)];
  }
  // From the start to the last mark.
  double elapsed() const;
  int64_t start_us() const { return start_us_; }
  int64_t last_us() const { return last_us_; }

 private:
  std::chrono::steady_clock::time_point start_, last_;
  int64_t start_us_ = 0, last_us_ = 0;  // trace clock
  std::array<double, kNumPhases> seconds_{};
  std::array<cpu::KernelSeconds, kNumPhases> kernels_{};
};

}  // namespace meshtrain::obs
