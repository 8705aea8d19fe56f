// The scrape endpoints over TLS (dist.tls, meshrun --tls-*): a client with a certificate of the
// job's CA reads /metrics over https; one with another CA's certificate, an expired one or
// plaintext gets no reply and the endpoint says so in one line; meshrun's node endpoint fetches
// the workers' endpoints over TLS with its own certificate.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/tls.h"
#include "meshtrain/obs/metrics_aggregator.h"
#include "meshtrain/obs/scrape_http_server.h"
#include "meshtrain/util/error.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wait.h"

namespace meshtrain::obs {
namespace {

using namespace std::chrono_literals;
using comm::TlsContext;
using comm::TlsSettings;

class MetricsTls : public ::testing::Test {
 protected:
  void SetUp() override {
    comm::CertOptions o;
    comm::generate_ca(dir_.file("ca.pem"), dir_.file("ca.key"), o);
    comm::generate_ca(dir_.file("other-ca.pem"), dir_.file("other-ca.key"), o);
    o.hosts = {"127.0.0.1", "localhost"};
    for (const char* n : {"worker", "scraper", "node"})
      comm::generate_cert(dir_.file("ca.pem"), dir_.file("ca.key"),
                          dir_.file(std::string(n) + ".pem"), dir_.file(std::string(n) + ".key"),
                          o);
    comm::generate_cert(dir_.file("other-ca.pem"), dir_.file("other-ca.key"),
                        dir_.file("stranger.pem"), dir_.file("stranger.key"), o);
    comm::CertOptions old = o;
    old.not_before_s = -2 * 86400;
    old.not_after_s = -86400;
    comm::generate_cert(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file("expired.pem"),
                        dir_.file("expired.key"), old);
  }
  std::shared_ptr<const TlsContext> context(const std::string& node) const {
    TlsSettings s;
    s.enabled = true;
    s.cert = dir_.file(node + ".pem");
    s.key = dir_.file(node + ".key");
    s.ca = dir_.file("ca.pem");
    return TlsContext::load(s);
  }
  // A worker-like endpoint serving one metric line.
  std::unique_ptr<ScrapeHttpServer> endpoint(std::shared_ptr<const TlsContext> tls, int* port) {
    auto server = std::make_unique<ScrapeHttpServer>(
        [](const std::string&, const std::string& path) {
          return HttpReply{200, "text/plain",
                           "# TYPE probe gauge\nprobe{path=\"" + path + "\"} 1\n"};
        },
        ScrapeHttpServerOptions{.request_timeout = 5000ms, .tls = std::move(tls)});
    *port = server->bind("127.0.0.1", 0);
    server->start();
    return server;
  }
  // What a client gets for GET /metrics: over TLS with `tls`, else plaintext. Whatever the
  // exchange ends in (a refusal, a closed connection), the bytes received so far.
  static std::string get(int port, const TlsContext* tls) {
    std::string reply;
    try {
      const comm::Deadline deadline(10s);
      comm::Socket s = comm::Socket::connect("127.0.0.1", static_cast<uint16_t>(port), deadline);
      if (tls != nullptr) s.start_tls(*tls, false, deadline, /*server_speaks_first=*/false);
      const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
      s.send_all(request.data(), request.size(), deadline);
      char buf[4096];
      while (const size_t n = s.recv_some(buf, sizeof(buf), deadline)) reply.append(buf, n);
    } catch (const Error&) {
    }
    return reply;
  }

  meshtrain::testing::TempDir dir_;
};

TEST_F(MetricsTls, AClientOfTheJobsCaReadsTheEndpointOverTls) {
  int port = 0;
  auto server = endpoint(context("worker"), &port);
  ASSERT_GT(port, 0);
  const std::string reply = get(port, context("scraper").get());
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("probe{path=\"/metrics\"} 1"), std::string::npos) << reply;
}

TEST_F(MetricsTls, OtherCaExpiredOrPlaintextClientsGetNoReplyAndALine) {
  int port = 0;
  auto server = endpoint(context("worker"), &port);
  ASSERT_GT(port, 0);
  // The client trusts the endpoint; the endpoint refuses the client's certificate.
  TlsSettings stranger;
  stranger.enabled = true;
  stranger.cert = dir_.file("stranger.pem");
  stranger.key = dir_.file("stranger.key");
  stranger.ca = dir_.file("ca.pem");
  ::testing::internal::CaptureStderr();
  const std::string refused = get(port, TlsContext::load(stranger).get());
  // The client may see the connection end before the endpoint has written its line.
  const bool counted = meshtrain::testing::wait_until(
      [&] { return server->refused_connections() == 1; }, std::chrono::seconds(10));
  const std::string line = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(counted);
  EXPECT_EQ(refused.find("HTTP/"), std::string::npos) << refused;
  EXPECT_NE(line.find("metrics endpoint: refused 127.0.0.1:"), std::string::npos) << line;
  EXPECT_NE(line.find("certificate of the job's CA"), std::string::npos) << line;

  TlsSettings expired = stranger;
  expired.cert = dir_.file("expired.pem");
  expired.key = dir_.file("expired.key");
  EXPECT_EQ(get(port, TlsContext::load(expired).get()).find("HTTP/"), std::string::npos);
  const std::string plain = get(port, nullptr);
  EXPECT_EQ(plain.find("HTTP/"), std::string::npos) << plain;
  // At most one such line a minute per endpoint: a fresh one names a plaintext scraper.
  int other_port = 0;
  auto other = endpoint(context("worker"), &other_port);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(get(other_port, nullptr).find("HTTP/"), std::string::npos);
  const bool plain_counted = meshtrain::testing::wait_until(
      [&] { return other->refused_connections() == 1; }, std::chrono::seconds(10));
  const std::string plain_line = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(plain_counted);
  EXPECT_NE(plain_line.find("it speaks plaintext (http://), not TLS"), std::string::npos)
      << plain_line;
  // The endpoint still serves the job's clients.
  EXPECT_EQ(get(port, context("scraper").get()).rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  // Every connection, refused or served, is closed (the reply's end reaches the client just
  // before the endpoint forgets the connection).
  EXPECT_TRUE(meshtrain::testing::wait_until([&] { return server->open_connections() == 0; },
                                             std::chrono::seconds(10)));
}

TEST_F(MetricsTls, TheNodeEndpointFetchesTlsWorkersWithItsOwnCertificate) {
  int worker_port = 0;
  auto worker = endpoint(context("worker"), &worker_port);
  MetricsAggregatorOptions o;
  o.targets = {"127.0.0.1:" + std::to_string(worker_port)};
  o.tls = context("node");
  MetricsAggregator node(o);
  EXPECT_EQ(node.url().rfind("https://127.0.0.1:", 0), 0u) << node.url();
  const std::string merged = node.collect();
  EXPECT_NE(merged.find("probe{path=\"/metrics\"} 1"), std::string::npos) << merged;
  EXPECT_NE(merged.find("meshtrain_aggregator_target_up{target=\"" + o.targets[0] + "\"} 1"),
            std::string::npos)
      << merged;
  // Served over TLS too, to a scraper of the job's CA.
  const std::string scraped = get(node.port(), context("scraper").get());
  EXPECT_NE(scraped.find("probe{path=\"/metrics\"} 1"), std::string::npos) << scraped;

  // Without TLS the same worker does not answer it.
  MetricsAggregatorOptions plain = o;
  plain.tls = nullptr;
  MetricsAggregator plain_node(plain);
  EXPECT_NE(plain_node.collect().find("meshtrain_aggregator_target_up{target=\"" + o.targets[0] +
                                      "\"} 0"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain::obs
