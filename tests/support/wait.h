// Waiting in tests: for a condition with a deadline (never a bare sleep that decides an outcome),
// and for another thread to be asleep in the kernel, which is how a test knows that a call it
// expects to block has really blocked before it checks that it did not return.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace meshtrain::testing {

// Polls `pred` until it holds (true) or `limit` passes (false).
template <typename Pred>
bool wait_until(Pred&& pred, std::chrono::milliseconds limit,
                std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

// The kernel's id of the calling thread.
inline pid_t current_tid() {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

// Whether thread `tid` of this process sleeps in the kernel (state S or D in
// /proc/self/task/TID/stat): blocked in a wait, a poll or a lock, not running or runnable.
inline bool thread_is_asleep(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // "tid (comm) S ...": the state follows the last ')' (comm may contain anything).
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'S' || state == 'D';
}

}  // namespace meshtrain::testing
