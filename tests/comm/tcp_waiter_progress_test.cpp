// The tcp transport lets the thread that waits for a receive read the socket itself (small
// messages then cost no thread switches), while frames that arrive before their receive is
// posted and receives nobody waits on (p2p Work callbacks) still complete. Two transports in one
// process, over an in-memory store.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/transport/tcp_transport.h"

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;

struct Pair {
  Pair() {
    auto store = std::make_shared<HashStore>();
    store->set_timeout(10s);
    const std::string token = generate_token();
    for (int r = 0; r < 2; ++r) {
      TcpTransportOptions o;
      o.key_prefix = "waiter/";
      o.token = AuthToken(token);
      t[r] = std::make_unique<TcpTransport>(store, r, 2, o);
    }
  }
  std::unique_ptr<TcpTransport> t[2];
};

SteadyTime in(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

// Several small exchanges, each side sending first and then waiting on its receive.
void ping_pong(Pair& p, int rounds) {
  auto side = [&](int r) {
    for (int i = 0; i < rounds; ++i) {
      auto out = testing::byte_pattern(4096, static_cast<uint8_t>(r + i));
      std::vector<uint8_t> back(4096);
      auto s = p.t[r]->post_send(1 - r, 100 + i, out.data(), out.size(), in(5s));
      auto rv = p.t[r]->post_recv(1 - r, 100 + i, back.data(), back.size(), in(5s));
      wait_all({s, rv});
      ASSERT_EQ(back, testing::byte_pattern(4096, static_cast<uint8_t>(1 - r + i)));
    }
  };
  std::thread other([&] { side(1); });
  side(0);
  other.join();
}

TEST(TcpWaiterProgress, FramesThatArriveFirstAreMatchedInAnyOrder) {
  Pair p;
  ping_pong(p, 20);
  std::vector<std::vector<uint8_t>> sent;
  std::vector<RequestPtr> sends;
  for (uint64_t tag = 1; tag <= 3; ++tag)
    sent.push_back(testing::byte_pattern(4096 * tag, uint8_t(tag)));
  for (uint64_t tag = 1; tag <= 3; ++tag)
    sends.push_back(p.t[1]->post_send(0, tag, sent[tag - 1].data(), sent[tag - 1].size(), in(5s)));
  wait_all(sends);  // they fit the socket buffers: all three are on their way before any receive
  for (uint64_t tag = 3; tag >= 1; --tag) {
    std::vector<uint8_t> got(4096 * tag);
    p.t[0]->post_recv(1, tag, got.data(), got.size(), in(5s))->wait();
    EXPECT_EQ(got, sent[tag - 1]) << "tag " << tag;
  }
}

// After waiters drove rank 0's socket, a receive that only has a completion callback (as a p2p
// recv's Work does) must still be read by the I/O thread. Its deadline is below the I/O
// thread's 200 ms poll cap: a socket the I/O thread had left to the waiters and not taken back
// would make it miss it.
TEST(TcpWaiterProgress, AWatchedReceiveCompletesWithoutAWaiter) {
  Pair p;
  for (int round = 0; round < 5; ++round) {
    ping_pong(p, 20);
    std::vector<uint8_t> got(4096);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    auto rv = p.t[0]->post_recv(1, 7, got.data(), got.size(), in(150ms));
    p.t[0]->watch(rv);
    rv->on_completion([&](std::exception_ptr e) {
      std::lock_guard lock(mu);
      error = e;
      done = true;
      cv.notify_all();
    });
    const auto msg = testing::byte_pattern(4096, 9);
    p.t[1]->post_send(0, 7, msg.data(), msg.size(), in(3s))->wait();
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return done; }));
    std::string why;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    EXPECT_FALSE(error) << "round " << round << ": " << why;
    EXPECT_EQ(got, msg);
  }
}

}  // namespace
}  // namespace meshtrain::comm
