// TCP sockets with deadlines: the one place that touches the BSD socket API. Every blocking call
// here takes a Deadline and waits with poll(), so a dead or silent peer becomes a TimeoutError or
// CommError naming the peer's address instead of a hang. Sockets made here are non-blocking and
// TCP_NODELAY; send_all/recv_all hide EAGAIN and EINTR. IPv4, IPv6 and host names all go through
// getaddrinfo. Used by the stores, the authentication handshake and the tcp transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

struct pollfd;
struct iovec;
struct ssl_st;

namespace meshtrain::comm {

class TlsContext;

// The address of a connected socket's peer as "host:port" ("[host]:port" for IPv6), or "?" when
// the system cannot say (for messages about a descriptor this class does not own).
std::string peer_address(int fd);

// A point in time on the steady clock after which a blocking operation gives up.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // Expires `timeout` from now.
  explicit Deadline(std::chrono::milliseconds timeout) : at_(Clock::now() + timeout) {}
  static Deadline at(Clock::time_point t) { return Deadline(t, false); }
  static Deadline never() { return Deadline(Clock::time_point::max(), true); }

  Clock::time_point time_point() const { return at_; }
  bool is_never() const { return never_; }
  bool expired() const { return !never_ && Clock::now() >= at_; }
  // Time left, zero when expired; a very large value for never().
  std::chrono::milliseconds remaining() const;
  // The timeout argument for poll(): -1 for never, otherwise remaining() rounded up and clamped.
  int poll_timeout_ms() const;

  // The same deadline, also ended early (InterruptedError) once `fd` is readable: a signalfd
  // lets a signal cut a long wait short. -1: no wake-up.
  Deadline woken_by(int fd) const {
    Deadline d = *this;
    d.wake_fd_ = fd;
    return d;
  }
  int wake_fd() const { return wake_fd_; }
  // poll() over `p` (whose first entry is the caller's) and the wake-up descriptor, if any:
  // poll's result for `p`; throws InterruptedError naming `what` when the wake-up fired.
  int poll(struct pollfd* p, const char* what) const;
  // Sleeps for `d` (at most until the deadline), cut short by the wake-up like poll().
  void nap(std::chrono::milliseconds d, const char* what) const;

 private:
  Deadline(Clock::time_point t, bool never) : at_(t), never_(never) {}
  Clock::time_point at_;
  bool never_ = false;
  int wake_fd_ = -1;
};

// A host and port as written on command lines and in MASTER_ADDR/MASTER_PORT.
struct HostPort {
  std::string host;
  uint16_t port = 0;

  // "host:port", "[v6addr]:port" or "v6addr" cannot be told apart from host:port, so IPv6
  // literals must be bracketed. Throws ValueError on anything else.
  static HostPort parse(std::string_view text);
  std::string str() const;
};

// Owns one socket file descriptor. Move-only; closes on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd, std::string peer = {}) : fd_(fd), peer_(std::move(peer)) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Listens on host:port. An empty host, "*" or "0.0.0.0" listens on every interface (IPv6 and
  // IPv4 where the system allows both). Port 0 picks a free port; local_port() reports it.
  static Socket listen(const std::string& host, uint16_t port, int backlog = 512);

  // Connects to host:port, retrying refused or unreachable attempts (a peer that is not up yet
  // is normal during rendezvous) until the deadline; then throws TimeoutError naming the peer
  // and the last error. With `retry` false one attempt is made (a scrape of a target that may be
  // gone for good).
  static Socket connect(const std::string& host, uint16_t port, const Deadline& deadline,
                        bool retry = true);

  // Waits for one incoming connection on a listening socket. Throws TimeoutError when the
  // deadline passes first.
  Socket accept(const Deadline& deadline) const;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // The peer as "host:port" (set by connect and accept), used in every error message.
  const std::string& peer() const { return peer_; }
  uint16_t local_port() const;

  // Gives up ownership of the descriptor without closing it.
  int release();
  void close();
  // Wakes any thread blocked on this socket (its calls fail) without releasing the descriptor.
  void shutdown();

  void set_nodelay(bool on = true);
  void set_nonblocking(bool on = true);

  // Sends or receives exactly n bytes. Throws TimeoutError when the deadline passes, CommError
  // when the peer closes the connection or the system reports an error.
  void send_all(const void* data, size_t n, const Deadline& deadline);
  void recv_all(void* data, size_t n, const Deadline& deadline);
  // Receives at most n bytes once data is available; returns 0 when the peer closed cleanly.
  size_t recv_some(void* data, size_t n, const Deadline& deadline);

  // Waits until the socket is readable (or closed by the peer). Returns false on timeout.
  bool wait_readable(const Deadline& deadline) const;

  // TLS (tls.h): runs the TLS 1.3 handshake on a connected socket, as the server (accepting
  // side) or the client, with mutual certificate verification against the context's CA. From
  // then on send_all, recv_all, recv_some, try_sendv and try_recv go through the TLS session.
  // Throws AuthError with one line naming the peer's address and why (another CA, an expired
  // certificate, plaintext) and closes the socket.
  // A client waits for the server's first bytes before it returns (so that a refusal of its
  // certificate is this call's error); `server_speaks_first` false (HTTP) returns after the
  // handshake, and a refusal then fails the first read.
  void start_tls(const TlsContext& ctx, bool server, const Deadline& deadline,
                 bool server_speaks_first = true);
  bool tls() const { return ssl_ != nullptr; }
  // One non-blocking attempt, for poll-driven callers: bytes moved (> 0); for try_recv 0 when
  // the peer closed; -1 with errno set (EAGAIN: poll for events_wanted() and try again with the
  // same bytes; EPROTO: a TLS error, error_text says which).
  long try_sendv(const struct iovec* iov, int parts);
  long try_recv(void* data, size_t n);
  short events_wanted(short usual) const;
  // strerror(err), or the TLS error behind an EPROTO.
  std::string error_text(int err) const;

 private:
  void wait_for(short events, const Deadline& deadline, const char* what) const;

  int fd_ = -1;
  std::string peer_;
  ssl_st* ssl_ = nullptr;
  short tls_want_ = 0;     // POLLIN/POLLOUT the TLS session waits for after EAGAIN
  std::string tls_error_;  // the last TLS error, for error_text(EPROTO)
};

// Blocks the asynchronous termination signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD,
// SIGPIPE) in the calling thread. Library background threads call this first so that signals
// meant for the program reach the thread that handles them.
void block_signals_in_this_thread();

}  // namespace meshtrain::comm
