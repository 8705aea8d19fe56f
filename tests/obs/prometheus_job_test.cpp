// A real two-rank training job (meshrun starting two meshtrain workers) scraped by a real
// Prometheus server through meshrun's aggregated node endpoint: PromQL returns both ranks'
// series, including collective metrics fed by the comm layer's hook and the straggler gauges
// fed by the per-step exchange. Skipped, with the reason, when prometheus or the programs are
// absent.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "tests/obs/prometheus_harness.h"
#include "tests/support/capability.h"
#include "tests/support/child_process.h"

extern char** environ;

namespace meshtrain::obs {
namespace {

namespace fs = std::filesystem;
using testing::PrometheusServer;

const std::string kBin = MESHTRAIN_BINARY_DIR;

std::set<std::string> ranks_of(const nlohmann::json& result) {
  std::set<std::string> r;
  for (const auto& s : result)
    if (s["metric"].contains("rank")) r.insert(s["metric"]["rank"].get<std::string>());
  return r;
}

TEST(PrometheusJobTest, PrometheusScrapesATwoRankTrainingJobThroughMeshrun) {
  MT_SKIP_UNLESS("prometheus", testing::prometheus_available(),
                 "prometheus not installed (Debian prometheus)");
  const std::string meshtrain = kBin + "/meshtrain", meshrun = kBin + "/meshrun";
  if (::access(meshtrain.c_str(), X_OK) != 0 || ::access(meshrun.c_str(), X_OK) != 0)
    FAIL() << "meshtrain or meshrun is missing from the build directory; the build makes both";

  const auto dir = fs::temp_directory_path() / ("mt_promjob_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 4000; ++i) text << "line " << i % 97 << " of the generated text.\n";
  }
  ASSERT_EQ(std::system((meshtrain + " data prepare --input " + (dir / "text.txt").string() +
                         " --out " + (dir / "data").string() + " --val-fraction 0.1 > " +
                         (dir / "prepare.log").string() + " 2>&1")
                            .c_str()),
            0);

  // meshrun serves the node on P; its workers on P+1 and P+2.
  int port = 0;
  for (int tries = 0; tries < 50 && port == 0; ++tries) {
    const int p = testing::free_port();
    if (p < 65000 && testing::port_free(p + 1) && testing::port_free(p + 2)) port = p;
  }
  ASSERT_NE(port, 0);

  // Many steps: the job runs until the queries succeed, then is stopped.
  std::vector<std::string> argv_s{meshrun,
                                  "--nproc-per-node",
                                  "2",
                                  "--metrics-port",
                                  std::to_string(port),
                                  "--grace-period",
                                  "2",
                                  "--",
                                  meshtrain,
                                  "train",
                                  "--set",
                                  "data.dir=" + (dir / "data").string(),
                                  "--set",
                                  "train.out_dir=" + (dir / "run").string(),
                                  "--set",
                                  "model.n_layer=1",
                                  "--set",
                                  "model.n_embd=32",
                                  "--set",
                                  "model.n_head=2",
                                  "--set",
                                  "model.block_size=32",
                                  "--set",
                                  "data.batch_size=4",
                                  "--set",
                                  "train.threads=1",
                                  "--set",
                                  "train.steps=100000",
                                  "--set",
                                  "train.eval_interval=0",
                                  "--set",
                                  "train.log_interval=1000",
                                  "--set",
                                  "train.sample_tokens=0",
                                  "--set",
                                  "train.save_weights=false"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string job_log = (dir / "job.log").string();
  posix_spawn_file_actions_addopen(&fa, 1, job_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  ::unsetenv("MESHTRAIN_METRICS_PORT");
  pid_t job = -1;
  const int spawned = posix_spawn(&job, meshrun.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ASSERT_EQ(spawned, 0);
  meshtrain::testing::ChildProcess job_handle(job);  // killed and reaped with the test

  PrometheusServer prom(dir / "prom", {"127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(prom.started());
  httplib::Client cli("127.0.0.1", prom.port());
  cli.set_connection_timeout(1, 0);
  nlohmann::json steps, gathers, lag, p50;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool job_exited = false;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (job_handle.wait_for(std::chrono::milliseconds(0))) {
      job_exited = true;
      break;
    }
    steps = testing::query(cli, "meshtrain_steps_total > 0");
    gathers = testing::query(cli, "meshtrain_collectives_total{op=\"all_gather\"} > 0");
    lag = testing::query(cli, "meshtrain_straggler_lag_seconds");
    p50 = testing::query(cli, "histogram_quantile(0.5, meshtrain_step_duration_seconds_bucket)");
    if (ranks_of(steps).size() == 2 && ranks_of(gathers).size() == 2 && lag.size() == 2 &&
        p50.size() == 2)
      break;
  }
  prom.stop();
  if (!job_exited) {
    job_handle.signal(SIGTERM);
    EXPECT_TRUE(job_handle.wait_for(std::chrono::seconds(60)).has_value())
        << "meshrun still ran 60 s after SIGTERM; see " << job_log;
  }
  ASSERT_FALSE(job_exited) << "the training job ended early; see " << job_log;
  EXPECT_EQ(ranks_of(steps), (std::set<std::string>{"0", "1"}))
      << "steps: " << steps.dump() << "; logs: " << job_log << ", " << prom.log_path();
  EXPECT_EQ(ranks_of(gathers), (std::set<std::string>{"0", "1"})) << gathers.dump();
  ASSERT_EQ(lag.size(), 2u) << lag.dump();
  for (const auto& s : lag) EXPECT_GE(std::stod(s["value"][1].get<std::string>()), 0.0);
  ASSERT_EQ(p50.size(), 2u) << p50.dump();
  for (const auto& s : p50) EXPECT_GT(std::stod(s["value"][1].get<std::string>()), 0.0);
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain::obs
