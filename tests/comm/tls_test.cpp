// TLS on the store and the tcp transport, with real processes on loopback: the parent hosts a
// TcpStore server (TLS or plaintext), forked ranks join a tcp process group through it and
// all-reduce; under mutual TLS the results are the plaintext results (the reference). A peer with
// a certificate from another CA, an expired certificate, or no TLS at all is refused with one
// line naming its address, and a TLS client is refused by a plaintext server.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/tcp_store.h"
#include "meshtrain/comm/tcp_store_server.h"
#include "meshtrain/comm/tls.h"
#include "meshtrain/util/error.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::comm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
namespace mtt = ::meshtrain::testing;

// A CA with two node certificates, another CA with one, and an expired certificate of the first.
class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    CertOptions o;
    generate_ca(dir_.file("ca.pem"), dir_.file("ca.key"), o);
    generate_ca(dir_.file("other-ca.pem"), dir_.file("other-ca.key"), o);
    o.hosts = {"127.0.0.1", "localhost"};
    for (const char* n : {"a", "b"}) {
      generate_cert(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file(std::string(n) + ".pem"),
                    dir_.file(std::string(n) + ".key"), o);
    }
    generate_cert(dir_.file("other-ca.pem"), dir_.file("other-ca.key"), dir_.file("stranger.pem"),
                  dir_.file("stranger.key"), o);
    CertOptions old = o;
    old.not_before_s = -2 * 86400;
    old.not_after_s = -86400;
    generate_cert(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file("expired.pem"),
                  dir_.file("expired.key"), old);
  }

  TlsSettings settings(const std::string& node, const std::string& ca = "ca") const {
    TlsSettings s;
    s.enabled = true;
    s.cert = dir_.file(node + ".pem");
    s.key = dir_.file(node + ".key");
    s.ca = dir_.file(ca + ".pem");
    return s;
  }
  std::shared_ptr<const TlsContext> context(const std::string& node) const {
    return TlsContext::load(settings(node));
  }

  // A store server in this process (TLS with node a's certificate when `tls`).
  std::unique_ptr<TcpStoreServer> server(bool tls) const {
    TcpStoreServerOptions so;
    so.host = "127.0.0.1";
    so.token = AuthToken("tls-test-token");
    so.tls = tls ? context("a") : nullptr;
    so.handshake_timeout = 5s;
    return std::make_unique<TcpStoreServer>(so);
  }

  // Forks a process that connects a store client (with `node`'s certificate, or plaintext when
  // node is empty) to the server on `port` and sets a key; the error it met, if any, lands in
  // the returned file.
  std::string client_error(uint16_t port, const std::string& node, const std::string& tag) {
    const std::string out = dir_.file(tag + ".error");
    auto child = mtt::fork_child([&] {
      try {
        TcpStoreOptions o;
        o.timeout = 5s;
        o.token = AuthToken("tls-test-token");
        o.tls = node.empty() ? nullptr : context(node);
        TcpStore store("127.0.0.1", port, o);
        store.set_string("k", "v");
        return 0;
      } catch (const std::exception& e) {
        std::ofstream(out) << e.what();
        return 1;
      }
    });
    EXPECT_TRUE(child.started());
    const int status = child.wait();
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(WEXITSTATUS(status) != 0, !text.empty()) << text;
    return text;
  }

  mtt::TempDir dir_;
};

// The server counts a refusal after the refused client already learnt of it.
bool refused_once(const TcpStoreServer& srv) {
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (srv.num_refused() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  return srv.num_refused() == 1;
}

// One rank of a 2-rank tcp group that reaches the store on `port`: all-reduces float sums of
// several sizes (up to 4 MiB, so that large messages cross many TLS records) and writes the
// results to `out`.
int all_reduce_rank(int rank, uint16_t port, std::shared_ptr<const TlsContext> tls,
                    const std::string& out) {
  try {
    TcpStoreOptions so;
    so.timeout = 20s;
    so.token = AuthToken("tls-test-token");
    so.tls = tls;
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, so);
    ProcessGroupOptions po = testing::test_options("tcp");
    po.token = "tls-test-token";
    po.timeout = 30s;
    set_default_tls(tls);  // this process's transport
    auto pg = make_process_group("tcp", store, rank, 2, po);
    std::ofstream f(out, std::ios::binary);
    for (size_t count : {size_t{1}, size_t{1000}, size_t{70000}, size_t{1} << 20}) {
      std::vector<uint8_t> buf = testing::make_input(rank, count, DType::f32, ReduceOp::sum);
      pg->all_reduce(buf.data(), count, DType::f32)->wait();
      f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    }
    pg->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::ofstream(out + ".error") << e.what();
    return 1;
  }
}

TEST_F(Tls, StoreAndTcpAllReduceUnderMutualTlsMatchPlaintext) {
  std::string results[2];
  for (int tls = 0; tls < 2; ++tls) {
    auto srv = server(tls == 1);
    const uint16_t port = srv->port();
    std::vector<mtt::ChildProcess> ranks;
    for (int r = 0; r < 2; ++r) {
      const std::string out = dir_.file("out" + std::to_string(tls) + std::to_string(r));
      ranks.push_back(mtt::fork_child([&, r, out] {
        return all_reduce_rank(r, port, tls ? context(r == 0 ? "a" : "b") : nullptr, out);
      }));
      ASSERT_TRUE(ranks.back().started());
    }
    for (int r = 0; r < 2; ++r) {
      const std::string out = dir_.file("out" + std::to_string(tls) + std::to_string(r));
      const int status = ranks[r].wait();
      EXPECT_EQ(status, 0) << "tls " << tls << " rank " << r << ": "
                           << mtt::read_bytes(out + ".error");
    }
    EXPECT_EQ(srv->num_refused(), 0u);
    results[tls] = mtt::read_bytes(dir_.file("out" + std::to_string(tls) + "0"));
    EXPECT_EQ(results[tls], mtt::read_bytes(dir_.file("out" + std::to_string(tls) + "1")));
  }
  // The reference: what the library-independent reduction gives.
  std::string expected;
  for (size_t count : {size_t{1}, size_t{1000}, size_t{70000}, size_t{1} << 20}) {
    auto ref = testing::reference_reduce(2, count, DType::f32, ReduceOp::sum);
    expected.append(reinterpret_cast<const char*>(ref.data()), ref.size());
  }
  EXPECT_EQ(results[0].size(), expected.size());
  EXPECT_TRUE(results[0] == expected) << "plaintext differs from the reference";
  EXPECT_TRUE(results[1] == results[0]) << "TLS differs from plaintext";
}

TEST_F(Tls, PeerFromAnotherCaIsRefusedByName) {
  auto srv = server(true);
  const std::string err = client_error(srv->port(), "stranger", "stranger");
  EXPECT_NE(
      err.find("TLS handshake with 127.0.0.1:" + std::to_string(srv->port()) +
               " failed: it refused our certificate or TLS settings (tlsv1 alert unknown ca)"),
      std::string::npos)
      << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_TRUE(refused_once(*srv));
  EXPECT_EQ(srv->data().check({"k"}), false);

  // The server's side of it, on a socket: one line naming the peer's address and the reason.
  Socket listener = Socket::listen("127.0.0.1", 0);
  const uint16_t port = listener.local_port();
  auto child = mtt::fork_child([&] {
    try {
      Socket s = Socket::connect("127.0.0.1", port, Deadline(5s));
      s.start_tls(*context("stranger"), false, Deadline(5s));
      uint8_t b;
      s.recv_all(&b, 1, Deadline(5s));
    } catch (const std::exception&) {
    }
    return 0;
  });
  Socket s = listener.accept(Deadline(10s));
  const std::string peer = s.peer();
  try {
    s.start_tls(*TlsContext::load(settings("a")), true, Deadline(10s));
    ADD_FAILURE() << "the handshake passed";
  } catch (const AuthError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("refused connection from " + peer + ": ", 0), 0u) << what;
    EXPECT_NE(what.find("not from this job's CA"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  child.wait();
}

TEST_F(Tls, ExpiredCertificateIsRefused) {
  Socket listener = Socket::listen("127.0.0.1", 0);
  const uint16_t port = listener.local_port();
  const std::string client_out = dir_.file("client.error");
  auto child = mtt::fork_child([&] {
    try {
      Socket s = Socket::connect("127.0.0.1", port, Deadline(5s));
      s.start_tls(*context("expired"), false, Deadline(5s));
      uint8_t b;
      s.recv_all(&b, 1, Deadline(5s));
    } catch (const std::exception& e) {
      std::ofstream(client_out) << e.what();
    }
    return 0;
  });
  Socket s = listener.accept(Deadline(10s));
  const std::string peer = s.peer();
  try {
    s.start_tls(*context("a"), true, Deadline(10s));
    ADD_FAILURE() << "the handshake passed";
  } catch (const AuthError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what, "refused connection from " + peer + ": its certificate has expired");
  }
  child.wait();
  // The client learns it from the server's alert.
  const std::string client = mtt::read_bytes(client_out);
  EXPECT_NE(client.find("expired"), std::string::npos) << client;

  // Through the store: refused and counted.
  auto srv = server(true);
  const std::string err = client_error(srv->port(), "expired", "expired");
  EXPECT_NE(err.find("expired"), std::string::npos) << err;
  EXPECT_TRUE(refused_once(*srv));
}

TEST_F(Tls, PlaintextClientIsRefusedByATlsServer) {
  auto srv = server(true);
  const std::string err = client_error(srv->port(), "", "plain");
  EXPECT_FALSE(err.empty());
  EXPECT_TRUE(refused_once(*srv));

  Socket listener = Socket::listen("127.0.0.1", 0);
  const uint16_t port = listener.local_port();
  auto child = mtt::fork_child([&] {
    try {
      Socket s = Socket::connect("127.0.0.1", port, Deadline(5s));
      authenticate_client(s, AuthToken("tls-test-token"), Deadline(5s));
    } catch (const std::exception&) {
    }
    return 0;
  });
  Socket s = listener.accept(Deadline(10s));
  const std::string peer = s.peer();
  try {
    s.start_tls(*context("a"), true, Deadline(10s));
    ADD_FAILURE() << "the handshake passed";
  } catch (const AuthError& e) {
    EXPECT_EQ(std::string(e.what()), "refused connection from " + peer +
                                         ": it speaks plaintext, not TLS (is TLS on there?)");
  }
  child.wait();
}

TEST_F(Tls, TlsClientIsRefusedByAPlaintextServer) {
  auto srv = server(false);
  const std::string err = client_error(srv->port(), "b", "tls-to-plain");
  const std::string where = "127.0.0.1:" + std::to_string(srv->port());
  EXPECT_NE(err.find("TLS handshake with " + where + " failed"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_EQ(srv->data().check({"k"}), false);
}

TEST_F(Tls, TransportNamesTheRankWhosePeerRefusedIt) {
  // Rank 1 holds a certificate of another CA: rank 0's connection to it fails naming rank 1.
  auto srv = server(false);
  const uint16_t port = srv->port();
  std::vector<mtt::ChildProcess> ranks;
  for (int r = 0; r < 2; ++r) {
    const std::string out = dir_.file("refused" + std::to_string(r));
    ranks.push_back(mtt::fork_child([&, r, out] {
      try {
        TcpStoreOptions so;
        so.timeout = 20s;
        so.token = AuthToken("tls-test-token");
        so.tls = nullptr;
        auto store = std::make_shared<TcpStore>("127.0.0.1", port, so);
        ProcessGroupOptions po = testing::test_options("tcp");
        po.token = "tls-test-token";
        po.timeout = 5s;
        set_default_tls(context(r == 0 ? "a" : "stranger"));  // the transport only
        auto pg = make_process_group("tcp", store, r, 2, po);
        float x = 1;
        pg->all_reduce(&x, 1, DType::f32)->wait();
        return 0;
      } catch (const std::exception& e) {
        std::ofstream(out) << e.what();
        return 1;
      }
    }));
  }
  for (auto& r : ranks) EXPECT_NE(r.wait(), 0);
  // Each side names the other: rank 0 refused rank 1's certificate, rank 1 was refused by rank 0.
  const std::string e0 = mtt::read_bytes(dir_.file("refused0"));
  EXPECT_NE(e0.find("cannot connect to rank 1: TLS handshake with 127.0.0.1:"), std::string::npos)
      << e0;
  EXPECT_NE(e0.find("its certificate is not from this job's CA"), std::string::npos) << e0;
  const std::string e1 = mtt::read_bytes(dir_.file("refused1"));
  EXPECT_NE(e1.find("cannot connect to rank 0: TLS handshake with 127.0.0.1:"), std::string::npos)
      << e1;
  EXPECT_NE(e1.find("it refused our certificate"), std::string::npos) << e1;
}

TEST_F(Tls, MissingFileIsNamedWithItsKey) {
  TlsSettings s = settings("a");
  s.key = dir_.file("nowhere.key");
  s.key_from = "dist.tls_key";
  try {
    TlsContext::load(s);
    ADD_FAILURE() << "loaded";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()),
              "dist.tls_key = \"" + s.key + "\": cannot read the file: No such file or directory");
  }
}

}  // namespace
}  // namespace meshtrain::comm
