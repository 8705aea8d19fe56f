// Point-to-point messages through shared memory: one byte ring per ordered pair of ranks inside
// the group's segment, and a progress thread per rank that moves every pending send and receive
// as far as the rings allow, then sleeps on the rank's doorbell (a futex word that peers ring
// after writing to or reading from a ring shared with it). Each message is a 16-byte header
// (magic, tag, length) and its payload; a message whose receive is not posted yet stays in the
// ring, unless another receive from that peer is waiting behind it, in which case it is buffered
// (bounded) so that tags can be received in any order. The thread that posts or waits on a
// request moves its bytes itself when it can (a send into a ring with room, a receive whose
// message is there): handing each transfer to the progress thread and back cost two wake-ups,
// about 100 us per pipeline transfer on a busy host.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <thread>

#include "meshtrain/comm/transport/transport.h"

namespace meshtrain::comm {

struct ShmRing {
  alignas(64) std::atomic<uint64_t> write_pos;
  alignas(64) std::atomic<uint64_t> read_pos;
  alignas(64) uint8_t data[64];  // the ring's bytes follow (ring_bytes in all)
};

struct ShmTransportLayout {
  uint8_t* rings = nullptr;  // size * size rings, ring (src, dst) at index src * size + dst
  size_t ring_stride = 0;
  size_t ring_bytes = 0;
  std::function<std::atomic<uint32_t>*(int rank)> doorbell;
  std::function<bool(int rank)> alive;
  std::function<std::string()> remote_abort;  // non-empty once some rank aborted the segment
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(int rank, int size, ShmTransportLayout layout);
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RequestPtr post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                       SteadyTime deadline) override;
  RequestPtr post_recv(int peer, uint64_t tag, void* data, size_t bytes,
                       SteadyTime deadline) override;
  void abort(const std::string& reason) override;
  std::vector<int> pending_peers() const override;

  static size_t stride_for(size_t ring_bytes);

 private:
  struct Incoming {  // the message being read from one source
    bool active = false;
    uint64_t tag = 0;
    uint64_t bytes = 0;
    uint64_t done = 0;
    RequestPtr target;              // a posted receive, or
    std::vector<uint8_t> buffered;  // an early message
  };

  ShmRing* ring(int src, int dst) const;
  void ring_bell(int rank);
  void loop();
  bool progress_send(int dst);
  bool progress_recv(int src);
  // Every pending send and receive as far as the rings allow; true when a byte moved.
  bool progress_all();
  // Request::driver: the waiting thread moves what it can (every peer's, so that two ranks each
  // waiting on a send keep draining each other's rings), then sleeps on the doorbell until a
  // peer rings (a few ms at most) when nothing could move.
  void drive(Request& req);
  void fail_peer(int peer, const std::string& why);
  void fail_all(const std::string& why);
  // Completes requests outside the lock (their callbacks may call back into the transport).
  void run_completions();

  const int rank_;
  const int size_;
  const ShmTransportLayout layout_;

  mutable std::mutex mu_;
  std::map<int, std::deque<RequestPtr>> sends_;
  std::map<int, std::deque<RequestPtr>> recvs_;
  EarlyMessages early_;
  std::vector<Incoming> incoming_;
  std::vector<std::pair<RequestPtr, std::exception_ptr>> completions_;
  std::string aborted_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace meshtrain::comm
