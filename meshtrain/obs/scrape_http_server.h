// The HTTP server of our read-only scrape endpoints (a worker's /metrics, meshrun's aggregated
// /metrics). Slow or idle clients must not starve a scrape: a server that gives each connection a
// thread for its whole life lets 300 clients sending a byte a second hold every thread. So one
// thread reads every request with epoll, and only a complete request is handed to the few handler
// threads; the reply goes back to the epoll thread, which writes it. Beside that:
//   - a deadline on the whole exchange: a request not complete within `request_timeout` after
//     the connection was accepted is closed, and so is a reply not taken within it;
//   - a cap on open connections: a new one at the cap sheds the oldest connection whose request is
//     still arriving (the slowest), so a fresh scrape always gets in;
//   - one request per connection (the reply says Connection: close), requests up to
//     `max_request_bytes` of headers (431 beyond), bodies ignored;
//   - TLS when `tls` is set (dist.tls, meshrun --tls-*): the same TLS 1.3 with mutual
//     certificates as the store and the transport, the handshake driven by the epoll thread
//     within the request deadline; a client without a certificate of the job's CA, or speaking
//     plaintext, is closed unanswered, and a line names it (at most one such line a minute).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace meshtrain::comm {
class TlsContext;
}

namespace meshtrain::obs {

struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
};

// Called on a handler thread with the request's method and path (without the query).
using HttpHandler = std::function<HttpReply(const std::string& method, const std::string& path)>;

struct ScrapeHttpServerOptions {
  std::chrono::milliseconds request_timeout{5000};
  size_t max_connections = 512;
  size_t handler_threads = 4;
  size_t max_request_bytes = 8192;
  std::shared_ptr<const comm::TlsContext> tls = nullptr;  // null: plain HTTP
};

class ScrapeHttpServer {
 public:
  explicit ScrapeHttpServer(HttpHandler handler, ScrapeHttpServerOptions options = {});
  ~ScrapeHttpServer();  // stop()
  ScrapeHttpServer(const ScrapeHttpServer&) = delete;
  ScrapeHttpServer& operator=(const ScrapeHttpServer&) = delete;

  // Binds and listens on host:port (0: a free port the kernel picks, SO_REUSEADDR only so that a
  // port another live process serves fails). Returns the port, or -1 with `why` set.
  int bind(const std::string& host, int port, std::string* why = nullptr);
  // Serves on background threads until stop().
  void start();
  void stop();

  // Open client connections now (tests).
  size_t open_connections() const;
  // Connections refused for their TLS (another CA, an expired certificate, plaintext) so far,
  // counted once the refusal's line, if any, is written (tests wait on it for the line).
  size_t refused_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain::obs
