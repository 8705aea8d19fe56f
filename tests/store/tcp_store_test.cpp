// TcpStore specifics: many clients at once, authentication, hostile clients, shutdown.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/frame.h"
#include "meshtrain/comm/store_protocol.h"
#include "meshtrain/comm/tcp_store.h"
#include "meshtrain/comm/tcp_store_server.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<TcpStoreServer> start_server(const AuthToken& token) {
  TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.token = token;
  return std::make_unique<TcpStoreServer>(o);
}

// Server-side counters change on the server's thread just after the client sees the outcome.
template <typename Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 500 && !pred(); ++i) std::this_thread::sleep_for(10ms);
  return pred();
}

TcpStoreOptions client_options(const AuthToken& token, Duration timeout = 30s) {
  TcpStoreOptions o;
  o.token = token;
  o.timeout = timeout;
  return o;
}

TEST(TcpStoreTest, SixtyFourConcurrentClients) {
  AuthToken token(generate_token());
  auto server = start_server(token);
  constexpr int kClients = 64;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        TcpStore s("127.0.0.1", server->port(), client_options(token));
        s.set_string("rank/" + std::to_string(i), std::to_string(i * i));
        s.add("arrived", 1);
        std::vector<std::string> keys;
        for (int j = 0; j < kClients; ++j) keys.push_back("rank/" + std::to_string(j));
        s.wait(keys);
        int peer = (i + 1) % kClients;
        if (s.get_string("rank/" + std::to_string(peer)) != std::to_string(peer * peer)) {
          ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << i << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  TcpStore check("127.0.0.1", server->port(), client_options(token));
  EXPECT_EQ(check.add("arrived", 0), kClients);
  EXPECT_EQ(server->num_refused(), 0u);
}

TEST(TcpStoreTest, HostedServerOnEphemeralPort) {
  AuthToken token(generate_token());
  TcpStoreOptions o = client_options(token);
  o.is_server = true;
  TcpStore host("127.0.0.1", 0, o);
  ASSERT_NE(host.port(), 0);
  ASSERT_NE(host.server(), nullptr);
  TcpStore client("127.0.0.1", host.port(), client_options(token));
  host.set_string("hello", "world");
  EXPECT_EQ(client.get_string("hello"), "world");
}

TEST(TcpStoreTest, ConnectRetriesUntilServerComesUp) {
  // Find a free port, release it, and start the server on it a little after the client.
  uint16_t port = Socket::listen("127.0.0.1", 0).local_port();
  AuthToken token(generate_token());
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.token = token;
    server = std::make_unique<TcpStoreServer>(o);
  });
  TcpStore client("127.0.0.1", port, client_options(token, 20s));
  client.set_string("k", "v");
  starter.join();
  EXPECT_EQ(server->data().get("k", 1s), Bytes({'v'}));
}

TEST(TcpStoreTest, ConnectTimesOutWhenNoServer) {
  uint16_t port = Socket::listen("127.0.0.1", 0).local_port();
  EXPECT_THROW(TcpStore("127.0.0.1", port, client_options(AuthToken("t"), 300ms)), TimeoutError);
}

TEST(TcpStoreAuthTest, WrongTokenIsRefusedAndChangesNothing) {
  auto server = start_server(AuthToken(generate_token()));
  EXPECT_THROW(TcpStore("127.0.0.1", server->port(), client_options(AuthToken("wrong"))),
               AuthError);
  EXPECT_TRUE(eventually([&] { return server->num_refused() == 1; }));
  EXPECT_EQ(server->data().num_keys(), 0u);
  EXPECT_EQ(server->num_clients(), 0u);
}

// Many refused connections log one line per interval; the next line counts those in between.
TEST(TcpStoreAuthTest, RefusalsAreSummarisedNotLoggedOneByOne) {
  auto server = start_server(AuthToken(generate_token()));
  set_refusal_log_interval(std::chrono::hours(1));
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 30; ++i)
    EXPECT_THROW(TcpStore("127.0.0.1", server->port(), client_options(AuthToken("wrong"))),
                 AuthError);
  EXPECT_TRUE(eventually([&] { return server->num_refused() == 30; }));
  set_refusal_log_interval(std::chrono::milliseconds(0));
  EXPECT_THROW(TcpStore("127.0.0.1", server->port(), client_options(AuthToken("wrong"))),
               AuthError);
  EXPECT_TRUE(eventually([&] { return server->num_refused() == 31; }));
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_refusal_log_interval(std::chrono::seconds(10));
  size_t lines = 0;
  for (size_t p = err.find("refused connection from"); p != std::string::npos;
       p = err.find("refused connection from", p + 1))
    ++lines;
  // The first refusal of the first interval, then the one after it with the count of the rest
  // (an earlier test's refusal may have opened the first interval already).
  EXPECT_LE(lines, 2u) << err;
  EXPECT_GE(lines, 1u) << err;
  EXPECT_NE(err.find("refused since the last such line)"), std::string::npos) << err;
}

TEST(TcpStoreAuthTest, MissingTokenIsRefused) {
  auto server = start_server(AuthToken(generate_token()));
  try {
    TcpStore s("127.0.0.1", server->port(), client_options(AuthToken()));
    FAIL() << "client without a token was accepted";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("requires a job token"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server->data().num_keys(), 0u);
}

TEST(TcpStoreAuthTest, TokenedClientRefusesUntokenedServer) {
  auto server = start_server(AuthToken());
  EXPECT_THROW(TcpStore("127.0.0.1", server->port(), client_options(AuthToken("secret"))),
               AuthError);
  // Both sides without a token still talk.
  TcpStore ok("127.0.0.1", server->port(), client_options(AuthToken()));
  ok.set_string("a", "b");
  EXPECT_EQ(server->data().num_keys(), 1u);
}

TEST(TcpStoreAuthTest, ClientSkippingHandshakeCannotSetKeys) {
  auto server = start_server(AuthToken(generate_token()));
  Socket raw = Socket::connect("127.0.0.1", server->port(), Deadline(5s));
  StoreRequest r;
  r.op = StoreOp::kSet;
  r.keys = {"evil"};
  r.value = {1, 2, 3};
  // Sent as if the handshake did not exist; the server reads it as a hello and refuses.
  try {
    write_frame(raw, static_cast<uint16_t>(r.op), encode_store_request(r), Deadline(5s));
    write_frame(raw, static_cast<uint16_t>(r.op), encode_store_request(r), Deadline(5s));
  } catch (const CommError&) {
    // The server may already have closed the connection.
  }
  // The server closes the connection: reads end, possibly after the server's hello.
  uint8_t buf[256];
  Deadline d(5s);
  while (true) {
    size_t n = 0;
    try {
      n = raw.recv_some(buf, sizeof(buf), d);
    } catch (const CommError&) {
      break;  // connection reset
    }
    if (n == 0) break;
  }
  EXPECT_TRUE(eventually([&] { return server->num_refused() == 1; }));
  EXPECT_FALSE(server->data().check({"evil"}));
}

TEST(TcpStoreTest, GarbledRequestDropsOnlyThatClient) {
  AuthToken token(generate_token());
  auto server = start_server(token);
  Socket raw = Socket::connect("127.0.0.1", server->port(), Deadline(5s));
  authenticate_client(raw, token, Deadline(5s));
  Bytes junk = {0xff, 0xff, 0xff, 0xff, 0x01};  // a key length far beyond the payload
  write_frame(raw, static_cast<uint16_t>(StoreOp::kSet), junk, Deadline(5s));
  Frame reply = read_frame(raw, Deadline(5s));
  EXPECT_EQ(reply.type, static_cast<uint16_t>(StoreReply::kError));
  EXPECT_EQ(server->data().num_keys(), 0u);
  TcpStore good("127.0.0.1", server->port(), client_options(token));
  good.set_string("fine", "yes");
  EXPECT_EQ(good.get_string("fine"), "yes");
}

TEST(TcpStoreTest, StoppingServerFailsBlockedClient) {
  AuthToken token(generate_token());
  auto server = start_server(token);
  TcpStore client("127.0.0.1", server->port(), client_options(token, 60s));
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server->stop();
  });
  EXPECT_THROW(client.get("never"), Error);
  stopper.join();
}

TEST(TcpStoreTest, ServerSideTimeoutNamesKey) {
  AuthToken token(generate_token());
  auto server = start_server(token);
  TcpStore client("127.0.0.1", server->port(), client_options(token, 100ms));
  try {
    client.get("missing-key");
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing-key"), std::string::npos);
  }
  // The connection is still usable after a timeout.
  client.set_string("x", "y");
  EXPECT_EQ(client.get_string("x"), "y");
}

// A launcher hands its store a signalfd: a pending signal must end a request that waits on the
// server at once, not after the store's timeout (here a minute), and the client stays usable.
TEST(TcpStoreTest, WakeFdCutsABlockingRequestShort) {
  AuthToken token(generate_token());
  auto server = start_server(token);
  TcpStore client("127.0.0.1", server->port(), client_options(token, 60s));
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(wake, 0);
  client.set_wake_fd(wake);
  client.set_string("before", "1");  // an idle wake-up descriptor changes nothing
  const uint64_t one = 1;
  ASSERT_EQ(::write(wake, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(client.get("never"), InterruptedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  uint64_t count = 0;
  ASSERT_EQ(::read(wake, &count, sizeof(count)), static_cast<ssize_t>(sizeof(count)));
  EXPECT_EQ(client.get_string("before"), "1");  // reconnects
  ::close(wake);
}

}  // namespace
}  // namespace meshtrain::comm
