// Work: a one-shot completion flag with an error slot.
#include "meshtrain/comm/work.h"

#include <sched.h>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {

bool Work::is_completed() const {
  std::lock_guard lock(mu_);
  return done_;
}

bool Work::is_success() const {
  std::lock_guard lock(mu_);
  return done_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard lock(mu_);
  return error_;
}

void Work::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (!timeout && helper_ && !done_flag_.load(std::memory_order_acquire)) helper_();
  // Small collectives finish within microseconds: poll (yielding the core) for a moment before
  // paying for a sleep and a wake-up.
  constexpr auto kPollFor = std::chrono::microseconds(50);
  const auto until = std::chrono::steady_clock::now() + kPollFor;
  while (!done_flag_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
    ::sched_yield();
  }
  std::unique_lock lock(mu_);
  if (timeout) {
    if (!cv_.wait_for(lock, *timeout, [&] { return done_; })) {
      MT_THROW(TimeoutError, op_name_, " (seq ", seq_, ") did not complete within ",
               timeout->count(), " ms");
    }
  } else {
    cv_.wait(lock, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::finish(std::exception_ptr error) {
  std::function<void()> callback;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
    done_flag_.store(true, std::memory_order_release);
    callback = std::move(callback_);
  }
  cv_.notify_all();
  if (callback) callback();
}

void Work::on_completion(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (!done_) {
      callback_ = std::move(fn);
      return;
    }
  }
  fn();
}

}  // namespace meshtrain::comm
