// Request: completion flag, error slot and callback.
#include "meshtrain/comm/transport/transport.h"

namespace meshtrain::comm {

bool Request::done() const {
  std::lock_guard lock(mu_);
  return done_;
}

void Request::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

void Request::complete(std::exception_ptr error) {
  std::function<void(std::exception_ptr)> cb;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = error;
    cb = std::move(callback_);
  }
  cv_.notify_all();
  if (cb) cb(error);
}

void Request::on_completion(std::function<void(std::exception_ptr)> fn) {
  std::exception_ptr err;
  {
    std::lock_guard lock(mu_);
    if (!done_) {
      callback_ = std::move(fn);
      return;
    }
    err = error_;
  }
  fn(err);
}

void wait_all(const std::vector<RequestPtr>& requests) {
  std::exception_ptr first;
  for (const auto& r : requests) {
    try {
      r->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace meshtrain::comm
