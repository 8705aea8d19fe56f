// WakeSignal: how callers wake a process group's thread. notify() wakes it now; notify_after()
// arms a wake-up for later and cancel_later() takes it back, both without waking anyone at the
// time of the call (a timerfd the sleeper polls beside an eventfd). A caller that may run the
// operation itself before the delay is up thus costs the group's thread nothing: no wake-up, no
// context switch on a core that a rank needs.
#pragma once

#include <atomic>
#include <chrono>

namespace meshtrain::comm {

class WakeSignal {
 public:
  WakeSignal();
  ~WakeSignal();
  WakeSignal(const WakeSignal&) = delete;
  WakeSignal& operator=(const WakeSignal&) = delete;

  // From any thread.
  void notify();
  // Arms the delayed wake-up unless one is armed already.
  void notify_after(std::chrono::microseconds delay);
  void cancel_later();

  // From the one sleeping thread: returns after a notify() or an armed delay ran out (or
  // spuriously); the caller re-checks its condition.
  void wait();

 private:
  int event_fd_ = -1;
  int timer_fd_ = -1;
  std::atomic<bool> armed_{false};
};

}  // namespace meshtrain::comm
