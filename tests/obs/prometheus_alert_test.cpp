// One alert of deploy/prometheus fired for real: a two-rank training job (meshrun, tiny model)
// serves each worker's /metrics, a real Prometheus scrapes both and evaluates the shipped rules,
// and rank 1 is stopped with SIGSTOP. Rank 0 then waits in the step's collective, no rank
// completes a step, and MeshtrainNoProgress must go to firing (and MeshtrainWorkerDown for the
// stopped worker, whose endpoint no longer answers); after SIGCONT the job steps again and
// MeshtrainNoProgress resolves. Only the rules' thresholds are shortened (a 5 s stall instead
// of 5 minutes, `for:` of seconds, the recording group evaluated every second): the overlay is
// made from the shipped file by replacing exactly those strings, so the expressions tested are
// the shipped ones. Everything is decided by polling the Prometheus HTTP API with a deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "tests/obs/prometheus_harness.h"
#include "tests/support/capability.h"
#include "tests/support/child_process.h"
#include "tests/support/run_command.h"
#include "tests/support/wait.h"

namespace meshtrain::obs {
namespace {

namespace fs = std::filesystem;
using testing::PrometheusServer;

const std::string kBin = MESHTRAIN_BINARY_DIR;
const std::string kSrc = MESHTRAIN_SOURCE_DIR;

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Replaces the one occurrence of `from`; false when there is not exactly one.
bool replace_once(std::string& text, const std::string& from, const std::string& to) {
  const size_t pos = text.find(from);
  if (pos == std::string::npos || text.find(from, pos + 1) != std::string::npos) return false;
  text.replace(pos, from.size(), to);
  return true;
}

// The RANK a process was started with ("" when unreadable).
std::string rank_of(pid_t pid) {
  const std::string env = read_all("/proc/" + std::to_string(pid) + "/environ");
  for (size_t pos = 0; pos < env.size();) {
    const size_t end = env.find('\0', pos);
    const std::string var = env.substr(pos, end - pos);
    if (var.rfind("RANK=", 0) == 0) return var.substr(5);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return "";
}

// Alerts named `name` in `state` ("firing" or "pending"), from the ALERTS series.
nlohmann::json alerts(httplib::Client& cli, const std::string& name, const std::string& state) {
  return testing::query(cli, "ALERTS{alertname=\"" + name + "\",alertstate=\"" + state + "\"}");
}

// Workers lead process groups of their own (meshrun's choice): a test that fails half-way must
// still not leave a stopped worker behind.
struct WorkerGuard {
  std::vector<pid_t> pids;
  ~WorkerGuard() {
    for (pid_t p : pids) {
      ::kill(p, SIGCONT);
      ::kill(-p, SIGKILL);
    }
  }
};

TEST(PrometheusAlert, AStoppedRankFiresNoProgressAndWorkerDownThenResolves) {
  MT_SKIP_UNLESS("prometheus", testing::prometheus_available(),
                 "prometheus not installed (Debian prometheus)");
  const std::string meshtrain = kBin + "/meshtrain", meshrun = kBin + "/meshrun";
  ASSERT_EQ(::access(meshtrain.c_str(), X_OK), 0) << "the build makes meshtrain";
  ASSERT_EQ(::access(meshrun.c_str(), X_OK), 0) << "the build makes meshrun";

  const auto dir = fs::temp_directory_path() / ("mt_promalert_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  // The shipped rules with short thresholds.
  std::string rules = read_all(fs::path(kSrc) / "deploy/prometheus/meshtrain-rules.yaml");
  ASSERT_TRUE(replace_once(rules, "  interval: 30s\n", "  interval: 1s\n"))
      << "deploy/prometheus/meshtrain-rules.yaml changed: update this overlay";
  ASSERT_TRUE(
      replace_once(rules,
                   "      time() - max by (job) (meshtrain_last_step_timestamp_seconds) > 300\n"
                   "        unless on (job) max by (job) (meshtrain_job_completed) == 1\n"
                   "    for: 1m\n",
                   "      time() - max by (job) (meshtrain_last_step_timestamp_seconds) > 5\n"
                   "        unless on (job) max by (job) (meshtrain_job_completed) == 1\n"
                   "    for: 2s\n"))
      << "MeshtrainNoProgress changed: update this overlay";
  ASSERT_TRUE(replace_once(rules, "    expr: up{job=~\"meshtrain.*\"} == 0\n    for: 2m\n",
                           "    expr: up{job=~\"meshtrain.*\"} == 0\n    for: 2s\n"))
      << "MeshtrainWorkerDown changed: update this overlay";
  const fs::path rule_file = dir / "rules.yaml";
  std::ofstream(rule_file) << rules;
  if (meshtrain::testing::run_command("command -v promtool").status == 0) {
    const auto check =
        meshtrain::testing::run_command("promtool check rules " + rule_file.string());
    ASSERT_EQ(check.status, 0) << check.output;
  }

  {
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 4000; ++i) text << "line " << i % 97 << " of the generated text.\n";
  }
  const auto prepared = meshtrain::testing::run_command(
      meshtrain + " data prepare --input " + (dir / "text.txt").string() + " --out " +
      (dir / "data").string() + " --val-fraction 0.1");
  ASSERT_EQ(prepared.status, 0) << prepared.output;

  // Workers serve /metrics on P (rank 0) and P+1 (rank 1).
  int port = 0;
  for (int tries = 0; tries < 50 && port == 0; ++tries) {
    const int p = testing::free_port();
    if (p < 65000 && testing::port_free(p + 1)) port = p;
  }
  ASSERT_NE(port, 0);
  const std::string target0 = "127.0.0.1:" + std::to_string(port),
                    target1 = "127.0.0.1:" + std::to_string(port + 1);
  ::unsetenv("MESHTRAIN_METRICS_PORT");
  // A long collective timeout: the stall must last as long as the test looks at it.
  const std::string job_log = (dir / "job.log").string();
  meshtrain::testing::ChildProcess job = meshtrain::testing::spawn_shell(
      meshrun + " --nproc-per-node 2 --grace-period 2 -- " + meshtrain + " train --set data.dir=" +
          (dir / "data").string() + " --set train.out_dir=" + (dir / "run").string() +
          " --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2"
          " --set model.block_size=32 --set data.batch_size=4 --set train.threads=1"
          " --set train.steps=1000000 --set train.eval_interval=0 --set train.log_interval=1000"
          " --set train.sample_tokens=0 --set train.save_weights=false --set dist.timeout_s=300"
          " --set train.metrics_port=" +
          std::to_string(port),
      job_log);
  ASSERT_TRUE(job.started());
  WorkerGuard guard;

  PrometheusServer prom(dir / "prom", {target0, target1}, {rule_file});
  ASSERT_TRUE(prom.started());
  httplib::Client cli("127.0.0.1", prom.port());
  cli.set_connection_timeout(1, 0);
  cli.set_read_timeout(2, 0);
  const auto poll = std::chrono::milliseconds(250);

  // Both ranks train and are scraped; the progress age is recorded and small.
  ASSERT_TRUE(meshtrain::testing::wait_until(
      [&] {
        return testing::query(cli, "meshtrain_steps_total > 0").size() == 2 &&
               testing::query(cli, "job:meshtrain_progress_age:seconds < 5").size() == 1;
      },
      std::chrono::seconds(90), poll))
      << "the job was not scraped or its progress age not recorded; logs: " << job_log << ", "
      << prom.log_path() << "\n"
      << read_all(job_log);
  EXPECT_TRUE(alerts(cli, "MeshtrainNoProgress", "firing").empty());
  EXPECT_TRUE(alerts(cli, "MeshtrainWorkerDown", "firing").empty());

  // Stop rank 1.
  pid_t rank1 = -1;
  for (pid_t w : meshtrain::testing::children_of(job.pid())) {
    guard.pids.push_back(w);
    if (rank_of(w) == "1") rank1 = w;
  }
  ASSERT_GT(rank1, 0) << "no worker with RANK=1 under meshrun " << job.pid();
  ASSERT_EQ(::kill(rank1, SIGSTOP), 0);

  nlohmann::json no_progress, down;
  const bool fired = meshtrain::testing::wait_until(
      [&] {
        no_progress = alerts(cli, "MeshtrainNoProgress", "firing");
        down = alerts(cli, "MeshtrainWorkerDown", "firing");
        return !no_progress.empty() && !down.empty();
      },
      std::chrono::seconds(60), poll);
  ASSERT_TRUE(fired) << "no_progress: " << no_progress.dump() << "; down: " << down.dump()
                     << "; logs: " << job_log << ", " << prom.log_path();
  ASSERT_EQ(no_progress.size(), 1u) << no_progress.dump();
  EXPECT_EQ(no_progress[0]["metric"]["job"], "meshtrain");
  EXPECT_EQ(no_progress[0]["metric"]["severity"], "critical");
  ASSERT_EQ(down.size(), 1u) << "only the stopped worker is down: " << down.dump();
  EXPECT_EQ(down[0]["metric"]["instance"], target1);

  // Rank 1 goes on: steps complete again and the no-progress alert resolves.
  ASSERT_EQ(::kill(rank1, SIGCONT), 0);
  EXPECT_TRUE(meshtrain::testing::wait_until(
      [&] {
        return alerts(cli, "MeshtrainNoProgress", "firing").empty() &&
               alerts(cli, "MeshtrainNoProgress", "pending").empty();
      },
      std::chrono::seconds(60), poll))
      << alerts(cli, "MeshtrainNoProgress", "firing").dump();
  EXPECT_FALSE(job.wait_for(std::chrono::milliseconds(0)).has_value())
      << "the job ended; see " << job_log;

  prom.stop();
  job.signal(SIGTERM);
  EXPECT_TRUE(job.wait_for(std::chrono::seconds(60)).has_value())
      << "meshrun still ran 60 s after SIGTERM; see " << job_log;
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain::obs
