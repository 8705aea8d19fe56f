// A real Prometheus server (Debian's `prometheus`) scrapes a live metrics endpoint that a
// training loop's metric set is updating, and PromQL queries over the scraped data return the
// expected series with our job/rank/node labels, including a step-latency quantile. Skipped, with
// the reason, when the prometheus binary is absent.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "meshtrain/obs/metrics_server.h"
#include "meshtrain/obs/training_metrics.h"
#include "tests/obs/prometheus_harness.h"
#include "tests/support/capability.h"

namespace meshtrain::obs {
namespace {

namespace fs = std::filesystem;

using testing::query;

TEST(PrometheusScrapeTest, PrometheusScrapesAndQueriesOurSeries) {
  MT_SKIP_UNLESS("prometheus", testing::prometheus_available(),
                 "prometheus not installed (Debian prometheus)");

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
  testing::PrometheusServer prom(dir, {"127.0.0.1:" + std::to_string(servers[0]->port()),
                                       "127.0.0.1:" + std::to_string(servers[1]->port())});
  ASSERT_TRUE(prom.started());
  httplib::Client cli("127.0.0.1", prom.port());
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
  prom.stop();

  ASSERT_EQ(loss.size(), 2u) << "no scraped series; prometheus log: " << prom.log_path();
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
