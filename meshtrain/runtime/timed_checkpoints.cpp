// See timed_checkpoints.h.
#include "meshtrain/runtime/timed_checkpoints.h"

#include <chrono>
#include <cstdlib>
#include <memory>

#include "meshtrain/util/env_registry.h"

namespace meshtrain::runtime {

TimedCheckpoints::TimedCheckpoints(double minutes, Clock now)
    : interval_s_(minutes > 0 ? minutes * 60.0 : 0.0), clock_(std::move(now)) {
  if (enabled()) last_save_s_ = now_s_ = clock_();
}

bool TimedCheckpoints::due() {
  if (!enabled()) return false;
  now_s_ = clock_();
  return now_s_ - last_save_s_ >= interval_s_;
}

TimedCheckpoints::Clock checkpoint_clock() {
  if (const auto step = env_value(Env::test_clock_step_s)) {
    const double step_s = std::atof(step->c_str());
    auto readings = std::make_shared<long long>(0);
    return [step_s, readings] { return static_cast<double>((*readings)++) * step_s; };
  }
  return [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
}

}  // namespace meshtrain::runtime
