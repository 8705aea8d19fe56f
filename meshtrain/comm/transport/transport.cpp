// Request: completion flag, error slot and callback.
#include "meshtrain/comm/transport/transport.h"

#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {

bool Request::done() const {
  std::lock_guard lock(mu_);
  return done_;
}

void Request::drive_until_done() {
  if (driver) {
    while (!done()) driver(*this);
  }
}

void Request::wait() {
  drive_until_done();
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

RequestPtr take_posted(std::deque<RequestPtr>& posted, uint64_t tag) {
  for (auto it = posted.begin(); it != posted.end(); ++it) {
    if ((*it)->tag == tag) {
      RequestPtr r = std::move(*it);
      posted.erase(it);
      return r;
    }
  }
  return nullptr;
}

namespace {

// Copies a whole message into a receive; a size mismatch is the receive's CommError.
std::exception_ptr fill(int peer, const std::vector<uint8_t>& msg, void* data, size_t bytes) {
  if (msg.size() != bytes) {
    return std::make_exception_ptr(CommError(detail::str_cat(
        "message from rank ", peer, " has ", msg.size(), " bytes, the receive expects ", bytes)));
  }
  if (bytes > 0) std::memcpy(data, msg.data(), bytes);
  return nullptr;
}

}  // namespace

std::pair<RequestPtr, std::exception_ptr> EarlyMessages::arrive(int peer, uint64_t tag,
                                                                std::vector<uint8_t> msg,
                                                                std::deque<RequestPtr>& posted) {
  if (RequestPtr r = take_posted(posted, tag)) {
    std::exception_ptr error = fill(peer, msg, r->data, r->bytes);
    return {std::move(r), error};
  }
  queues_[{peer, tag}].push_back(std::move(msg));
  return {nullptr, nullptr};
}

bool EarlyMessages::take(int peer, uint64_t tag, void* data, size_t bytes,
                         std::exception_ptr& error) {
  auto it = queues_.find({peer, tag});
  if (it == queues_.end()) return false;
  std::vector<uint8_t> msg = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  error = fill(peer, msg, data, bytes);
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
