// The scrape endpoints' HTTP server under clients that hold connections: a thousand idle or
// dripping connections (one header byte at a time) cost a scrape nothing, and none of them
// outlives the request deadline. (With a thread per connection, 300 dripping clients made every
// scrape time out, and one stayed open for over 90 s.)
#include "meshtrain/obs/scrape_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/obs/metrics_server.h"
#include "tests/support/wait.h"

namespace meshtrain::obs {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using meshtrain::testing::wait_until;

// Room for the clients' descriptors and the server's, in this one process.
void raise_fd_limit(rlim_t want) {
  rlimit r{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
  if (r.rlim_cur >= want) return;
  r.rlim_cur = std::min(want, r.rlim_max);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &r), 0);
  ASSERT_GE(r.rlim_cur, want) << "the hard descriptor limit is below " << want;
}

// A client descriptor closed when the test ends.
struct Client {
  int fd = -1;
  explicit Client(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  Client(Client&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Client(const Client&) = delete;
  ~Client() {
    if (fd >= 0) ::close(fd);
  }
  bool send(const std::string& s) const {
    return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
           static_cast<ssize_t>(s.size());
  }
  // Whether the server has closed the connection (end of stream or a reset), without waiting.
  bool closed_by_server() const {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
};

struct Reply {
  std::string text;
  double seconds = -1;  // -1: no complete reply within the limit
};

// One whole GET, read to the end of the reply, for at most `limit`.
Reply scrape(int port, const std::string& path, std::chrono::milliseconds limit) {
  const auto t0 = Clock::now();
  Client c(port);
  Reply r;
  if (c.fd < 0 || !c.send("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")) return r;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(t0 + limit - Clock::now());
    if (left.count() <= 0) return r;
    pollfd p{c.fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      r.text.append(buf, static_cast<size_t>(n));
      continue;
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  }
}

TEST(ScrapeHttpServer, AThousandSlowAndIdleConnectionsDoNotDelayAScrape) {
  raise_fd_limit(4096);
  Registry reg({{"job", "t"}, {"rank", "0"}});
  reg.counter("meshtrain_steps_total", "Steps.").inc(3);
  MetricsServer server(reg, {});
  // 500 that connect and say nothing, 500 that send a header byte at a time.
  std::vector<Client> idle, drip;
  for (int i = 0; i < 500; ++i) {
    idle.emplace_back(server.port());
    drip.emplace_back(server.port());
    ASSERT_GE(idle.back().fd, 0);
    ASSERT_GE(drip.back().fd, 0);
  }
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  int scrapes = 0;
  double slowest = 0;
  // A byte every 100 ms for 3 s, a scrape after each.
  for (size_t byte = 0; byte < 30; ++byte) {
    std::this_thread::sleep_for(100ms);  // the drip's pace, not a wait for an outcome
    for (const Client& c : drip) (void)c.send(std::string(1, request[byte % request.size()]));
    const Reply r = scrape(server.port(), "/metrics", 1000ms);
    ASSERT_GE(r.seconds, 0) << "scrape " << scrapes << " got no reply within 1 s";
    ASSERT_TRUE(r.text.starts_with("HTTP/1.1 200")) << r.text.substr(0, 80);
    EXPECT_NE(r.text.find("\nmeshtrain_steps_total{"), std::string::npos) << r.text;
    slowest = std::max(slowest, r.seconds);
    ++scrapes;
  }
  std::printf("%d scrapes beside 1000 slow or idle connections, slowest %.3f s\n", scrapes,
              slowest);
}

TEST(ScrapeHttpServer, NoConnectionOutlivesTheRequestDeadline) {
  raise_fd_limit(4096);
  ScrapeHttpServerOptions o;
  o.request_timeout = 1s;
  ScrapeHttpServer server(
      [](const std::string&, const std::string&) {
        return HttpReply{200, "text/plain", "ok\n"};
      },
      o);
  const int port = server.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  server.start();
  std::vector<Client> held;
  for (int i = 0; i < 1000; ++i) {
    held.emplace_back(port);
    ASSERT_GE(held.back().fd, 0);
  }
  // Every connection drips a byte every 100 ms, never finishing its request: it must be closed
  // within its deadline all the same (the wait below allows several times that).
  const auto all_closed = [&] {
    bool all = true;
    for (const Client& c : held) {
      if (c.closed_by_server()) continue;
      (void)c.send("G");
      all = false;
    }
    return all;
  };
  EXPECT_TRUE(wait_until(all_closed, 15s, 100ms));
  EXPECT_TRUE(wait_until([&] { return server.open_connections() == 0; }, 5s));
  // The server is still there for a whole request.
  const Reply r = scrape(port, "/anything", 5000ms);
  EXPECT_TRUE(r.text.starts_with("HTTP/1.1 200")) << r.text;
}

TEST(ScrapeHttpServer, TheCapShedsTheOldestIncompleteConnection) {
  ScrapeHttpServerOptions o;
  o.max_connections = 4;
  ScrapeHttpServer server(
      [](const std::string&, const std::string& path) {
        return HttpReply{200, "text/plain", path};
      },
      o);
  const int port = server.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  server.start();
  std::vector<Client> held;
  for (int i = 0; i < 4; ++i) {
    held.emplace_back(port);
    ASSERT_TRUE(held.back().send("GET /a"));
    // One at a time, so that the server's accept order is this order.
    ASSERT_TRUE(wait_until([&] { return server.open_connections() == held.size(); }, 5s));
  }
  const Reply r = scrape(port, "/fresh", 5000ms);
  EXPECT_TRUE(r.text.ends_with("/fresh")) << r.text;
  EXPECT_TRUE(wait_until([&] { return held[0].closed_by_server(); }, 5s));
  for (size_t i = 1; i < held.size(); ++i) EXPECT_FALSE(held[i].closed_by_server()) << i;
}

TEST(ScrapeHttpServer, OversizedOrMalformedRequestsGetAnError) {
  ScrapeHttpServerOptions o;
  o.max_request_bytes = 1024;
  ScrapeHttpServer server(
      [](const std::string&, const std::string&) {
        return HttpReply{200, "text/plain", "ok"};
      },
      o);
  const int port = server.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  server.start();
  const Reply big = scrape(port, "/" + std::string(2000, 'x'), 5000ms);
  EXPECT_TRUE(big.text.starts_with("HTTP/1.1 431")) << big.text.substr(0, 80);
  Client bad(port);
  ASSERT_TRUE(bad.send("NONSENSE\r\n\r\n"));
  std::string text;
  ASSERT_TRUE(wait_until(
      [&] {
        char buf[256];
        const ssize_t n = ::recv(bad.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) text.append(buf, static_cast<size_t>(n));
        return n == 0;
      },
      5s));
  EXPECT_TRUE(text.starts_with("HTTP/1.1 400")) << text;
}

TEST(ScrapeHttpServer, ATakenPortIsReportedNotShared) {
  ScrapeHttpServer first([](const std::string&, const std::string&) { return HttpReply{}; });
  const int port = first.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  ScrapeHttpServer second([](const std::string&, const std::string&) { return HttpReply{}; });
  std::string why;
  EXPECT_EQ(second.bind("127.0.0.1", port, &why), -1);
  EXPECT_NE(why.find("in use"), std::string::npos) << why;
}

}  // namespace
}  // namespace meshtrain::obs
