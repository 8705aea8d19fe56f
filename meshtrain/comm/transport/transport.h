// The small interface that algorithms and point-to-point operations are written against: post a
// send or a receive of a byte buffer to one peer with a 64-bit tag, get a Request, wait for it.
// A transport owns one progress thread that moves the bytes (the tcp transport polls sockets,
// the shm transport copies through rings in shared memory), so sends and receives posted from
// any thread progress together and never wait on each other; a transport may also let the
// posting and the waiting thread move them (tcp: a small send leaves at once, a waiter reads
// its sockets), saving the thread switches that dominate small messages. Messages between two ranks
// with the same tag arrive in posting order. Collective tags have the top bit set; user tags do
// not.
#pragma once

#include <map>

#include <deque>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace meshtrain::comm {

using SteadyTime = std::chrono::steady_clock::time_point;

constexpr uint64_t kCollectiveTagBit = uint64_t{1} << 63;
inline uint64_t collective_tag(uint64_t seq, uint32_t step) {
  return kCollectiveTagBit | (seq << 20) | (step & 0xfffffu);
}

class Request {
 public:
  Request(int peer, uint64_t tag, bool is_send, void* data, size_t bytes, SteadyTime deadline)
      : peer(peer),
        tag(tag),
        is_send(is_send),
        data(static_cast<uint8_t*>(data)),
        bytes(bytes),
        deadline(deadline) {}

  bool done() const;
  // Blocks until the transport completed the request; rethrows its failure (CommError). With a
  // driver, the waiting thread moves the bytes itself instead of sleeping until the transport's
  // thread does.
  void wait();
  // With a driver, moves the request's bytes on this thread until it is done (wait() does this
  // first; a p2p Work's wait does it through its helper); without one, nothing.
  void drive_until_done();
  // Sleeps until completion or `timeout`; true when done.
  bool wait_for(std::chrono::milliseconds timeout);
  // Set by the transport before it hands the request out: one step of progress on this request
  // (it may block briefly), called by wait() until the request is done.
  std::function<void(Request&)> driver;
  // Called once by the transport.
  void complete(std::exception_ptr error = nullptr);
  // Runs fn on completion (at once when already complete).
  void on_completion(std::function<void(std::exception_ptr)> fn);

  const int peer;
  const uint64_t tag;
  const bool is_send;
  uint8_t* const data;
  const size_t bytes;
  const SteadyTime deadline;
  size_t progress = 0;  // bytes moved so far (by the transport, under its lock)

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void(std::exception_ptr)> callback_;
};

using RequestPtr = std::shared_ptr<Request>;

// Removes and returns the first receive in `posted` (one peer's, in posting order) that waits
// for `tag`; null when none does.
RequestPtr take_posted(std::deque<RequestPtr>& posted, uint64_t tag);

// Messages that arrived before their receive was posted, per (peer, tag), in arrival order.
// Both transports park early messages here; callers hold their own lock.
class EarlyMessages {
 public:
  // A message from (peer, tag) has been read whole without a receive. A receive for it may have
  // been posted while its bytes were still arriving (post_recv looks here first, and the
  // message was not here yet): that receive, the oldest for the tag, gets it and is returned
  // with its outcome to complete; otherwise the message is parked for the next take().
  std::pair<RequestPtr, std::exception_ptr> arrive(int peer, uint64_t tag, std::vector<uint8_t> msg,
                                                   std::deque<RequestPtr>& posted);
  // When a message from (peer, tag) is parked, copies it into data and returns true; a size
  // mismatch is reported through `error` (CommError naming the peer and both sizes).
  bool take(int peer, uint64_t tag, void* data, size_t bytes, std::exception_ptr& error);

 private:
  std::map<std::pair<int, uint64_t>, std::deque<std::vector<uint8_t>>> queues_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The buffer must stay valid until the request completes. A request not complete by its
  // deadline fails with CommError naming the peer.
  virtual RequestPtr post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                               SteadyTime deadline) = 0;
  virtual RequestPtr post_recv(int peer, uint64_t tag, void* data, size_t bytes,
                               SteadyTime deadline) = 0;
  // Fails every pending and future request with CommError(reason) and tells connected peers.
  virtual void abort(const std::string& reason) = 0;
  // Peers that pending requests wait for.
  virtual std::vector<int> pending_peers() const = 0;
  // Nobody will wait() on this request (its completion callback does the work): the transport's
  // own thread must move its bytes even where a waiting thread would otherwise do it.
  virtual void watch(const RequestPtr& request) { (void)request; }
};

// Waits for every request; rethrows the first failure after all have completed.
void wait_all(const std::vector<RequestPtr>& requests);

}  // namespace meshtrain::comm
