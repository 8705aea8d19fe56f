// SignalWake: one descriptor that becomes readable when a termination signal (SIGINT, SIGTERM,
// SIGHUP) is pending or an armed timer runs out. The launcher agent hands it to its store
// client (TcpStore::set_wake_fd), so a request waiting on a silent store is cut short by a
// signal at once, and the store notes sent while stopping for a signal end with the grace
// period. The signals must be blocked (the agent blocks them while it supervises workers):
// reading them stays with sigtimedwait(); this only watches.
#pragma once

#include <chrono>

namespace meshtrain::runtime {

class SignalWake {
 public:
  SignalWake();
  ~SignalWake();
  SignalWake(const SignalWake&) = delete;
  SignalWake& operator=(const SignalWake&) = delete;

  // Readable while a watched signal is pending or the timer has run out.
  int fd() const { return epoll_fd_; }
  // The timer runs out `after` from now (replacing an armed one).
  void arm(std::chrono::milliseconds after);
  void disarm();

 private:
  void close_all();

  int signal_fd_ = -1;
  int timer_fd_ = -1;
  int epoll_fd_ = -1;
};

}  // namespace meshtrain::runtime
