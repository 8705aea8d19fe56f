// Request: completion flag, error slot and callback.
#include "meshtrain/comm/transport/transport.h"

#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {

bool Request::done() const {
  std::lock_guard lock(mu_);
  return done_;
}

void Request::wait() {
  if (driver) {
    while (!done()) driver(*this);
  }
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool Request::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_; });
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

bool EarlyMessages::take(int peer, uint64_t tag, void* data, size_t bytes,
                         std::exception_ptr& error) {
  auto it = queues_.find({peer, tag});
  if (it == queues_.end()) return false;
  std::vector<uint8_t> msg = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  if (msg.size() != bytes) {
    error = std::make_exception_ptr(CommError(detail::str_cat(
        "message from rank ", peer, " has ", msg.size(), " bytes, the receive expects ", bytes)));
  } else if (bytes > 0) {
    std::memcpy(data, msg.data(), bytes);
  }
  return true;
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
