// See socket.h. All descriptors are non-blocking; waiting happens in poll() with the caller's
// deadline, which is the only way to bound connect, send and receive uniformly.
#include "meshtrain/comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string format_address(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return detail::str_cat(host, ":", port);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return detail::str_cat("[", host, "]:", port);
  }
  return "?";
}

std::string join_host_port(const std::string& host, uint16_t port) {
  return HostPort{host, port}.str();
}

void set_flag(int fd, int flag, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) MT_THROW(CommError, "fcntl(F_GETFL) failed: ", errno_text(errno));
  int wanted = on ? (flags | flag) : (flags & ~flag);
  if (wanted != flags && ::fcntl(fd, F_SETFL, wanted) < 0) {
    MT_THROW(CommError, "fcntl(F_SETFL) failed: ", errno_text(errno));
  }
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) ::freeaddrinfo(head);
  }
};

// Returns 0 and fills `out`, or the getaddrinfo error code.
int resolve(const std::string& host, uint16_t port, bool passive, AddrInfoList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : AI_ADDRCONFIG);
  std::string service = std::to_string(port);
  const char* node = host.empty() ? nullptr : host.c_str();
  return ::getaddrinfo(node, service.c_str(), &hints, &out.head);
}

void prepare_stream_socket(int fd) {
  set_flag(fd, O_NONBLOCK, true);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

}  // namespace

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return format_address(reinterpret_cast<const sockaddr*>(&ss));
}

std::chrono::milliseconds Deadline::remaining() const {
  if (never_) return std::chrono::milliseconds(std::numeric_limits<int32_t>::max());
  auto left = at_ - Clock::now();
  if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
  return std::chrono::ceil<std::chrono::milliseconds>(left);
}

int Deadline::poll_timeout_ms() const {
  if (never_) return -1;
  auto ms = remaining().count();
  return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
}

int Deadline::poll(pollfd* p, const char* what) const {
  if (wake_fd_ < 0) return ::poll(p, 1, poll_timeout_ms());
  pollfd both[2] = {*p, {wake_fd_, POLLIN, 0}};
  const int rc = ::poll(both, 2, poll_timeout_ms());
  if (rc > 0 && both[1].revents != 0) MT_THROW(InterruptedError, "interrupted while ", what);
  p->revents = both[0].revents;
  return rc;
}

void Deadline::nap(std::chrono::milliseconds d, const char* what) const {
  const Deadline until(std::min(d, remaining()));
  pollfd none{-1, 0, 0};  // poll ignores a negative descriptor
  Deadline woken = until.woken_by(wake_fd_);
  while (!until.expired()) {
    if (woken.poll(&none, what) >= 0) return;
    if (errno != EINTR) return;
  }
}

HostPort HostPort::parse(std::string_view text) {
  HostPort hp;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      MT_THROW(ValueError, "bad address '", text, "': expected [ipv6]:port");
    }
    hp.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon) {
      MT_THROW(ValueError, "bad address '", text, "': expected host:port ([addr]:port for IPv6)");
    }
    hp.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (hp.host.empty() || port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    MT_THROW(ValueError, "bad address '", text, "': expected host:port");
  }
  unsigned long port = std::stoul(std::string(port_text));
  if (port > 65535) MT_THROW(ValueError, "bad address '", text, "': port out of range");
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

std::string HostPort::str() const {
  if (host.find(':') != std::string::npos) return detail::str_cat("[", host, "]:", port);
  return detail::str_cat(host, ":", port);
}

Socket::Socket(Socket&& other) noexcept
    : fd_(other.fd_),
      peer_(std::move(other.peer_)),
      ssl_(other.ssl_),
      tls_want_(other.tls_want_),
      tls_error_(std::move(other.tls_error_)) {
  other.fd_ = -1;
  other.ssl_ = nullptr;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    peer_ = std::move(other.peer_);
    ssl_ = other.ssl_;
    tls_want_ = other.tls_want_;
    tls_error_ = std::move(other.tls_error_);
    other.fd_ = -1;
    other.ssl_ = nullptr;
  }
  return *this;
}

int Socket::release() {
  if (ssl_ != nullptr) {
    SSL_free(ssl_);  // leaves the descriptor open
    ssl_ = nullptr;
  }
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() {
  if (ssl_ != nullptr) {
    SSL_free(ssl_);
    ssl_ = nullptr;
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void Socket::set_nodelay(bool on) {
  int v = on ? 1 : 0;
  if (::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)) < 0) {
    MT_THROW(CommError, "setsockopt(TCP_NODELAY) failed for ", peer_, ": ", errno_text(errno));
  }
}

void Socket::set_nonblocking(bool on) {
  set_flag(fd_, O_NONBLOCK, on);
}

uint16_t Socket::local_port() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) < 0) {
    MT_THROW(CommError, "getsockname failed: ", errno_text(errno));
  }
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

Socket Socket::listen(const std::string& host, uint16_t port, int backlog) {
  std::string node = host;
  bool wildcard = node.empty() || node == "*" || node == "0.0.0.0" || node == "::";
  AddrInfoList list;
  int rc = resolve(wildcard ? std::string() : node, port, true, list);
  if (rc != 0) {
    MT_THROW(CommError, "cannot resolve listen address ", join_host_port(host, port), ": ",
             ::gai_strerror(rc));
  }
  // For a wildcard prefer a dual-stack IPv6 socket, which also accepts IPv4 clients.
  std::vector<addrinfo*> candidates;
  for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) candidates.push_back(ai);
  if (wildcard) {
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](addrinfo* ai) { return ai->ai_family == AF_INET6; });
  }
  int last_err = 0;
  for (addrinfo* ai : candidates) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    Socket s(fd);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6 && wildcard) {
      int zero = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || ::listen(fd, backlog) < 0) {
      last_err = errno;
      continue;
    }
    set_flag(fd, O_NONBLOCK, true);
    s.peer_ = join_host_port(wildcard ? std::string("*") : host, s.local_port());
    return s;
  }
  MT_THROW(CommError, "cannot listen on ", join_host_port(host, port), ": ", errno_text(last_err));
}

Socket Socket::connect(const std::string& host, uint16_t port, const Deadline& deadline,
                       bool retry) {
  const std::string target = join_host_port(host, port);
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    AddrInfoList list;
    int rc = resolve(host, port, false, list);
    if (rc != 0) {
      // A name that does not resolve yet (a pod whose DNS record is not published) may resolve
      // later, so it is retried like a refused connection.
      last_error = ::gai_strerror(rc);
      if (rc != EAI_AGAIN && rc != EAI_NONAME && rc != EAI_FAIL) {
        MT_THROW(CommError, "cannot resolve ", target, ": ", last_error);
      }
    }
    for (addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        last_error = errno_text(errno);
        continue;
      }
      Socket s(fd, target);
      prepare_stream_socket(fd);
      int crc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (crc < 0 && errno != EINPROGRESS) {
        last_error = errno_text(errno);
        continue;
      }
      if (crc < 0) {
        pollfd p{fd, POLLOUT, 0};
        int prc;
        do {
          prc = deadline.poll(&p, "connecting");
        } while (prc < 0 && errno == EINTR);
        if (prc == 0) {
          last_error = "connection attempt timed out";
          break;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (prc < 0) err = errno;
        if (err != 0) {
          last_error = errno_text(err);
          continue;
        }
      }
      return s;
    }
    if (!retry || deadline.expired()) break;
    deadline.nap(backoff, "waiting to connect again");
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::milliseconds(500));
    if (deadline.expired()) break;
  }
  MT_THROW(TimeoutError, "could not connect to ", target, " before the deadline: ", last_error);
}

Socket Socket::accept(const Deadline& deadline) const {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
      Socket s(fd, format_address(reinterpret_cast<sockaddr*>(&ss)));
      prepare_stream_socket(fd);
      return s;
    }
    int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) {
      MT_THROW(CommError, "accept on ", peer_, " failed: ", errno_text(err));
    }
    wait_for(POLLIN, deadline, "accepting a connection");
  }
}

void Socket::wait_for(short events, const Deadline& deadline, const char* what) const {
  pollfd p{fd_, events, 0};
  while (true) {
    int rc = deadline.poll(&p, what);
    if (rc > 0) return;  // Errors and hang-ups surface from the following send/recv.
    if (rc == 0) {
      MT_THROW(TimeoutError, "timed out ", what, " (peer ", peer_, ")");
    }
    if (errno != EINTR) MT_THROW(CommError, "poll failed ", what, " (peer ", peer_, ")");
  }
}

bool Socket::wait_readable(const Deadline& deadline) const {
  if (ssl_ != nullptr && SSL_has_pending(ssl_)) return true;
  pollfd p{fd_, POLLIN, 0};
  while (true) {
    int rc = deadline.poll(&p, "waiting for data");
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) MT_THROW(CommError, "poll failed (peer ", peer_, ")");
  }
}

void Socket::send_all(const void* data, size_t n, const Deadline& deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t left = n;
  while (left > 0 && ssl_ != nullptr) {
    iovec v{const_cast<uint8_t*>(p), left};
    const long rc = try_sendv(&v, 1);
    if (rc > 0) {
      p += rc;
      left -= static_cast<size_t>(rc);
      continue;
    }
    if (errno != EAGAIN) {
      MT_THROW(CommError, "send to ", peer_, " failed after ", n - left, " of ", n,
               " bytes: ", error_text(errno));
    }
    wait_for(events_wanted(POLLOUT), deadline, detail::str_cat("sending ", n, " bytes").c_str());
  }
  while (left > 0) {
    ssize_t rc = ::send(fd_, p, left, MSG_NOSIGNAL);
    if (rc > 0) {
      p += rc;
      left -= static_cast<size_t>(rc);
      continue;
    }
    int err = errno;
    if (rc < 0 && err == EINTR) continue;
    if (rc < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
      wait_for(POLLOUT, deadline, detail::str_cat("sending ", n, " bytes").c_str());
      continue;
    }
    MT_THROW(CommError, "send to ", peer_, " failed after ", n - left, " of ", n,
             " bytes: ", errno_text(err));
  }
}

size_t Socket::recv_some(void* data, size_t n, const Deadline& deadline) {
  while (ssl_ != nullptr) {
    const long rc = try_recv(data, n);
    if (rc >= 0) return static_cast<size_t>(rc);
    if (errno != EAGAIN)
      MT_THROW(CommError, "receive from ", peer_, " failed: ", error_text(errno));
    wait_for(events_wanted(POLLIN), deadline, "receiving");
  }
  while (true) {
    ssize_t rc = ::recv(fd_, data, n, 0);
    if (rc >= 0) return static_cast<size_t>(rc);
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      wait_for(POLLIN, deadline, "receiving");
      continue;
    }
    MT_THROW(CommError, "receive from ", peer_, " failed: ", errno_text(err));
  }
}

void Socket::recv_all(void* data, size_t n, const Deadline& deadline) {
  auto* p = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < n && ssl_ != nullptr) {
    const long rc = try_recv(p + got, n - got);
    if (rc > 0) {
      got += static_cast<size_t>(rc);
      continue;
    }
    if (rc == 0) {
      MT_THROW(CommError, "connection closed by ", peer_, " after ", got, " of ", n, " bytes");
    }
    if (errno != EAGAIN) {
      MT_THROW(CommError, "receive from ", peer_, " failed after ", got, " of ", n,
               " bytes: ", error_text(errno));
    }
    wait_for(events_wanted(POLLIN), deadline, detail::str_cat("receiving ", n, " bytes").c_str());
  }
  while (got < n) {
    ssize_t rc = ::recv(fd_, p + got, n - got, 0);
    if (rc > 0) {
      got += static_cast<size_t>(rc);
      continue;
    }
    if (rc == 0) {
      MT_THROW(CommError, "connection closed by ", peer_, " after ", got, " of ", n, " bytes");
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      wait_for(POLLIN, deadline, detail::str_cat("receiving ", n, " bytes").c_str());
      continue;
    }
    MT_THROW(CommError, "receive from ", peer_, " failed after ", got, " of ", n,
             " bytes: ", errno_text(err));
  }
}

void block_signals_in_this_thread() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace meshtrain::comm
