// meshrun's node endpoint: the merged text of several workers parses strictly (each family
// declared once, every worker's samples kept), and a live aggregator serves two live worker
// endpoints plus which of them answered.
#include "meshtrain/obs/metrics_aggregator.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <set>

#include "meshtrain/obs/metrics_server.h"
#include "meshtrain/util/error.h"
#include "tests/obs/exposition_parser.h"
#include "tests/obs/prometheus_harness.h"

namespace meshtrain::obs {
namespace {

std::unique_ptr<Registry> worker_registry(int rank) {
  auto r = std::make_unique<Registry>(
      Labels{{"job", "agg"}, {"rank", std::to_string(rank)}, {"node", "n0"}});
  r->counter("meshtrain_steps_total", "Steps.").inc(10 + rank);
  r->histogram("meshtrain_step_duration_seconds", "Step time.", {0.1, 1.0}).observe(0.5);
  return r;
}

TEST(MetricsAggregatorTest, MergedTextDeclaresEachFamilyOnceAndKeepsEveryWorker) {
  auto a = worker_registry(0), b = worker_registry(1);
  const std::string merged = merge_expositions({a->render(), b->render()});
  const auto e = testing::parse_exposition(merged);  // throws on a repeated TYPE or a split
  std::set<std::string> ranks;
  int buckets = 0;
  for (const auto& s : e.samples) {
    if (s.name == "meshtrain_steps_total") ranks.insert(s.labels.at("rank"));
    if (s.name == "meshtrain_step_duration_seconds_bucket") ++buckets;
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(buckets, 2 * 3);  // 0.1, 1, +Inf per worker
  size_t types = 0;
  for (size_t p = 0; (p = merged.find("# TYPE meshtrain_steps_total", p)) != std::string::npos; ++p)
    ++types;
  EXPECT_EQ(types, 1u);
}

TEST(MetricsAggregatorTest, ServesLiveWorkersAndReportsTheMissingOne) {
  auto a = worker_registry(0), b = worker_registry(1);
  MetricsServer sa(*a, {}), sb(*b, {});
  const int dead = testing::free_port();  // nothing listens here
  MetricsAggregatorOptions o;
  o.targets = {"127.0.0.1:" + std::to_string(sa.port()), "127.0.0.1:" + std::to_string(sb.port()),
               "127.0.0.1:" + std::to_string(dead)};
  o.fetch_timeout_ms = 500;
  MetricsAggregator agg(o);
  httplib::Client cli("127.0.0.1", agg.port());
  auto res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const auto e = testing::parse_exposition(res->body);
  std::set<std::string> ranks;
  std::map<std::string, double> up;
  for (const auto& s : e.samples) {
    if (s.name == "meshtrain_steps_total") ranks.insert(s.labels.at("rank"));
    if (s.name == "meshtrain_aggregator_target_up") up[s.labels.at("target")] = s.value;
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(up[o.targets[0]], 1);
  EXPECT_EQ(up[o.targets[2]], 0);
  EXPECT_EQ(cli.Post("/metrics", "x", "text/plain")->status, 404);  // read-only
}

TEST(MetricsAggregatorTest, TakenPortIsAClearError) {
  auto a = worker_registry(0);
  MetricsServer sa(*a, {});
  MetricsAggregatorOptions o;
  o.port = sa.port();
  try {
    MetricsAggregator agg(o);
    FAIL() << "bound a taken port";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(sa.port())), std::string::npos);
  }
}

}  // namespace
}  // namespace meshtrain::obs
