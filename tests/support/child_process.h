// A child process a test started, owned like any other resource: when its owner goes (the test
// ended, or an assertion returned early) the child and everything in its process group are
// killed and the child is reaped, so that a failed test never leaves a trainer or a launcher
// running behind it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/wait.h"

namespace meshtrain::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  // Owns `pid`, a child of this process that leads its own process group (or is alone in it).
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  ~ChildProcess() { kill_and_reap(); }
  ChildProcess(ChildProcess&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), status_(std::exchange(o.status_, std::nullopt)) {}
  ChildProcess& operator=(ChildProcess&& o) noexcept {
    if (this != &o) {
      kill_and_reap();
      pid_ = std::exchange(o.pid_, -1);
      status_ = std::exchange(o.status_, std::nullopt);
    }
    return *this;
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  bool exited() const { return status_.has_value(); }

  // Sends `sig` to the child alone (not its group); nothing once it was reaped.
  void signal(int sig) const {
    if (pid_ > 0 && !status_) ::kill(pid_, sig);
  }

  // Its wait status once it exits within `limit`; nullopt while it still runs.
  std::optional<int> wait_for(std::chrono::milliseconds limit) {
    if (pid_ <= 0 || status_) return status_;
    int status = 0;
    if (wait_until([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, limit))
      status_ = status;
    return status_;
  }

  // Blocks until it exits; its wait status.
  int wait() {
    if (pid_ > 0 && !status_) {
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      status_ = status;
    }
    return status_.value_or(-1);
  }

  // SIGKILL to the child's whole process group, then reaps it; its wait status.
  int kill_and_reap() {
    if (pid_ > 0 && !status_) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      return wait();
    }
    return status_.value_or(-1);
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// The pids of a process's children (the workers of a meshrun), in start order.
inline std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> v;
  for (pid_t c; in >> c;) v.push_back(c);
  return v;
}

// Starts `sh -c "exec CMD"` in a process group of its own, with stdout and stderr going to
// `log` (appended to when `append`).
inline ChildProcess spawn_shell(const std::string& cmd, const std::string& log,
                                bool append = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(99);
  }
  if (pid > 0) ::setpgid(pid, pid);  // also here, so that the group exists before any kill
  return ChildProcess(pid);
}

// Forks a child that runs `fn` and exits with its result, in a process group of its own.
template <typename Fn>
ChildProcess fork_child(Fn&& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::_exit(fn());
  }
  if (pid > 0) ::setpgid(pid, pid);
  return ChildProcess(pid);
}

}  // namespace meshtrain::testing
