// See tcp_store_server.h. Threads per client keep the request handling straight-line code (a
// blocking get is just a condition-variable wait); 64 to a few thousand clients are fine.
#include "meshtrain/comm/tcp_store_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "meshtrain/comm/frame.h"
#include "meshtrain/comm/store_protocol.h"
#include "meshtrain/comm/tls.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {
namespace {

constexpr auto kReplyTimeout = std::chrono::seconds(60);

void reply(Socket& sock, StoreReply type, const Bytes& payload) {
  write_frame(sock, static_cast<uint16_t>(type), payload, Deadline(kReplyTimeout));
}

void reply_message(Socket& sock, StoreReply type, const std::string& msg) {
  reply(sock, type, Bytes(msg.begin(), msg.end()));
}

}  // namespace

struct TcpStoreServer::Connection {
  Socket socket;
  std::thread thread;
  std::atomic<bool> finished{false};
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : options_(std::move(options)) {
  tls_ = options_.tls ? *options_.tls : default_tls();
  listener_ = Socket::listen(options_.host, options_.port);
  port_ = listener_.local_port();
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) < 0) {
    MT_THROW(CommError, "cannot create the store server's wake pipe");
  }
  acceptor_ = std::thread([this] { accept_loop(); });
  MT_LOG_DEBUG("store", "TcpStore server listening on port ", port_,
               options_.token.empty() ? " (no job token)" : "", tls_ ? " (TLS)" : "");
}

TcpStoreServer::~TcpStoreServer() {
  stop();
  for (int fd : wake_pipe_) {
    if (fd >= 0) ::close(fd);
  }
}

void TcpStoreServer::stop() {
  if (stopping_.exchange(true)) return;
  char b = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_pipe_[1], &b, 1);
  if (acceptor_.joinable()) acceptor_.join();
  listener_.close();
  data_.close();
  std::lock_guard lock(mu_);
  // Only the read side: a reply under way (say, to the request that let the host stop the
  // store) still reaches its client, and each thread then reads the end of its stream and leaves.
  for (auto& c : connections_) {
    if (c->socket.valid()) ::shutdown(c->socket.fd(), SHUT_RD);
  }
  for (auto& c : connections_) {
    if (c->thread.joinable()) c->thread.join();
  }
  connections_.clear();
}

void TcpStoreServer::reap_finished() {
  std::lock_guard lock(mu_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->finished.load()) {
      (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpStoreServer::accept_loop() {
  block_signals_in_this_thread();
  while (!stopping_.load()) {
    pollfd fds[2] = {{listener_.fd(), POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    int rc = ::poll(fds, 2, 1000);
    if (rc < 0 && errno != EINTR) {
      MT_LOG_ERROR("store", "poll on the store listener failed: ", strerror(errno));
      return;
    }
    reap_finished();
    if (stopping_.load()) return;
    if (rc <= 0 || !(fds[0].revents & POLLIN)) continue;
    Socket sock;
    try {
      sock = listener_.accept(Deadline(std::chrono::milliseconds(0)));
    } catch (const TimeoutError&) {
      continue;  // Another wake-up took it, or the client gave up.
    } catch (const Error& e) {
      MT_LOG_WARN("store", "accept failed: ", e.what());
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->socket = std::move(sock);
    Connection* raw = conn.get();
    std::lock_guard lock(mu_);
    connections_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { serve(raw); });
  }
}

void TcpStoreServer::serve(Connection* conn) {
  block_signals_in_this_thread();
  Socket& sock = conn->socket;
  const std::string peer = sock.peer();
  try {
    const Deadline deadline(options_.handshake_timeout);
    if (tls_) {
      try {
        sock.start_tls(*tls_, true, deadline);
      } catch (const Error& e) {
        MT_LOG_WARN("store", e.what());  // "refused connection from <address>: <why>"
        throw;
      }
    }
    authenticate_server(sock, options_.token, deadline);
  } catch (const Error&) {
    ++num_refused_;  // authenticate_server logged the refusal and closed the socket.
    conn->finished.store(true);
    return;
  }
  ++num_clients_;
  MT_LOG_DEBUG("store", "client ", peer, " connected");
  try {
    while (!stopping_.load()) {
      Frame frame = read_frame(sock, Deadline::never());
      StoreRequest req;
      try {
        req = decode_store_request(frame.type, frame.payload);
      } catch (const CommError& e) {
        reply_message(sock, StoreReply::kError, e.what());
        MT_LOG_WARN("store", "dropping client ", peer, ": ", e.what());
        break;
      }
      try {
        WireWriter out;
        const std::string& key = req.keys.empty() ? std::string() : req.keys.front();
        switch (req.op) {
          case StoreOp::kSet:
            data_.set(key, req.value);
            break;
          case StoreOp::kGet:
            out.bytes(data_.get(key, Duration(req.timeout_ms)));
            break;
          case StoreOp::kAdd:
            out.i64(data_.add(key, req.delta));
            break;
          case StoreOp::kCompareSet:
            out.bytes(data_.compare_set(key, req.expected, req.value));
            break;
          case StoreOp::kWait:
            data_.wait(req.keys, Duration(req.timeout_ms));
            break;
          case StoreOp::kRemove:
            out.u8(data_.remove(key) ? 1 : 0);
            break;
          case StoreOp::kCheck:
            out.u8(data_.check(req.keys) ? 1 : 0);
            break;
        }
        reply(sock, StoreReply::kOk, out.take());
      } catch (const TimeoutError& e) {
        reply_message(sock, StoreReply::kTimeout, e.what());
      } catch (const CommError&) {
        throw;
      } catch (const Error& e) {
        reply_message(sock, StoreReply::kError, e.what());
      }
    }
  } catch (const Error& e) {
    // A client closing its connection is the normal way to leave.
    MT_LOG_DEBUG("store", "client ", peer, " left: ", e.what());
  }
  --num_clients_;
  conn->finished.store(true);
}

}  // namespace meshtrain::comm
