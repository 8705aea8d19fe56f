// TcpTransport: lazy authenticated connections, the accept thread and the poll-driven I/O thread.
#include "meshtrain/comm/transport/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "meshtrain/comm/tls.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {
namespace {

constexpr uint32_t kFrameMagicTcp = 0x4650544du;  // "MTPF"
constexpr uint32_t kHelloMagic = 0x4c48544du;     // "MTHL"
constexpr uint32_t kTypeData = 1;
constexpr uint32_t kTypeAbort = 2;
constexpr uint64_t kMaxAbortBytes = 4096;
constexpr uint64_t kEarlyGrowBytes = uint64_t{64} << 10;
constexpr auto kAbortNoticeTime = std::chrono::milliseconds(200);
// Sends up to this size leave from the posting thread, receives up to it are read by their
// waiting thread (drive_recv).
constexpr size_t kDriveMaxBytes = size_t{256} << 10;

void put_header(uint8_t* out, uint32_t type, uint64_t tag, uint64_t bytes) {
  uint32_t magic = kFrameMagicTcp;
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &type, 4);
  std::memcpy(out + 8, &tag, 8);
  std::memcpy(out + 16, &bytes, 8);
}

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

// Writes all n bytes to a non-blocking socket unless `until` passes first.
bool send_until(Socket& socket, const uint8_t* p, size_t n, SteadyTime until) {
  while (n > 0) {
    iovec v{const_cast<uint8_t*>(p), n};
    ssize_t k = socket.try_sendv(&v, 1);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && !would_block(errno)) return false;
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{socket.fd(), socket.events_wanted(POLLOUT), 0};
    ::poll(&pfd, 1, static_cast<int>(left.count()));
  }
  return true;
}

}  // namespace

TcpTransport::TcpTransport(std::shared_ptr<Store> store, int rank, int size,
                           TcpTransportOptions opts)
    : store_(std::move(store)), rank_(rank), size_(size), opts_(std::move(opts)) {
  tls_ = opts_.tls ? *opts_.tls : default_tls();
  listener_ = Socket::listen(opts_.address, 0);
  if (::pipe2(wake_fd_, O_NONBLOCK | O_CLOEXEC) != 0) {
    MT_THROW(CommError, "pipe2 failed: ", std::strerror(errno));
  }
  HostPort self{opts_.address, listener_.local_port()};
  store_->set_string(opts_.key_prefix + "tcp/addr/" + std::to_string(rank_), self.str());
  accept_thread_ = std::thread([this] { accept_loop(); });
  io_thread_ = std::thread([this] { io_loop(); });
}

TcpTransport::~TcpTransport() {
  stopping_.store(true);
  listener_.shutdown();
  wake();
  if (io_thread_.joinable()) io_thread_.join();
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    std::lock_guard lock(mu_);
    fail_all_locked("transport closed");
  }
  run_completions();
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
}

void TcpTransport::wake() {
  char c = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_[1], &c, 1);
}

void TcpTransport::accept_loop() {
  block_signals_in_this_thread();
  while (!stopping_.load()) {
    Socket s;
    try {
      s = listener_.accept(Deadline(std::chrono::milliseconds(200)));
    } catch (const TimeoutError&) {
      continue;
    } catch (const std::exception& e) {
      if (stopping_.load()) return;
      MT_LOG_WARN("comm", "tcp transport rank ", rank_, ": accept failed: ", e.what());
      continue;
    }
    try {
      Deadline deadline(std::chrono::seconds(10));
      if (tls_) s.start_tls(*tls_, true, deadline);
      authenticate_server(s, opts_.token, deadline);
      uint32_t hello[2];
      s.recv_all(hello, sizeof(hello), deadline);
      int peer = static_cast<int>(hello[1]);
      if (hello[0] != kHelloMagic || peer < 0 || peer >= size_ || peer == rank_) {
        MT_THROW(CommError, "bad hello from ", s.peer());
      }
      std::lock_guard lock(mu_);
      if (in_.count(peer) != 0) MT_THROW(CommError, "second connection from rank ", peer);
      auto in = std::make_unique<In>();
      in->socket = std::move(s);
      in_[peer] = std::move(in);
    } catch (const std::exception& e) {
      MT_LOG_WARN("comm", "tcp transport rank ", rank_, ": dropped connection: ", e.what());
      continue;
    }
    wake();
  }
}

void TcpTransport::connect_to(int peer, SteadyTime deadline) {
  std::lock_guard connect_lock(connect_mu_);
  {
    std::lock_guard lock(mu_);
    if (out_.count(peer) != 0) return;
  }
  Socket s;
  try {
    HostPort hp =
        HostPort::parse(store_->get_string(opts_.key_prefix + "tcp/addr/" + std::to_string(peer)));
    Deadline d =
        Deadline::at(std::min(deadline, std::chrono::steady_clock::now() + opts_.connect_timeout));
    s = Socket::connect(hp.host, hp.port, d);
    if (tls_) s.start_tls(*tls_, false, d);
    authenticate_client(s, opts_.token, d);
    uint32_t hello[2] = {kHelloMagic, static_cast<uint32_t>(rank_)};
    s.send_all(hello, sizeof(hello), d);
  } catch (const std::exception& e) {
    MT_THROW(CommError, "ranks [", peer, "] did not answer: cannot connect to rank ", peer, ": ",
             e.what());
  }
  std::lock_guard lock(mu_);
  auto out = std::make_unique<Out>();
  out->socket = std::move(s);
  out_[peer] = std::move(out);
}

RequestPtr TcpTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                                   SteadyTime deadline) {
  auto req = std::make_shared<Request>(peer, tag, true, const_cast<void*>(data), bytes, deadline);
  {
    std::lock_guard lock(mu_);
    if (!aborted_.empty()) {
      req->complete(std::make_exception_ptr(CommError(aborted_)));
      return req;
    }
  }
  try {
    connect_to(peer, deadline);
  } catch (const std::exception& e) {
    req->complete(std::make_exception_ptr(CommError(e.what())));
    return req;
  }
  bool queued = true;
  {
    std::lock_guard lock(mu_);
    auto failed = peer_failed_.find(peer);
    if (!aborted_.empty() || failed != peer_failed_.end()) {
      req->complete(
          std::make_exception_ptr(CommError(!aborted_.empty() ? aborted_ : failed->second)));
      return req;
    }
    Out& out = *out_[peer];
    const bool first = out.queue.empty();
    out.queue.push_back(req);
    // A small message with nothing queued ahead of it leaves from this thread and completes
    // here without waking the I/O thread -- a pipe write and two thread switches, most of a
    // small message's time. A large one is the I/O thread's, which interleaves it with the
    // receives instead of holding the sockets' lock for megabytes.
    if (first && bytes <= kDriveMaxBytes) progress_out(peer, out);
    queued = !out.queue.empty();
  }
  run_completions();
  if (queued) wake();
  return req;
}

RequestPtr TcpTransport::post_recv(int peer, uint64_t tag, void* data, size_t bytes,
                                   SteadyTime deadline) {
  auto req = std::make_shared<Request>(peer, tag, false, data, bytes, deadline);
  // Large messages are bandwidth-bound: their waiter sleeps, and one I/O thread moves their
  // bytes in both directions without sharing the sockets' lock with it.
  if (bytes <= kDriveMaxBytes) req->driver = [this](Request& r) { drive_recv(r); };
  std::exception_ptr err;
  bool finished = false;
  bool wake_io = false;
  {
    std::lock_guard lock(mu_);
    if (!aborted_.empty()) {
      err = std::make_exception_ptr(CommError(aborted_));
      finished = true;
    } else if (early_.take(peer, tag, data, bytes, err)) {
      finished = true;
    } else if (auto f = peer_failed_.find(peer); f != peer_failed_.end()) {
      err = std::make_exception_ptr(CommError(f->second));
      finished = true;
    } else {
      recvs_[peer].push_back(req);
      // The I/O thread polls a connected peer's socket already (or a waiter does), except when
      // a frame's header arrived before its receive was posted: that frame is read here.
      auto in = in_.find(peer);
      if (in != in_.end() && !in->second->closed && in->second->have_frame && !in->second->target &&
          !in->second->early_active) {
        progress_in(peer, *in->second);
        wake_io = in->second->target != nullptr;  // the rest is on its way
      } else if (in != in_.end() && !req->driver) {
        // No waiter will read it: the I/O thread must poll the socket, which it may have left.
        wake_io = in->second->io_excluded;
      }
    }
  }
  if (finished) {
    req->complete(err);
    return req;
  }
  run_completions();
  if (wake_io) wake();
  return req;
}

// The thread that waits for a receive reads the socket itself: the bytes go from the kernel to
// the user's buffer without the I/O thread waking and then waking the waiter, two thread
// switches that are most of a small message's latency. The I/O thread leaves the socket alone
// meanwhile (and still enforces the deadline), and takes it back when the waiter is done.
void TcpTransport::drive_recv(Request& req) {
  // Every socket with a receive posted is read here, not only req's: a collective waits for its
  // receives one after another, and the bytes of the others would wake the I/O thread meanwhile.
  std::vector<pollfd> fds;
  std::vector<int> peers;
  auto pending = [&](int peer, const In& in) {
    auto r = recvs_.find(peer);
    return !in.closed &&
           (in.target || in.early_active || (r != recvs_.end() && !r->second.empty()));
  };
  bool connected = false;
  {
    std::lock_guard lock(mu_);
    if (aborted_.empty()) {
      for (auto& [peer, in] : in_) {
        if (!pending(peer, *in)) continue;
        progress_in(peer, *in);
        if (!pending(peer, *in)) continue;
        fds.push_back({in->socket.fd(), POLLIN, 0});
        peers.push_back(peer);
        ++in->driven;
        connected |= peer == req.peer;
      }
    }
  }
  run_completions();
  if (!req.done() && !connected) {
    // Not connected yet (the accept thread adds it) or failed: the I/O thread's business.
    req.wait_for(std::chrono::milliseconds(10));
  } else if (!req.done()) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        req.deadline - std::chrono::steady_clock::now());
    ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(left.count(), 0, 10)));
  }
  // The I/O thread left these sockets out while this thread read them: it takes one back when
  // something there is not a waiter's (a frame under way, a watched receive) and no other
  // waiter reads it. An idle socket stays with the next waiter; a send that must queue or a
  // watched receive wakes the I/O thread, which polls it again then.
  bool hand_back = false;
  {
    std::lock_guard lock(mu_);
    for (int peer : peers) {
      In& in = *in_[peer];
      if (!in.closed && aborted_.empty()) progress_in(peer, in);
      --in.driven;
      hand_back |= in.driven == 0 && in.io_excluded && pending(peer, in);
    }
  }
  run_completions();
  if (hand_back && req.done()) wake();
}

void TcpTransport::watch(const RequestPtr& request) {
  bool excluded = false;
  {
    std::lock_guard lock(mu_);
    auto it = in_.find(request->peer);
    excluded = !request->is_send && it != in_.end() && it->second->io_excluded;
  }
  if (excluded) wake();
}

void TcpTransport::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (aborted_.empty()) {
      // Tell the peers we send to why, when no frame is half written, then hang up on everyone.
      std::string text = reason.substr(0, kMaxAbortBytes);
      std::vector<uint8_t> frame(24 + text.size());
      put_header(frame.data(), kTypeAbort, 0, text.size());
      std::memcpy(frame.data() + 24, text.data(), text.size());
      // A frame half written must be finished first, or the notice would land inside it; give
      // that a short while, so that peers learn why rather than only that the link closed.
      const SteadyTime until = std::chrono::steady_clock::now() + kAbortNoticeTime;
      for (auto& [peer, out] : out_) {
        bool clean = !out->failed;
        if (clean && !out->queue.empty() &&
            (out->header_sent > 0 || out->queue.front()->progress > 0)) {
          Request& req = *out->queue.front();
          clean = send_until(out->socket, out->header + out->header_sent,
                             sizeof(out->header) - out->header_sent, until) &&
                  send_until(out->socket, req.data + req.progress, req.bytes - req.progress, until);
        }
        if (clean) send_until(out->socket, frame.data(), frame.size(), until);
        out->socket.shutdown();
      }
      for (auto& [peer, in] : in_) in->socket.shutdown();
    }
    fail_all_locked(reason);
  }
  run_completions();
  wake();
}

std::vector<int> TcpTransport::pending_peers() const {
  std::lock_guard lock(mu_);
  std::vector<int> out;
  for (int q = 0; q < size_; ++q) {
    auto r = recvs_.find(q);
    auto o = out_.find(q);
    auto i = in_.find(q);
    if ((r != recvs_.end() && !r->second.empty()) ||
        (o != out_.end() && !o->second->queue.empty()) || (i != in_.end() && i->second->target)) {
      out.push_back(q);
    }
  }
  return out;
}

void TcpTransport::fail_peer(int peer, const std::string& why) {
  auto err = std::make_exception_ptr(CommError(why));
  if (auto r = recvs_.find(peer); r != recvs_.end()) {
    for (auto& req : r->second) completions_.emplace_back(std::move(req), err);
    r->second.clear();
  }
  if (auto o = out_.find(peer); o != out_.end()) {
    for (auto& req : o->second->queue) completions_.emplace_back(std::move(req), err);
    o->second->queue.clear();
    o->second->failed = true;
  }
  if (auto i = in_.find(peer); i != in_.end() && i->second->target) {
    completions_.emplace_back(std::move(i->second->target), err);
  }
  peer_failed_.emplace(peer, why);
}

void TcpTransport::fail_all_locked(const std::string& why) {
  if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
  for (int q = 0; q < size_; ++q) fail_peer(q, aborted_);
}

void TcpTransport::run_completions() {
  std::vector<std::pair<RequestPtr, std::exception_ptr>> done;
  {
    std::lock_guard lock(mu_);
    done.swap(completions_);
  }
  for (auto& [req, err] : done) req->complete(err);
}

bool TcpTransport::progress_out(int peer, Out& out) {
  bool moved = false;
  while (!out.queue.empty() && !out.failed) {
    Request& req = *out.queue.front();
    if (out.header_sent == 0 && req.progress == 0)
      put_header(out.header, kTypeData, req.tag, req.bytes);
    // A small message's header and payload leave in one call: one system call and, with
    // TCP_NODELAY, one segment instead of two. A large payload goes on its own after its header
    // (behind 24 header bytes it copied measurably slower, 1.3-1.5x at 1-16 MiB).
    while (out.header_sent < sizeof(out.header) || req.progress < req.bytes) {
      iovec iov[2];
      int parts = 0;
      if (out.header_sent < sizeof(out.header))
        iov[parts++] = {out.header + out.header_sent, sizeof(out.header) - out.header_sent};
      if (req.progress < req.bytes && (parts == 0 || req.bytes <= kDriveMaxBytes))
        iov[parts++] = {req.data + req.progress, req.bytes - req.progress};
      ssize_t n = out.socket.try_sendv(iov, parts);
      if (n < 0) {
        if (would_block(errno)) return moved;
        fail_peer(peer, detail::str_cat("ranks [", peer, "] did not answer: send to rank ", peer,
                                        " failed: ", out.socket.error_text(errno)));
        return true;
      }
      const size_t to_header =
          std::min(static_cast<size_t>(n), sizeof(out.header) - out.header_sent);
      out.header_sent += to_header;
      req.progress += static_cast<size_t>(n) - to_header;
      moved = true;
    }
    completions_.emplace_back(std::move(out.queue.front()), nullptr);
    out.queue.pop_front();
    out.header_sent = 0;
    moved = true;
  }
  return moved;
}

bool TcpTransport::progress_in(int peer, In& in) {
  bool moved = false;
  auto closed = [&](const std::string& what) {
    in.closed = true;
    fail_peer(peer, detail::str_cat("ranks [", peer, "] did not answer: ", what));
    return true;
  };
  for (;;) {
    if (!in.have_frame) {
      while (in.header_got < sizeof(in.header)) {
        ssize_t n =
            in.socket.try_recv(in.header + in.header_got, sizeof(in.header) - in.header_got);
        if (n == 0) return closed(detail::str_cat("rank ", peer, " closed its connection"));
        if (n < 0) {
          if (would_block(errno)) return moved;
          return closed(detail::str_cat("receive from rank ", peer,
                                        " failed: ", in.socket.error_text(errno)));
        }
        in.header_got += static_cast<size_t>(n);
        moved = true;
      }
      uint32_t magic, type;
      std::memcpy(&magic, in.header, 4);
      std::memcpy(&type, in.header + 4, 4);
      std::memcpy(&in.tag, in.header + 8, 8);
      std::memcpy(&in.bytes, in.header + 16, 8);
      if (magic != kFrameMagicTcp || (type != kTypeData && type != kTypeAbort) ||
          (type == kTypeAbort && in.bytes > kMaxAbortBytes) || in.bytes > kMaxFrameBytes) {
        in.socket.shutdown();
        return closed(detail::str_cat("malformed frame header from rank ", peer));
      }
      in.have_frame = true;
      in.done = 0;
      if (type == kTypeAbort) {
        in.early.clear();
        in.early_active = true;
        in.tag = UINT64_MAX;  // marks the abort notice
      }
    }
    if (!in.target && !in.early_active) {
      auto& posted = recvs_[peer];
      in.target = take_posted(posted, in.tag);
      if (in.target && in.target->bytes != in.bytes) {
        in.socket.shutdown();
        return closed(detail::str_cat("message from rank ", peer, " has ", in.bytes,
                                      " bytes, the receive expects ", in.target->bytes));
      }
      if (!in.target) {
        if (posted.empty()) return moved;  // wait until a receive is posted
        if (in.bytes > kMaxEarlyBytes) {
          in.socket.shutdown();
          return closed(detail::str_cat("early message from rank ", peer, " of ", in.bytes,
                                        " bytes exceeds the buffering limit"));
        }
        in.early.clear();
        in.early_active = true;
      }
    }
    while (in.done < in.bytes) {
      uint8_t* sink;
      uint64_t room;
      if (in.target) {
        sink = in.target->data;
        room = in.bytes - in.done;
      } else {
        // A buffered frame grows with the bytes that actually arrive, so a peer that announces a
        // large frame and sends little costs little memory.
        if (in.early.size() == in.done) {
          in.early.resize(std::min<uint64_t>(
              in.bytes, std::max<uint64_t>(kEarlyGrowBytes, 2 * in.early.size())));
        }
        sink = in.early.data();
        room = in.early.size() - in.done;
      }
      ssize_t n = in.socket.try_recv(sink + in.done, room);
      if (n == 0) return closed(detail::str_cat("rank ", peer, " closed its connection"));
      if (n < 0) {
        if (would_block(errno)) return moved;
        return closed(
            detail::str_cat("receive from rank ", peer, " failed: ", in.socket.error_text(errno)));
      }
      in.done += static_cast<uint64_t>(n);
      moved = true;
    }
    if (in.target) {
      completions_.emplace_back(std::move(in.target), nullptr);
    } else if (in.tag == UINT64_MAX) {
      std::string why(in.early.begin(), in.early.end());
      fail_all_locked(detail::str_cat("rank ", peer, " aborted the group: ", why));
      in.closed = true;
      return true;
    } else {
      auto [late, error] = early_.arrive(peer, in.tag, std::move(in.early), recvs_[peer]);
      if (late) completions_.emplace_back(std::move(late), error);
    }
    in.early.clear();
    in.early_active = false;
    in.have_frame = false;
    in.header_got = 0;
    moved = true;
  }
}

void TcpTransport::io_loop() {
  block_signals_in_this_thread();
  std::vector<pollfd> fds;
  std::vector<std::pair<int, bool>> who;  // (peer, is_out)
  while (!stopping_.load()) {
    fds.clear();
    who.clear();
    fds.push_back({wake_fd_[0], POLLIN, 0});
    who.push_back({-1, false});
    auto now = std::chrono::steady_clock::now();
    SteadyTime nearest = now + std::chrono::milliseconds(200);
    {
      std::lock_guard lock(mu_);
      for (auto& [peer, out] : out_) {
        if (!out->queue.empty() && !out->failed) {
          fds.push_back({out->socket.fd(), out->socket.events_wanted(POLLOUT), 0});
          who.push_back({peer, true});
        }
      }
      for (auto& [peer, in] : in_) {
        if (in->closed) continue;
        auto r = recvs_.find(peer);
        bool wanted = in->driven == 0 && (!in->have_frame || in->target || in->early_active ||
                                          (r != recvs_.end() && !r->second.empty()));
        in->io_excluded = !wanted;
        if (wanted) {
          fds.push_back({in->socket.fd(), POLLIN, 0});
          who.push_back({peer, false});
        }
      }
      for (auto& [peer, q] : recvs_) {
        for (auto& r : q) nearest = std::min(nearest, r->deadline);
      }
      for (auto& [peer, out] : out_) {
        for (auto& r : out->queue) nearest = std::min(nearest, r->deadline);
      }
    }
    auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(nearest - now).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait_ms, 0, 200)));
    if (fds[0].revents & POLLIN) {
      char buf[256];
      while (::read(wake_fd_[0], buf, sizeof(buf)) > 0) {
      }
    }
    {
      std::lock_guard lock(mu_);
      if (aborted_.empty()) {
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents == 0) continue;
          auto [peer, is_out] = who[i];
          if (is_out) {
            if (auto o = out_.find(peer); o != out_.end()) progress_out(peer, *o->second);
          } else {
            if (auto n = in_.find(peer); n != in_.end() && !n->second->closed) {
              progress_in(peer, *n->second);
            }
          }
        }
        // A receive posted for a frame whose header already arrived.
        for (auto& [peer, in] : in_) {
          if (!in->closed && in->have_frame && !in->target && !in->early_active) {
            progress_in(peer, *in);
          }
        }
        now = std::chrono::steady_clock::now();
        for (int q = 0; q < size_; ++q) {
          bool late = false;
          if (auto r = recvs_.find(q); r != recvs_.end()) {
            for (auto& req : r->second) late |= now >= req->deadline;
          }
          if (auto i = in_.find(q); i != in_.end() && i->second->target) {
            late |= now >= i->second->target->deadline;
          }
          if (auto o = out_.find(q); o != out_.end()) {
            for (auto& req : o->second->queue) late |= now >= req->deadline;
          }
          if (late) {
            fail_peer(q, detail::str_cat("timed out; ranks [", q, "] did not answer"));
            peer_failed_.erase(q);
          }
        }
      }
    }
    run_completions();
  }
}

}  // namespace meshtrain::comm
