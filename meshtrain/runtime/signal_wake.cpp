// See signal_wake.h. An epoll descriptor is readable when any descriptor in its set is, so one
// descriptor stands for the signalfd and the timerfd together in the store client's poll().
#include "meshtrain/runtime/signal_wake.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

SignalWake::SignalWake() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  signal_fd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (signal_fd_ < 0 || timer_fd_ < 0 || epoll_fd_ < 0) {
    const int err = errno;
    close_all();
    MT_THROW(IoError, "cannot create the signal wake-up descriptors: ", std::strerror(err));
  }
  for (int fd : {signal_fd_, timer_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      const int err = errno;
      close_all();
      MT_THROW(IoError, "cannot watch the signal wake-up descriptors: ", std::strerror(err));
    }
  }
}

SignalWake::~SignalWake() {
  close_all();
}

void SignalWake::close_all() {
  for (int* fd : {&epoll_fd_, &timer_fd_, &signal_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void SignalWake::arm(std::chrono::milliseconds after) {
  itimerspec spec{};
  const auto ms = std::max<int64_t>(after.count(), 1);  // zero would disarm
  spec.it_value.tv_sec = ms / 1000;
  spec.it_value.tv_nsec = (ms % 1000) * 1000000;
  ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
}

void SignalWake::disarm() {
  // Setting the timer again also clears an expiry nobody read.
  itimerspec spec{};
  ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
}

}  // namespace meshtrain::runtime
