// ShmTransport: the progress thread and the ring protocol.
#include "meshtrain/comm/transport/shm_transport.h"

#include <cstring>

#include "meshtrain/comm/transport/shm_segment.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

constexpr uint32_t kMsgMagic = 0x6d74706du;
constexpr size_t kHeaderBytes = 16;
// An early message (its receive not posted yet) is buffered up to this size; larger is refused.
constexpr uint64_t kMaxEarlyBytes = uint64_t{1} << 30;

void ring_copy_in(ShmRing* r, size_t ring_bytes, uint64_t pos, const uint8_t* src, size_t n) {
  size_t at = pos % ring_bytes;
  size_t first = std::min(n, ring_bytes - at);
  std::memcpy(r->data + at, src, first);
  if (n > first) std::memcpy(r->data, src + first, n - first);
}

void ring_copy_out(const ShmRing* r, size_t ring_bytes, uint64_t pos, uint8_t* dst, size_t n) {
  size_t at = pos % ring_bytes;
  size_t first = std::min(n, ring_bytes - at);
  std::memcpy(dst, r->data + at, first);
  if (n > first) std::memcpy(dst + first, r->data, n - first);
}

// The 16-byte message header.
struct Wire {
  uint32_t magic;
  uint32_t bytes_lo;
  uint64_t tag;
};
static_assert(sizeof(Wire) == kHeaderBytes);

}  // namespace

size_t ShmTransport::stride_for(size_t ring_bytes) {
  return (offsetof(ShmRing, data) + ring_bytes + 63) / 64 * 64;
}

ShmTransport::ShmTransport(int rank, int size, ShmTransportLayout layout)
    : rank_(rank), size_(size), layout_(std::move(layout)), incoming_(size) {
  thread_ = std::thread([this] { loop(); });
}

ShmTransport::~ShmTransport() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  ring_bell(rank_);
  thread_.join();
  fail_all("transport closed");
}

ShmRing* ShmTransport::ring(int src, int dst) const {
  return reinterpret_cast<ShmRing*>(layout_.rings +
                                    layout_.ring_stride * (size_t(src) * size_ + dst));
}

void ShmTransport::ring_bell(int rank) {
  std::atomic<uint32_t>* bell = layout_.doorbell(rank);
  bell->fetch_add(1, std::memory_order_acq_rel);
  futex_wake_all(bell);
}

RequestPtr ShmTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                                   SteadyTime deadline) {
  MT_CHECK(bytes <= UINT32_MAX, "shm messages are limited to 4 GiB, got ", bytes);
  auto req = std::make_shared<Request>(peer, tag, true, const_cast<void*>(data), bytes, deadline);
  req->driver = [this](Request& r) { drive(r); };
  {
    std::lock_guard lock(mu_);
    if (!aborted_.empty()) {
      req->complete(std::make_exception_ptr(CommError(aborted_)));
      return req;
    }
    auto& queue = sends_[peer];
    queue.push_back(req);
    // Nothing queued ahead of it: write it into the ring now. A message that fits is sent before
    // this returns, without waking the progress thread and waiting for it to be scheduled.
    if (queue.size() == 1) progress_send(peer);
  }
  run_completions();
  if (!req->done()) ring_bell(rank_);
  return req;
}

RequestPtr ShmTransport::post_recv(int peer, uint64_t tag, void* data, size_t bytes,
                                   SteadyTime deadline) {
  auto req = std::make_shared<Request>(peer, tag, false, data, bytes, deadline);
  req->driver = [this](Request& r) { drive(r); };
  std::exception_ptr done;
  bool finished = false;
  {
    std::lock_guard lock(mu_);
    if (!aborted_.empty()) {
      done = std::make_exception_ptr(CommError(aborted_));
      finished = true;
    } else if (early_.take(peer, tag, data, bytes, done)) {
      finished = true;
    } else {
      recvs_[peer].push_back(req);
      // A message already in the ring is copied straight into the caller's buffer.
      progress_recv(peer);
    }
  }
  if (finished) {
    req->complete(done);
    return req;
  }
  run_completions();
  if (!req->done()) ring_bell(rank_);
  return req;
}

void ShmTransport::drive(Request& req) {
  std::atomic<uint32_t>* bell = layout_.doorbell(rank_);
  // Read before looking at the rings, so that a peer's ring after the look wakes the wait below.
  const uint32_t seen = bell->load(std::memory_order_acquire);
  bool moved = false;
  {
    std::lock_guard lock(mu_);
    // Failures, deadlines and shutdown stay with the progress thread, which completes the request.
    if (!stopping_ && aborted_.empty()) moved = progress_all();
  }
  run_completions();
  if (!moved && !req.done()) futex_wait(bell, seen, std::chrono::milliseconds(5));
}

void ShmTransport::abort(const std::string& reason) {
  fail_all(reason);
  // Peers sleeping on our rings learn about the abort from the segment's flag.
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) ring_bell(q);
  }
}

std::vector<int> ShmTransport::pending_peers() const {
  std::lock_guard lock(mu_);
  std::vector<int> out;
  for (int q = 0; q < size_; ++q) {
    auto s = sends_.find(q);
    auto r = recvs_.find(q);
    if ((s != sends_.end() && !s->second.empty()) || (r != recvs_.end() && !r->second.empty()) ||
        incoming_[q].target) {
      out.push_back(q);
    }
  }
  return out;
}

bool ShmTransport::progress_all() {
  bool moved = false;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    if (auto it = sends_.find(q); it != sends_.end() && !it->second.empty()) {
      moved |= progress_send(q);
    }
    if (auto it = recvs_.find(q);
        (it != recvs_.end() && !it->second.empty()) || incoming_[q].active) {
      moved |= progress_recv(q);
    }
  }
  return moved;
}

bool ShmTransport::progress_send(int dst) {
  auto& queue = sends_[dst];
  ShmRing* r = ring(rank_, dst);
  bool moved = false;
  while (!queue.empty()) {
    RequestPtr& req = queue.front();
    uint64_t w = r->write_pos.load(std::memory_order_relaxed);
    uint64_t space = layout_.ring_bytes - (w - r->read_pos.load(std::memory_order_acquire));
    if (req->progress == 0) {
      if (space < kHeaderBytes) break;
      Wire h{kMsgMagic, static_cast<uint32_t>(req->bytes), req->tag};
      ring_copy_in(r, layout_.ring_bytes, w, reinterpret_cast<const uint8_t*>(&h), kHeaderBytes);
      w += kHeaderBytes;
      space -= kHeaderBytes;
      req->progress = kHeaderBytes;
    }
    size_t left = kHeaderBytes + req->bytes - req->progress;
    size_t k = std::min<uint64_t>(left, space);
    if (k > 0) {
      ring_copy_in(r, layout_.ring_bytes, w, req->data + (req->progress - kHeaderBytes), k);
      w += k;
      req->progress += k;
    }
    r->write_pos.store(w, std::memory_order_release);
    ring_bell(dst);
    moved = true;
    if (req->progress < kHeaderBytes + req->bytes) break;
    completions_.emplace_back(std::move(req), nullptr);
    queue.pop_front();
  }
  return moved;
}

bool ShmTransport::progress_recv(int src) {
  ShmRing* r = ring(src, rank_);
  Incoming& in = incoming_[src];
  auto& posted = recvs_[src];
  bool moved = false;
  for (;;) {
    uint64_t rd = r->read_pos.load(std::memory_order_relaxed);
    uint64_t avail = r->write_pos.load(std::memory_order_acquire) - rd;
    if (!in.active) {
      if (avail < kHeaderBytes || posted.empty()) return moved;
      Wire h{};
      ring_copy_out(r, layout_.ring_bytes, rd, reinterpret_cast<uint8_t*>(&h), kHeaderBytes);
      if (h.magic != kMsgMagic) {
        fail_peer(src, detail::str_cat("corrupt message header from rank ", src));
        return true;
      }
      in = Incoming{};
      in.active = true;
      in.tag = h.tag;
      in.bytes = h.bytes_lo;
      in.target = take_posted(posted, h.tag);
      if (in.target && in.target->bytes != in.bytes) {
        RequestPtr t = std::move(in.target);
        in.active = false;
        std::string why = detail::str_cat("message from rank ", src, " with tag ", h.tag, " has ",
                                          h.bytes_lo, " bytes, the receive expects ", t->bytes);
        completions_.emplace_back(std::move(t), std::make_exception_ptr(CommError(why)));
        fail_peer(src, why);
        return true;
      }
      if (!in.target) {
        if (in.bytes > kMaxEarlyBytes) {
          fail_peer(src, detail::str_cat("early message from rank ", src, " of ", in.bytes,
                                         " bytes exceeds the buffering limit"));
          return true;
        }
        in.buffered.resize(in.bytes);
      }
      rd += kHeaderBytes;
      avail -= kHeaderBytes;
      r->read_pos.store(rd, std::memory_order_release);
      moved = true;
    }
    size_t k = std::min<uint64_t>(in.bytes - in.done, avail);
    if (k > 0) {
      uint8_t* dst = in.target ? in.target->data + in.done : in.buffered.data() + in.done;
      ring_copy_out(r, layout_.ring_bytes, rd, dst, k);
      in.done += k;
      r->read_pos.store(rd + k, std::memory_order_release);
      moved = true;
    }
    if (moved) ring_bell(src);
    if (in.done < in.bytes) return moved;
    if (in.target) {
      completions_.emplace_back(std::move(in.target), nullptr);
    } else {
      auto [late, error] = early_.arrive(src, in.tag, std::move(in.buffered), posted);
      if (late) completions_.emplace_back(std::move(late), error);
    }
    in = Incoming{};
  }
}

void ShmTransport::fail_peer(int peer, const std::string& why) {
  std::vector<RequestPtr> failed;
  for (auto* m : {&sends_, &recvs_}) {
    auto it = m->find(peer);
    if (it == m->end()) continue;
    failed.insert(failed.end(), it->second.begin(), it->second.end());
    it->second.clear();
  }
  if (incoming_[peer].target) failed.push_back(std::move(incoming_[peer].target));
  incoming_[peer] = Incoming{};
  auto err = std::make_exception_ptr(CommError(why));
  for (auto& r : failed) completions_.emplace_back(std::move(r), err);
}

void ShmTransport::fail_all(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
    for (int q = 0; q < size_; ++q) fail_peer(q, aborted_);
  }
  run_completions();
}

void ShmTransport::run_completions() {
  std::vector<std::pair<RequestPtr, std::exception_ptr>> done;
  {
    std::lock_guard lock(mu_);
    done.swap(completions_);
  }
  for (auto& [req, err] : done) req->complete(err);
}

void ShmTransport::loop() {
  std::atomic<uint32_t>* bell = layout_.doorbell(rank_);
  auto last_check = std::chrono::steady_clock::now();
  for (;;) {
    uint32_t seen = bell->load(std::memory_order_acquire);
    bool moved = false;
    bool pending = false;
    {
      std::unique_lock lock(mu_);
      if (stopping_) return;
      if (aborted_.empty()) {
        moved = progress_all();
        auto now = std::chrono::steady_clock::now();
        bool check_alive = now - last_check > std::chrono::milliseconds(50);
        if (check_alive) last_check = now;
        std::string remote = check_alive ? layout_.remote_abort() : std::string();
        for (int q = 0; q < size_; ++q) {
          std::vector<RequestPtr*> reqs;
          for (auto* m : {&sends_, &recvs_}) {
            if (auto it = m->find(q); it != m->end()) {
              for (auto& r : it->second) reqs.push_back(&r);
            }
          }
          if (incoming_[q].target) reqs.push_back(&incoming_[q].target);
          if (reqs.empty()) continue;
          pending = true;
          if (!remote.empty()) {
            fail_peer(q, remote);
          } else if (check_alive && !layout_.alive(q)) {
            fail_peer(q,
                      detail::str_cat("ranks [", q, "] did not answer: rank ", q, " has exited"));
          } else {
            for (auto* r : reqs) {
              if (now >= (*r)->deadline) {
                fail_peer(q, detail::str_cat("timed out; ranks [", q, "] did not answer (",
                                             (*r)->is_send ? "send" : "recv", ")"));
                break;
              }
            }
          }
        }
      }
    }
    run_completions();
    if (!moved) {
      futex_wait(bell, seen,
                 pending ? std::chrono::milliseconds(20) : std::chrono::milliseconds(200));
    }
  }
}

}  // namespace meshtrain::comm
