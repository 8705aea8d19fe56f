// WakeSignal: an eventfd for wake-ups now, a one-shot timerfd for wake-ups later, one poll().
#include "meshtrain/comm/wake_signal.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

void set_timer(int fd, std::chrono::microseconds delay) {
  itimerspec spec{};  // all zero: disarm
  const auto us = delay.count();
  spec.it_value.tv_sec = static_cast<time_t>(us / 1000000);
  spec.it_value.tv_nsec = static_cast<long>(us % 1000000) * 1000;
  MT_CHECK(::timerfd_settime(fd, 0, &spec, nullptr) == 0,
           "timerfd_settime failed: ", std::strerror(errno));
}

}  // namespace

WakeSignal::WakeSignal()
    : event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      timer_fd_(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {
  if (event_fd_ < 0 || timer_fd_ < 0) {
    const int err = errno;
    if (event_fd_ >= 0) ::close(event_fd_);
    if (timer_fd_ >= 0) ::close(timer_fd_);
    MT_THROW(Error, "cannot create the process group's wake-up descriptors: ", std::strerror(err));
  }
}

WakeSignal::~WakeSignal() {
  ::close(event_fd_);
  ::close(timer_fd_);
}

void WakeSignal::notify() {
  const uint64_t one = 1;
  // EAGAIN only when the counter is about to overflow: a wake-up is pending anyway.
  (void)!::write(event_fd_, &one, sizeof(one));
}

void WakeSignal::notify_after(std::chrono::microseconds delay) {
  if (!armed_.exchange(true, std::memory_order_acq_rel))
    set_timer(timer_fd_, std::max(delay, std::chrono::microseconds(1)));
}

void WakeSignal::cancel_later() {
  if (armed_.exchange(false, std::memory_order_acq_rel)) set_timer(timer_fd_, {});
}

void WakeSignal::wait() {
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {timer_fd_, POLLIN, 0}};
  if (::poll(fds, 2, -1) < 0) return;  // EINTR: the caller re-checks
  uint64_t n = 0;
  if (fds[0].revents & POLLIN) (void)!::read(event_fd_, &n, sizeof(n));
  if (fds[1].revents & POLLIN) {
    (void)!::read(timer_fd_, &n, sizeof(n));
    armed_.store(false, std::memory_order_release);
  }
}

}  // namespace meshtrain::comm
