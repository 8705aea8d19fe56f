// See phase_clock.h.
#include "meshtrain/obs/phase_clock.h"

#include "meshtrain/obs/trace.h"

namespace meshtrain::obs {

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::kData:
      return "data";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kComm:
      return "comm";
    case Phase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

PhaseClock::PhaseClock()
    : start_(std::chrono::steady_clock::now()),
      last_(start_),
      start_us_(TraceRecorder::now_us()),
      last_us_(start_us_) {
  if (cpu::kernel_timing()) cpu::take_kernel_seconds();  // what ran before the step is not its
}

void PhaseClock::end(Phase phase) {
  const auto now = std::chrono::steady_clock::now();
  seconds_[static_cast<size_t>(phase)] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
  if (cpu::kernel_timing()) {
    const cpu::KernelSeconds k = cpu::take_kernel_seconds();
    for (size_t i = 0; i < cpu::kNumKernelKinds; ++i)
      kernels_[static_cast<size_t>(phase)][i] += k[i];
  }
  TraceRecorder& rec = TraceRecorder::global();
  const int64_t now_us = TraceRecorder::now_us();
  if (rec.enabled()) {
    TraceEvent e;
    e.name = std::string(phase_name(phase));
    e.cat = "step";
    e.ts_us = last_us_;
    e.dur_us = now_us - last_us_;
    e.tid = TraceRecorder::thread_id();
    rec.record(std::move(e));
  }
  last_us_ = now_us;
}

void PhaseClock::add(Phase phase, double seconds) {
  if (seconds > 0) seconds_[static_cast<size_t>(phase)] += seconds;
}

double PhaseClock::elapsed() const {
  return std::chrono::duration<double>(last_ - start_).count();
}

}  // namespace meshtrain::obs
