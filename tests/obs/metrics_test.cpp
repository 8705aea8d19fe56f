// The registry and its text rendering: checked by a strict parser (exposition_parser.h), by
// Prometheus's own promtool when it is installed, on known histogram inputs, and under concurrent
// updates from 8 threads.
#include "meshtrain/obs/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "meshtrain/util/error.h"
#include "tests/obs/exposition_parser.h"
#include "tests/support/capability.h"

namespace meshtrain::obs {
namespace {

using testing::parse_exposition;

TEST(MetricsTest, RendersAStrictlyValidExposition) {
  Registry reg({{"job", "unit"}, {"rank", "3"}, {"node", "host-a"}});
  reg.counter("meshtrain_collectives_total", "Collectives.", {{"op", "all_reduce"}}).inc(5);
  reg.counter("meshtrain_collectives_total", "Collectives.", {{"op", "broadcast"}}).inc(2);
  reg.gauge("meshtrain_loss", "Loss with a \\ backslash\nand a newline.").set(2.5);
  // A label value that needs every escape.
  reg.gauge("meshtrain_info", "Info.", {{"path", "C:\\dir \"quoted\"\nnext"}}).set(1);
  Histogram& h = reg.histogram("meshtrain_step_duration_seconds", "Steps.", {0.1, 0.5, 1.0});
  for (double v : {0.05, 0.2, 0.3, 0.7, 3.0}) h.observe(v);
  reg.gauge("meshtrain_nan", "Not a number.").set(std::nan(""));
  reg.gauge("meshtrain_inf", "Infinite.").set(-INFINITY);

  const std::string text = reg.render();
  auto e = parse_exposition(text);
  EXPECT_EQ(e.types.at("meshtrain_collectives_total"), "counter");
  EXPECT_EQ(e.types.at("meshtrain_step_duration_seconds"), "histogram");
  EXPECT_EQ(e.helps.at("meshtrain_loss"), "Loss with a \\\\ backslash\\nand a newline.");
  auto ar = e.find("meshtrain_collectives_total", {{"op", "all_reduce"}});
  ASSERT_EQ(ar.size(), 1u);
  EXPECT_EQ(ar[0].value, 5);
  EXPECT_EQ(ar[0].labels.at("job"), "unit");
  EXPECT_EQ(ar[0].labels.at("rank"), "3");
  EXPECT_EQ(ar[0].labels.at("node"), "host-a");
  auto info = e.find("meshtrain_info");
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].labels.at("path"), "C:\\dir \"quoted\"\nnext");
  EXPECT_TRUE(std::isnan(e.find("meshtrain_nan")[0].value));
  EXPECT_EQ(e.find("meshtrain_inf")[0].value, -INFINITY);
  // Buckets are cumulative, `le` rendered last.
  auto b = e.find("meshtrain_step_duration_seconds_bucket");
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(e.find("meshtrain_step_duration_seconds_bucket", {{"le", "0.1"}})[0].value, 1);
  EXPECT_EQ(e.find("meshtrain_step_duration_seconds_bucket", {{"le", "0.5"}})[0].value, 3);
  EXPECT_EQ(e.find("meshtrain_step_duration_seconds_bucket", {{"le", "1"}})[0].value, 4);
  EXPECT_EQ(e.find("meshtrain_step_duration_seconds_bucket", {{"le", "+Inf"}})[0].value, 5);
  EXPECT_NE(text.find("le=\"+Inf\"} 5\n"), std::string::npos);
  EXPECT_DOUBLE_EQ(e.find("meshtrain_step_duration_seconds_sum")[0].value,
                   0.05 + 0.2 + 0.3 + 0.7 + 3.0);
  EXPECT_EQ(e.find("meshtrain_step_duration_seconds_count")[0].value, 5);
}

TEST(MetricsTest, ParserRejectsBrokenText) {
  // The checker must be able to fail for the test above to mean anything.
  EXPECT_THROW(parse_exposition("a{b=\"c\"} 1"), testing::ParseError);  // no final newline
  EXPECT_THROW(parse_exposition("a{b=\"c\\x\"} 1\n"), testing::ParseError);
  EXPECT_THROW(parse_exposition("1a 1\n"), testing::ParseError);
  EXPECT_THROW(parse_exposition("a 1\nb 1\na 2\n"), testing::ParseError);
  EXPECT_THROW(parse_exposition("a 1\na 2\n"), testing::ParseError);
  EXPECT_THROW(
      parse_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                       "h_sum 1\nh_count 1\n"),
      testing::ParseError);
  EXPECT_THROW(parse_exposition("a one\n"), testing::ParseError);
}

TEST(MetricsTest, NamingRulesAreEnforced) {
  Registry reg;
  EXPECT_THROW(reg.counter("meshtrain_steps", "no _total"), ValueError);
  EXPECT_THROW(reg.gauge("meshtrain_steps_total", "gauge with _total"), ValueError);
  EXPECT_THROW(reg.gauge("9lives", "bad name"), ValueError);
  EXPECT_THROW(reg.gauge("ok_name", "bad label", {{"__reserved", "x"}}), ValueError);
  EXPECT_THROW(reg.histogram("h_seconds", "le label", {1.0}, {{"le", "x"}}), ValueError);
  EXPECT_THROW(reg.histogram("h_seconds", "unsorted", {2.0, 1.0}), Error);
  reg.gauge("meshtrain_loss", "loss");
  EXPECT_THROW(reg.counter("meshtrain_loss", "type clash"), ValueError);
  reg.gauge("meshtrain_phase_seconds", "p", {{"phase", "data"}});
  EXPECT_THROW(reg.gauge("meshtrain_phase_seconds", "p", {{"other", "x"}}), ValueError);
  EXPECT_THROW(reg.gauge("meshtrain_phase_seconds", "p"), ValueError);
  Registry with_job(Labels{{"job", "j"}});
  EXPECT_THROW(with_job.gauge("g", "clash with a constant label", {{"job", "x"}}), ValueError);
}

TEST(MetricsTest, SameNameAndLabelsGiveTheSameObject) {
  Registry reg;
  Counter& a = reg.counter("x_total", "x", {{"op", "a"}});
  Counter& b = reg.counter("x_total", "x", {{"op", "b"}});
  EXPECT_NE(&a, &b);
  EXPECT_EQ(&a, &reg.counter("x_total", "x", {{"op", "a"}}));
  a.inc(2);
  a.inc(-5);   // ignored: counters never go down
  a.inc(NAN);  // ignored
  EXPECT_EQ(reg.counter("x_total", "x", {{"op", "a"}}).value(), 2);
}

TEST(MetricsTest, HistogramBucketsAndQuantilesOnKnownInputs) {
  Histogram h({1, 2, 4, 8});
  for (double v : {0.5, 1.0, 1.5, 3.0, 3.0, 7.0, 100.0}) h.observe(v);
  HistogramSnapshot s = h.snapshot();
  // (..1]: 0.5, 1.0 (bounds are inclusive); (1,2]: 1.5; (2,4]: 3, 3; (4,8]: 7; +Inf: 100.
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{2, 1, 2, 1, 1}));
  EXPECT_EQ(s.count, 7u);
  EXPECT_DOUBLE_EQ(s.sum, 116.0);
  // Rank q*7 located by cumulative counts 2, 3, 5, 6, 7 and interpolated inside the bucket.
  EXPECT_DOUBLE_EQ(s.quantile(0.5), 2.0 + 2.0 * (3.5 - 3.0) / 2.0);
  EXPECT_DOUBLE_EQ(s.quantile(0.2), 0.0 + 1.0 * (1.4 / 2.0));
  EXPECT_DOUBLE_EQ(s.quantile(0.8), 4.0 + 4.0 * (5.6 - 5.0) / 1.0);
  EXPECT_DOUBLE_EQ(s.quantile(0.99), 8.0);  // lands in +Inf: the highest finite bound
  EXPECT_TRUE(std::isnan(Histogram({1.0}).quantile(0.5)));
}

TEST(MetricsTest, QuantilesOfAUniformSampleAreWithinOneBucket) {
  Histogram h(linear_buckets(0.01, 0.01, 100));  // 0.01 .. 1.00
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> xs(20000);
  for (double& x : xs) h.observe(x = u(rng));
  std::sort(xs.begin(), xs.end());
  for (double q : {0.5, 0.95, 0.99}) {
    const double exact = xs[static_cast<size_t>(q * static_cast<double>(xs.size()))];
    EXPECT_NEAR(h.quantile(q), exact, 0.01) << "q=" << q;
  }
}

TEST(MetricsTest, ConcurrentUpdatesFromEightThreadsGiveExactTotals) {
  Registry reg;
  Counter& c = reg.counter("ops_total", "ops");
  Gauge& g = reg.gauge("inflight", "in flight");
  Histogram& h = reg.histogram("lat_seconds", "latency", {0.5, 1.5, 2.5});
  constexpr int kThreads = 8, kIters = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        c.inc();
        g.inc(2);
        g.dec(1);
        h.observe(static_cast<double>(t % 3));
        // Lookups by name from many threads return the same object.
        if (i % 10000 == 0) reg.counter("ops_total", "ops").inc(0);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(c.value(), double(kThreads) * kIters);
  EXPECT_EQ(g.value(), double(kThreads) * kIters);
  auto s = h.snapshot();
  EXPECT_EQ(s.count, uint64_t(kThreads) * kIters);
  // Threads 0,3,6 observe 0; 1,4,7 observe 1; 2,5 observe 2.
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{3u * kIters, 3u * kIters, 2u * kIters, 0}));
  EXPECT_EQ(s.sum, double(3 * kIters * 1 + 2 * kIters * 2));
  auto e = parse_exposition(reg.render());
  EXPECT_EQ(e.find("ops_total")[0].value, double(kThreads) * kIters);
}

TEST(MetricsTest, ValueFormatting) {
  EXPECT_EQ(format_metric_value(1.0), "1");
  EXPECT_EQ(format_metric_value(0.25), "0.25");
  EXPECT_EQ(format_metric_value(INFINITY), "+Inf");
  EXPECT_EQ(format_metric_value(NAN), "NaN");
  EXPECT_EQ(std::stod(format_metric_value(1e-9)), 1e-9);
  EXPECT_EQ(std::stod(format_metric_value(123456789012.5)), 123456789012.5);
}

TEST(MetricsTest, DefaultLabelsComeFromTheEnvironment) {
  ::setenv("MESHTRAIN_JOB_ID", "job-42", 1);
  ::setenv("RANK", "5", 1);
  ::setenv("MESHTRAIN_NODE_NAME", "node-7", 1);
  Labels l = default_labels_from_env();
  ::unsetenv("MESHTRAIN_JOB_ID");
  ::unsetenv("RANK");
  ::unsetenv("MESHTRAIN_NODE_NAME");
  EXPECT_EQ(l, (Labels{{"job", "job-42"}, {"rank", "5"}, {"node", "node-7"}}));
  Labels d = default_labels_from_env();
  EXPECT_EQ(d[0].second, "meshtrain");
  EXPECT_EQ(d[1].second, "0");
  EXPECT_FALSE(d[2].second.empty());
}

TEST(MetricsTest, PromtoolAcceptsOurOutput) {
  const char* promtool = "/usr/bin/promtool";
  MT_SKIP_UNLESS("prometheus", ::access(promtool, X_OK) == 0,
                 "promtool not installed (Debian prometheus)");
  Registry reg({{"job", "unit"}, {"rank", "0"}, {"node", "n"}});
  reg.counter("meshtrain_collective_bytes_total", "Bytes.", {{"op", "all_reduce"}}).inc(1024);
  reg.gauge("meshtrain_learning_rate", "LR.").set(3e-4);
  reg.gauge("process_resident_memory_bytes", "RSS.").set(1e8);
  auto& h = reg.histogram("meshtrain_step_duration_seconds", "Step.", latency_buckets());
  h.observe(0.02);
  h.observe(1.5);
  const auto dir =
      std::filesystem::temp_directory_path() / ("mt_promtool_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "m.txt") << reg.render(); }
  const std::string cmd = std::string(promtool) + " check metrics < " + (dir / "m.txt").string() +
                          " > " + (dir / "out.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir / "out.txt");
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << "promtool lint findings";
}

}  // namespace
}  // namespace meshtrain::obs
