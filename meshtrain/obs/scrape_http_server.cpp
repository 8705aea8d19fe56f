// See scrape_http_server.h.
#include "meshtrain/obs/scrape_http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/tls.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::obs {

namespace {

using Clock = std::chrono::steady_clock;

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Error";
  }
}

std::string serialize(const HttpReply& r) {
  return detail::str_cat(
      "HTTP/1.1 ", r.status, " ", reason_phrase(r.status), "\r\nContent-Type: ", r.content_type,
      "\r\nContent-Length: ", r.body.size(), "\r\nConnection: close\r\n\r\n", r.body);
}

// A descriptor closed when its owner goes.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

enum class ConnState { kReading, kHandling, kWriting };

struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};

struct Conn {
  Fd fd;
  std::unique_ptr<SSL, SslFree> ssl;  // TLS: the session (before fd closes: declared after it)
  bool handshaken = false;
  uint64_t id = 0;
  ConnState state = ConnState::kReading;
  Clock::time_point accepted;
  Clock::time_point deadline;
  std::string in;
  std::string out;
  size_t written = 0;
};

struct Job {
  int fd;
  uint64_t id;
  std::string method;
  std::string path;
};

struct Done {
  int fd;
  uint64_t id;
  std::string bytes;
};

}  // namespace

struct ScrapeHttpServer::Impl {
  HttpHandler handler;
  ScrapeHttpServerOptions options;
  Fd listen_fd;
  Fd epoll_fd;
  Fd wake_fd;
  std::thread loop_thread;
  std::vector<std::thread> handlers;
  std::atomic<bool> stopping{false};
  std::atomic<size_t> open{0};
  std::atomic<size_t> refused{0};

  // Handler threads take jobs and leave replies; both queues under one mutex.
  std::mutex mu;
  std::condition_variable jobs_cv;
  std::deque<Job> jobs;
  std::deque<Done> done;

  // Owned by the loop thread.
  std::unordered_map<int, Conn> conns;
  uint64_t next_id = 1;
  bool listening = true;
  Clock::time_point listen_again{};

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd.fd, &one, sizeof(one));
  }

  void watch(int fd, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd.fd, op, fd, &ev);
  }

  Clock::time_point last_refusal_log{};

  void refuse_tls(Conn& c, const std::string& why) {
    const auto now = Clock::now();
    if (now - last_refusal_log >= std::chrono::minutes(1)) {
      last_refusal_log = now;
      MT_LOG_WARN("metrics", "metrics endpoint: refused ", comm::peer_address(c.fd.fd), ": ", why,
                  " (a scraper needs a certificate of the job's CA, over https)");
    }
    refused.fetch_add(1);
    close_conn(c.fd.fd);
  }

  // What the session wants before it can go on: watch for it. False when the session failed
  // (the connection is closed then).
  bool tls_wait(Conn& c, int rc, bool registered) {
    const int err = SSL_get_error(c.ssl.get(), rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      watch(c.fd.fd, (err == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT) | EPOLLRDHUP,
            registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD);
      return true;
    }
    return false;
  }

  // Drives the handshake: true once it is done.
  bool handshake(Conn& c) {
    ERR_clear_error();
    const int rc = SSL_do_handshake(c.ssl.get());
    if (rc == 1) {
      c.handshaken = true;
      watch(c.fd.fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
      return true;
    }
    if (tls_wait(c, rc, true)) return false;
    const long verify = SSL_get_verify_result(c.ssl.get());
    const unsigned long e = ERR_peek_error();
    std::string why = verify != X509_V_OK ? X509_verify_cert_error_string(verify)
                      : e != 0            ? ERR_reason_error_string(e)
                                          : "the client hung up during the handshake";
    if (e != 0 && (ERR_GET_REASON(e) == SSL_R_WRONG_VERSION_NUMBER ||
                   ERR_GET_REASON(e) == SSL_R_HTTP_REQUEST))
      why = "it speaks plaintext (http://), not TLS";
    ERR_clear_error();
    refuse_tls(c, why);
    return false;
  }

  // One read: > 0 bytes, 0 the peer closed, -1 nothing now (EAGAIN), -2 an error.
  ssize_t read_some(Conn& c, char* buf, size_t n) {
    if (!c.ssl) {
      const ssize_t r = ::recv(c.fd.fd, buf, n, 0);
      if (r >= 0) return r;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
      return errno == EINTR ? read_some(c, buf, n) : -2;
    }
    ERR_clear_error();
    size_t got = 0;
    const int rc = SSL_read_ex(c.ssl.get(), buf, n, &got);
    if (rc == 1) return static_cast<ssize_t>(got);
    const int err = SSL_get_error(c.ssl.get(), rc);
    if (err == SSL_ERROR_ZERO_RETURN) return 0;
    if (tls_wait(c, rc, true)) return -1;
    ERR_clear_error();
    return err == SSL_ERROR_SYSCALL ? 0 : -2;
  }

  void close_conn(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    ::epoll_ctl(epoll_fd.fd, EPOLL_CTL_DEL, fd, nullptr);
    // What the client sent beyond the headers (a body) is read first: closing with unread bytes
    // resets the connection and may discard the reply on its way.
    char sink[4096];
    while (::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    conns.erase(it);
    open.store(conns.size(), std::memory_order_relaxed);
  }

  // The oldest connection whose request is still arriving, or -1.
  int oldest_reading() const {
    int fd = -1;
    Clock::time_point oldest = Clock::time_point::max();
    for (const auto& [f, c] : conns) {
      if (c.state == ConnState::kReading && c.accepted < oldest) {
        oldest = c.accepted;
        fd = f;
      }
    }
    return fd;
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: shed a slow client, or stop accepting for a moment.
          const int victim = oldest_reading();
          if (victim >= 0) {
            close_conn(victim);
            continue;
          }
          ::epoll_ctl(epoll_fd.fd, EPOLL_CTL_DEL, listen_fd.fd, nullptr);
          listening = false;
          listen_again = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      if (conns.size() >= options.max_connections) {
        const int victim = oldest_reading();
        if (victim < 0) {
          ::close(fd);  // every slot answers a request: the newcomer waits its turn elsewhere
          continue;
        }
        close_conn(victim);
      }
      Conn c;
      c.fd = Fd(fd);
      if (options.tls) {
        c.ssl.reset(SSL_new(options.tls->native()));
        if (!c.ssl || SSL_set_fd(c.ssl.get(), fd) != 1) continue;  // closes fd
        SSL_set_accept_state(c.ssl.get());
        SSL_set_mode(c.ssl.get(), SSL_MODE_ENABLE_PARTIAL_WRITE);
      }
      c.id = next_id++;
      c.accepted = Clock::now();
      c.deadline = c.accepted + options.request_timeout;
      conns.emplace(fd, std::move(c));
      open.store(conns.size(), std::memory_order_relaxed);
      watch(fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    }
  }

  void reply_now(Conn& c, int status, const std::string& body) {
    c.out = serialize({status, "text/plain", body});
    c.state = ConnState::kWriting;
    c.deadline = Clock::now() + options.request_timeout;
    watch(c.fd.fd, EPOLLOUT, EPOLL_CTL_MOD);
  }

  void on_readable(Conn& c) {
    if (c.ssl && !c.handshaken && !handshake(c)) return;
    char buf[4096];
    for (;;) {
      const ssize_t n = read_some(c, buf, sizeof(buf));
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (c.in.size() > options.max_request_bytes) break;
        continue;
      }
      if (n == -1) break;
      close_conn(c.fd.fd);  // the client went away before its request was complete
      return;
    }
    const size_t end = c.in.find("\r\n\r\n");
    if ((end == std::string::npos ? c.in.size() : end + 4) > options.max_request_bytes) {
      reply_now(c, 431,
                detail::str_cat("request headers over ", options.max_request_bytes, " bytes\n"));
      return;
    }
    if (end == std::string::npos) return;
    const size_t line_end = c.in.find("\r\n");
    const std::string line = c.in.substr(0, line_end);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      reply_now(c, 400, "malformed request line\n");
      return;
    }
    std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    path = path.substr(0, path.find('?'));
    // Out of the epoll set while a handler runs: a hang-up would be reported even with no
    // events asked for, over and over.
    c.state = ConnState::kHandling;
    ::epoll_ctl(epoll_fd.fd, EPOLL_CTL_DEL, c.fd.fd, nullptr);
    {
      std::lock_guard<std::mutex> lock(mu);
      jobs.push_back({c.fd.fd, c.id, line.substr(0, sp1), std::move(path)});
    }
    jobs_cv.notify_one();
  }

  void on_writable(Conn& c) {
    while (c.written < c.out.size()) {
      if (c.ssl) {
        ERR_clear_error();
        size_t n = 0;
        const int rc =
            SSL_write_ex(c.ssl.get(), c.out.data() + c.written, c.out.size() - c.written, &n);
        if (rc == 1) {
          c.written += n;
          continue;
        }
        if (tls_wait(c, rc, true)) return;
        ERR_clear_error();
        break;
      }
      const ssize_t n =
          ::send(c.fd.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
      if (n > 0) {
        c.written += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    if (c.ssl) SSL_shutdown(c.ssl.get());  // close_notify: the reply ended here, not cut off
    ::shutdown(c.fd.fd, SHUT_WR);
    close_conn(c.fd.fd);
  }

  void take_replies() {
    std::deque<Done> ready;
    {
      std::lock_guard<std::mutex> lock(mu);
      ready.swap(done);
    }
    for (Done& d : ready) {
      auto it = conns.find(d.fd);
      if (it == conns.end() || it->second.id != d.id) continue;  // closed meanwhile
      Conn& c = it->second;
      c.out = std::move(d.bytes);
      c.state = ConnState::kWriting;
      c.deadline = Clock::now() + options.request_timeout;
      watch(c.fd.fd, EPOLLOUT, EPOLL_CTL_ADD);
      on_writable(c);
    }
  }

  // Closes what is past its deadline; returns the time until the next deadline.
  int expire() {
    const auto now = Clock::now();
    auto next = now + std::chrono::seconds(1);
    std::vector<int> late;
    for (const auto& [fd, c] : conns) {
      if (c.state == ConnState::kHandling) continue;
      if (c.deadline <= now)
        late.push_back(fd);
      else
        next = std::min(next, c.deadline);
    }
    for (int fd : late) close_conn(fd);
    if (!listening) {
      if (now >= listen_again) {
        watch(listen_fd.fd, EPOLLIN, EPOLL_CTL_ADD);
        listening = true;
      } else {
        next = std::min(next, listen_again);
      }
    }
    return static_cast<int>(
        std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count());
  }

  void loop() {
    std::vector<epoll_event> events(256);
    while (!stopping.load()) {
      const int timeout = std::max(0, expire());
      const int n =
          ::epoll_wait(epoll_fd.fd, events.data(), static_cast<int>(events.size()), timeout);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listen_fd.fd) {
          accept_all();
        } else if (fd == wake_fd.fd) {
          uint64_t count;
          (void)!::read(wake_fd.fd, &count, sizeof(count));
          take_replies();
        } else if (auto it = conns.find(fd); it != conns.end()) {
          Conn& c = it->second;
          if (c.state == ConnState::kReading)
            on_readable(c);
          else if (c.state == ConnState::kWriting)
            on_writable(c);
        }
      }
    }
    conns.clear();
    open.store(0);
  }

  void handle_jobs() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        jobs_cv.wait(lock, [&] { return stopping.load() || !jobs.empty(); });
        if (stopping.load()) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      HttpReply reply;
      try {
        reply = handler(job.method, job.path);
      } catch (const std::exception& e) {
        reply = {500, "text/plain", std::string(e.what()) + "\n"};
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        done.push_back({job.fd, job.id, serialize(reply)});
      }
      wake();
    }
  }
};

ScrapeHttpServer::ScrapeHttpServer(HttpHandler handler, ScrapeHttpServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  MT_CHECK(handler != nullptr, "a scrape server needs a handler");
  MT_CHECK(options.max_connections >= 1 && options.handler_threads >= 1,
           "a scrape server needs a connection and a handler thread at least");
  impl_->handler = std::move(handler);
  impl_->options = options;
}

ScrapeHttpServer::~ScrapeHttpServer() {
  stop();
}

int ScrapeHttpServer::bind(const std::string& host, int port, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    if (why) *why = ::gai_strerror(rc);
    return -1;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.fd < 0) continue;
    const int yes = 1;
    ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    // A burst of scrapers must not overflow the backlog into a 1 s SYN retry.
    if (::bind(fd.fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.fd, 1024) != 0) {
      error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd.fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const int actual = bound.ss_family == AF_INET6
                           ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                           : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    impl_->listen_fd = std::move(fd);
    return actual;
  }
  if (why) *why = error;
  return -1;
}

void ScrapeHttpServer::start() {
  Impl& m = *impl_;
  MT_CHECK(m.listen_fd.fd >= 0, "start() before a successful bind()");
  MT_CHECK(!m.loop_thread.joinable(), "the scrape server is running already");
  m.epoll_fd = Fd(::epoll_create1(EPOLL_CLOEXEC));
  m.wake_fd = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (m.epoll_fd.fd < 0 || m.wake_fd.fd < 0)
    MT_THROW(IoError, "scrape server: cannot create its event descriptors: ", std::strerror(errno));
  m.watch(m.listen_fd.fd, EPOLLIN, EPOLL_CTL_ADD);
  m.watch(m.wake_fd.fd, EPOLLIN, EPOLL_CTL_ADD);
  for (size_t i = 0; i < m.options.handler_threads; ++i)
    m.handlers.emplace_back([&m] { m.handle_jobs(); });
  m.loop_thread = std::thread([&m] { m.loop(); });
}

void ScrapeHttpServer::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping.store(true);
  }
  m.jobs_cv.notify_all();
  if (m.wake_fd.fd >= 0) m.wake();
  for (std::thread& t : m.handlers)
    if (t.joinable()) t.join();
  m.handlers.clear();
  if (m.loop_thread.joinable()) m.loop_thread.join();
  m.listen_fd.reset();
}

size_t ScrapeHttpServer::open_connections() const {
  return impl_->open.load(std::memory_order_relaxed);
}

size_t ScrapeHttpServer::refused_connections() const {
  return impl_->refused.load();
}

}  // namespace meshtrain::obs
