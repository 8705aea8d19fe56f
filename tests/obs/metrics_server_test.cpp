// The /metrics endpoint over loopback: served and parsed, read-only, a taken port reported
// clearly (or replaced by a free one when configured), and a run that cannot bind keeps going.
#include "meshtrain/obs/metrics_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>

#include "meshtrain/obs/run_observer.h"
#include "meshtrain/util/error.h"
#include "tests/obs/exposition_parser.h"

namespace meshtrain::obs {
namespace {

TEST(MetricsServerTest, ServesTheRegistryOverLoopback) {
  Registry reg({{"job", "t"}, {"rank", "1"}, {"node", "n"}});
  reg.counter("meshtrain_steps_total", "Steps.").inc(7);
  MetricsServer server(reg, {});
  ASSERT_GT(server.port(), 0);
  httplib::Client cli("127.0.0.1", server.port());
  auto res = cli.Get("/metrics");
  ASSERT_TRUE(res) << "no response from " << server.url();
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
  auto e = testing::parse_exposition(res->body);
  ASSERT_EQ(e.find("meshtrain_steps_total").size(), 1u);
  EXPECT_EQ(e.find("meshtrain_steps_total")[0].value, 7);
  EXPECT_EQ(e.find("meshtrain_steps_total")[0].labels.at("rank"), "1");
  EXPECT_GT(e.find("process_resident_memory_bytes")[0].value, 0);
  // Updates show on the next scrape.
  reg.counter("meshtrain_steps_total", "Steps.").inc();
  auto again = testing::parse_exposition(cli.Get("/metrics")->body);
  EXPECT_EQ(again.find("meshtrain_steps_total")[0].value, 8);
  // Read-only: nothing else is served.
  EXPECT_EQ(cli.Get("/")->status, 404);
  EXPECT_EQ(cli.Post("/metrics", "x", "text/plain")->status, 404);
  server.stop();
  EXPECT_FALSE(httplib::Client("127.0.0.1", server.port()).Get("/metrics"));
}

TEST(MetricsServerTest, PortInUseIsAClearErrorOrFallsBack) {
  Registry reg;
  MetricsServer first(reg, {});
  MetricsServerOptions o;
  o.port = first.port();
  try {
    MetricsServer second(reg, o);
    FAIL() << "a second server bound port " << o.port;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(o.port)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  o.fallback_to_ephemeral = true;
  MetricsServer fallback(reg, o);
  EXPECT_NE(fallback.port(), first.port());
  EXPECT_TRUE(httplib::Client("127.0.0.1", fallback.port()).Get("/metrics"));
}

TEST(MetricsServerTest, ARunWhoseEndpointCannotBindKeepsGoing) {
  Registry reg;
  MetricsServer taken(reg, {});
  RunObserverOptions o;
  o.metrics = MetricsServerOptions{"127.0.0.1", taken.port(), false};
  Registry run_reg;
  RunObserver observer(run_reg, o);  // must not throw
  EXPECT_EQ(observer.metrics_url(), "");
  PhaseClock phases;
  phases.end(Phase::kData);
  nlohmann::json row{{"step", 1}};
  observer.on_step({.step = 1, .loss = 2.0, .lr = 1e-3, .grad_norm = 1, .step_s = 0.1}, phases,
                   row);
  EXPECT_TRUE(row.contains("data_s"));
  EXPECT_NE(run_reg.render().find("meshtrain_steps_total 1\n"), std::string::npos);
}

TEST(MetricsServerTest, EnvironmentSelectsPortPlusLocalRank) {
  ::setenv("MESHTRAIN_METRICS_PORT", "9400", 1);
  ::setenv("MESHTRAIN_METRICS_HOST", "0.0.0.0", 1);
  auto o = metrics_server_options_from_env(3);
  ::setenv("MESHTRAIN_METRICS_PORT", "nope", 1);
  EXPECT_THROW(metrics_server_options_from_env(3), ValueError);
  ::unsetenv("MESHTRAIN_METRICS_PORT");
  ::unsetenv("MESHTRAIN_METRICS_HOST");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->port, 9403);
  EXPECT_EQ(o->host, "0.0.0.0");
  EXPECT_FALSE(metrics_server_options_from_env(3).has_value());
}

}  // namespace
}  // namespace meshtrain::obs
