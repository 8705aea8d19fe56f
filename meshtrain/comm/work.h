// A handle on one asynchronous collective. The group's thread completes it; the caller overlaps
// compute and waits later. A failed Work rethrows its error (CommError, TimeoutError) on wait().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace meshtrain::comm {

class Work {
 public:
  Work(std::string op_name, uint64_t seq) : op_name_(std::move(op_name)), seq_(seq) {}
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  const std::string& op_name() const { return op_name_; }
  uint64_t seq() const { return seq_; }

  bool is_completed() const;
  bool is_success() const;
  // The failure, or nullptr while running or after success.
  std::exception_ptr exception() const;

  // Blocks until the operation finished and rethrows its failure. With a timeout, throws
  // TimeoutError when it has not finished by then (the operation itself keeps its own deadline).
  // Without one, a waiter first offers its thread to the group (set_helper), which may run the
  // operation right here instead of handing it to the group's thread and back.
  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Set once by the group before the Work is returned: called by an untimed wait() on an
  // unfinished operation, on the waiting thread.
  void set_helper(std::function<void()> help) { helper_ = std::move(help); }

  // Called once by the thread that ran the operation.
  void finish(std::exception_ptr error = nullptr);

  // Runs fn (on the finishing thread, or at once when already finished).
  void on_completion(std::function<void()> fn);

 private:
  const std::string op_name_;
  const uint64_t seq_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> done_flag_{false};  // done_, readable without the lock (wait polls it)
  std::exception_ptr error_;
  std::function<void()> callback_;
  std::function<void()> helper_;  // written before the Work is shared, read-only afterwards
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace meshtrain::comm
