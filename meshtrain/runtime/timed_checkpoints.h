// ckpt.interval_minutes: a checkpoint once that much time has passed since the last one (or
// since the run started), beside the step interval. Only rank 0 reads its clock; its decision
// travels to the other ranks on the step's own all-gather (StepOptions::save_request ->
// StepOutcome::save), so every rank saves at the same step without a collective of its own and
// without trusting the ranks' clocks to agree.
#pragma once

#include <functional>

namespace meshtrain::runtime {

class TimedCheckpoints {
 public:
  using Clock = std::function<double()>;  // monotonic seconds

  // minutes <= 0: never due.
  TimedCheckpoints(double minutes, Clock now);
  bool enabled() const { return interval_s_ > 0; }

  // Once at each step, on rank 0: whether a checkpoint is due. Reads the clock once.
  bool due();
  // A checkpoint was saved at this step, for whatever reason: the interval starts again from
  // the time the last due() read.
  void saved() { last_save_s_ = now_s_; }

 private:
  double interval_s_ = 0;
  Clock clock_;
  double last_save_s_ = 0;
  double now_s_ = 0;
};

// std::chrono::steady_clock in seconds; or, when MESHTRAIN_TEST_CLOCK_STEP_S=N is set (a test
// hook, not a feature), a clock whose k-th reading is k * N seconds, so that tests of timed
// saves decide by step count instead of by sleeping.
TimedCheckpoints::Clock checkpoint_clock();

}  // namespace meshtrain::runtime
