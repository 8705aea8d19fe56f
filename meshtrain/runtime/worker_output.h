// Forwards the launcher's workers' stdout and stderr to the launcher's own, one whole line at a
// time with a "[rank N] " prefix, so that the output of many ranks stays readable. One thread
// polls every pipe; a line is written with a single write() and is never mixed with another.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace meshtrain::runtime {

class WorkerOutput {
 public:
  WorkerOutput();
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // Takes ownership of a pipe's read end; lines go to `target_fd` (1 or 2) with the prefix. May
  // be called while the thread runs (a worker replaced alone).
  void add(int read_fd, int target_fd, std::string prefix);
  void start();
  // Waits until every pipe reached end-of-file or the drain time passed (a worker's orphaned
  // child may keep a pipe open forever), flushes partial lines and stops the thread.
  void finish(std::chrono::milliseconds drain);

 private:
  struct Stream {
    int fd;
    int target;
    std::string prefix;
    std::string pending;
  };
  void loop();
  void emit(Stream& s, const char* data, size_t n);
  void flush_partial(Stream& s);

  std::deque<Stream> streams_;  // grows while running: its elements do not move
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> finishing_{false};
  std::chrono::steady_clock::time_point drain_deadline_;
  std::mutex mu_;
};

}  // namespace meshtrain::runtime
