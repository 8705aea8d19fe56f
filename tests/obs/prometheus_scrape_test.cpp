// A real Prometheus server (Debian's `prometheus`) scrapes a live metrics endpoint that a
// training loop's metric set is updating, and PromQL queries over the scraped data return the
// expected series with our job/rank/node labels, including a step-latency quantile. Skipped, with
// the reason, when the prometheus binary is absent.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "meshtrain/obs/metrics_server.h"
#include "meshtrain/obs/training_metrics.h"

extern char** environ;

namespace meshtrain::obs {
namespace {

namespace fs = std::filesystem;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The `result` array of an instant query, or an empty array.
nlohmann::json query(httplib::Client& cli, const std::string& promql) {
  auto res = cli.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return nlohmann::json::array();
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json::array();
  return j["data"]["result"];
}

TEST(PrometheusScrapeTest, PrometheusScrapesAndQueriesOurSeries) {
  const char* prom = "/usr/bin/prometheus";
  if (::access(prom, X_OK) != 0) GTEST_SKIP() << "prometheus not installed (Debian prometheus)";

  // Two "ranks", each with its own registry and endpoint, as two workers of a node would have.
  std::vector<std::unique_ptr<Registry>> regs;
  std::vector<std::unique_ptr<TrainingMetrics>> tms;
  std::vector<std::unique_ptr<MetricsServer>> servers;
  for (int r = 0; r < 2; ++r) {
    regs.push_back(std::make_unique<Registry>(
        Labels{{"job", "scrape-test"}, {"rank", std::to_string(r)}, {"node", "n0"}}));
    TrainingMetricsOptions o;
    o.rank = r;
    o.world_size = 2;
    o.tokens_per_step = 1024;
    o.samples_per_step = 8;
    tms.push_back(std::make_unique<TrainingMetrics>(*regs.back(), o));
    servers.push_back(std::make_unique<MetricsServer>(*regs.back(), MetricsServerOptions{}));
  }
  std::atomic<bool> stop{false};
  std::thread steps([&] {
    for (int64_t s = 1; !stop.load(); ++s) {
      for (int r = 0; r < 2; ++r) {
        PhaseClock phases;
        phases.end(Phase::kData);
        nlohmann::json row;
        // Rank 1 is the slow one: every step takes 0.2 s against rank 0's 0.05 s.
        tms[r]->on_step({.step = s,
                         .loss = 3.0 - 0.001 * s,
                         .lr = 1e-3,
                         .grad_norm = 1,
                         .step_s = r == 0 ? 0.05 : 0.2},
                        phases, row);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  const auto dir = fs::temp_directory_path() / ("mt_prom_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream cfg(dir / "prometheus.yml");
    cfg << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n  - job_name: meshtrain\n    honor_labels: true\n"
        << "    static_configs:\n      - targets: ['127.0.0.1:" << servers[0]->port()
        << "', '127.0.0.1:" << servers[1]->port() << "']\n";
  }
  const int web_port = free_port();
  const std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(web_port);
  const std::string config = "--config.file=" + (dir / "prometheus.yml").string();
  const std::string storage = "--storage.tsdb.path=" + (dir / "data").string();
  std::vector<std::string> argv_s{prom, config, storage, listen, "--log.level=warn"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = (dir / "prometheus.log").string();
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, prom, &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);

  httplib::Client cli("127.0.0.1", web_port);
  cli.set_connection_timeout(1, 0);
  nlohmann::json loss, slow_p50, fast_p50, up;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    up = query(cli, "up{job=\"scrape-test\"}");
    loss = query(cli, "meshtrain_loss{job=\"scrape-test\"}");
    slow_p50 =
        query(cli, "histogram_quantile(0.5, meshtrain_step_duration_seconds_bucket{rank=\"1\"})");
    fast_p50 =
        query(cli, "histogram_quantile(0.5, meshtrain_step_duration_seconds_bucket{rank=\"0\"})");
    if (loss.size() == 2 && slow_p50.size() == 1 && fast_p50.size() == 1) break;
  }
  stop = true;
  steps.join();
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);

  ASSERT_EQ(loss.size(), 2u) << "no scraped series; prometheus log: " << log;
  std::set<std::string> ranks;
  for (const auto& s : loss) {
    EXPECT_EQ(s["metric"]["job"], "scrape-test");
    EXPECT_EQ(s["metric"]["node"], "n0");
    ranks.insert(s["metric"]["rank"].get<std::string>());
    EXPECT_LT(std::stod(s["value"][1].get<std::string>()), 3.0);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
  ASSERT_EQ(slow_p50.size(), 1u);
  ASSERT_EQ(fast_p50.size(), 1u);
  const double slow = std::stod(slow_p50[0]["value"][1].get<std::string>());
  const double fast = std::stod(fast_p50[0]["value"][1].get<std::string>());
  // Each estimate lies in the bucket that holds its true value (x1.5 buckets).
  EXPECT_GT(slow, 0.2 / 1.5);
  EXPECT_LE(slow, 0.2 * 1.5);
  EXPECT_GT(fast, 0.05 / 1.5);
  EXPECT_LE(fast, 0.05 * 1.5);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain::obs
