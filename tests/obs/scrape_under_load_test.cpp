// A training run's /metrics endpoint stays up under clients that misbehave: 50 connections that
// send half a request line and wait are held open while 500 scrapes arrive at once, and every
// scrape gets a 200 within a second while the run keeps stepping. (With cpp-httplib's fixed
// pool of two threads, two such connections stalled every scrape until their read timeout.)
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "meshtrain/comm/socket.h"
#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A non-blocking connection to 127.0.0.1:port (connect in progress).
int open_connection(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  if (rc != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct Scrape {
  int fd = -1;
  bool sent = false;
  bool done = false;
  std::string reply;
  double seconds = -1;
};

// Sends `count` GET /metrics requests at once and reads every reply to the end, for at most
// `limit`; returns them with the time each took from its connect.
std::vector<Scrape> scrape_all_at_once(int port, int count, std::chrono::milliseconds limit) {
  static const std::string kRequest =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  std::vector<Scrape> s(static_cast<size_t>(count));
  const auto t0 = Clock::now();
  for (auto& c : s) c.fd = open_connection(port);
  const auto deadline = t0 + limit;
  size_t left = s.size();
  std::vector<pollfd> p;
  while (left > 0 && Clock::now() < deadline) {
    p.clear();
    for (auto& c : s) {
      if (c.fd >= 0 && !c.done)
        p.push_back({c.fd, static_cast<short>(c.sent ? POLLIN : POLLOUT), 0});
    }
    if (::poll(p.data(), p.size(), 100) <= 0) continue;
    for (const auto& e : p) {
      if (e.revents == 0) continue;
      auto& c = *std::find_if(s.begin(), s.end(), [&](const Scrape& x) { return x.fd == e.fd; });
      if (!c.sent) {
        c.sent = ::send(c.fd, kRequest.data(), kRequest.size(), MSG_NOSIGNAL) ==
                 static_cast<ssize_t>(kRequest.size());
        if (!c.sent) c.done = true, --left;
        continue;
      }
      char buf[65536];
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c.reply.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        c.done = true;
        c.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        --left;
      }
    }
  }
  for (auto& c : s) {
    if (c.fd >= 0) ::close(c.fd);
  }
  return s;
}

// The value of the `meshtrain_step` gauge in an exposition, or -1.
double step_of(const std::string& text) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\\nmeshtrain_step(\\{[^}]*\\})? ([0-9.e+]+)")))
    return -1;
  return std::stod(m[2].str());
}

class ScrapeUnderLoad : public TrainRunTest {
 protected:
  void TearDown() override {
    for (int fd : idle_) ::close(fd);
  }
  meshtrain::testing::ChildProcess run_;  // killed and reaped when the test ends
  std::vector<int> idle_;
};

TEST_F(ScrapeUnderLoad, IdleConnectionsDoNotCostAScrape) {
  const int port = comm::Socket::listen("127.0.0.1", 0).local_port();
  const auto log = dir_ / "run.log";
  run_ = spawn(kMeshtrainBin + " " +
                   train_args(dir_ / "a", 100000, 0,
                              "--set train.log_interval=1000 --set train.metrics_port=" +
                                  std::to_string(port)),
               log.string());
  // The endpoint is up and the run is stepping.
  double first_step = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        const auto s = scrape_all_at_once(port, 1, 2s);
        first_step = step_of(s[0].reply);
        return first_step > 0;
      },
      60s))
      << file_bytes(log);
  for (int i = 0; i < 50; ++i) {
    const int fd = open_connection(port);
    ASSERT_GE(fd, 0);
    pollfd p{fd, POLLOUT, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    const std::string half = "GET /metr";
    ASSERT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(half.size()));
    idle_.push_back(fd);
  }
  const auto scrapes = scrape_all_at_once(port, 500, 10s);
  int ok = 0;
  double slowest = 0;
  for (size_t i = 0; i < scrapes.size(); ++i) {
    const Scrape& c = scrapes[i];
    const bool status_ok = c.reply.starts_with("HTTP/1.1 200");
    ok += status_ok && c.seconds >= 0 && c.seconds < 1.0;
    slowest = std::max(slowest, c.seconds);
    EXPECT_TRUE(status_ok) << "scrape " << i << " got: " << c.reply.substr(0, 80);
    EXPECT_GE(c.seconds, 0.0) << "scrape " << i << " never finished";
    EXPECT_LT(c.seconds, 1.0) << "scrape " << i;
    if (::testing::Test::HasFailure()) break;  // one is enough to see why
  }
  std::printf("500 scrapes beside 50 idle connections: %d within 1 s, slowest %.3f s\n", ok,
              slowest);
  // The run went on stepping meanwhile.
  double later_step = -1;
  EXPECT_TRUE(wait_until(
      [&] {
        later_step = step_of(scrape_all_at_once(port, 1, 2s)[0].reply);
        return later_step > first_step;
      },
      30s))
      << "step stayed at " << first_step << "\n"
      << file_bytes(log);
}

}  // namespace
}  // namespace meshtrain::testing
