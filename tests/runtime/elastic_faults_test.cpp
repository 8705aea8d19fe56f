// Faults that must never leave a job waiting forever, end to end with the built meshtrain and
// meshrun programs on a tiny model:
// - a worker that hangs (SIGSTOP) makes its peer's collective miss its deadline; that failure
//   stops the group and meshrun restarts it from the newest checkpoint;
// - an elastic member whose agent dies after its workers finished does not keep the node
//   hosting the store waiting: it notices the silence and exits with one line;
// - an elastic node whose own workers keep failing leaves the job once past --max-restarts and
//   the other node finishes without it;
// - hosts in network namespaces: a host whose link is cut makes the other hosts' collective fail
//   within the deadline, and they meet again without it and finish from the newest checkpoint
//   (skipped, with the reason, where namespaces cannot be made).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "meshtrain/comm/socket.h"
#include "tests/comm/netns_lab.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/capability.h"

namespace meshtrain::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

class ElasticFaults : public TrainRunTest {
 protected:
  pid_t start(const std::string& cmd, const fs::path& log) {
    return keep(spawn(cmd, log.string()));
  }
  // Owns a started process: what is still running when the test ends is killed and reaped.
  pid_t keep(ChildProcess child) {
    const pid_t pid = child.pid();
    spawned_.emplace(pid, std::move(child));
    return pid;
  }
  // The wait status of a started process, or a failure (with `context`) once `limit` passed.
  int finish(pid_t pid, std::chrono::milliseconds limit, const std::string& context) {
    ChildProcess& child = spawned_.at(pid);
    const std::optional<int> status = child.wait_for(limit);
    if (!status) {
      child.kill_and_reap();
      ADD_FAILURE() << "still running after " << limit.count() << " ms\n" << context;
      return -1;
    }
    return *status;
  }
  static int exit_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  static std::string free_endpoint() {
    return "127.0.0.1:" +
           std::to_string(meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port());
  }
  // A global batch of 6 x (first world size) sequences: divisible by every world size 1-3, so a
  // job resumed on fewer or more nodes keeps it through accumulation.
  static constexpr const char* kElasticBatch =
      "--set data.batch_size=1 --set train.grad_accum_steps=6 --set train.log_interval=50";

  std::map<pid_t, ChildProcess> spawned_;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The hang is a stopped process: it holds its connections open and answers nothing, which no
// error path notices -- only the other rank's deadline (dist.timeout_s = 3) does.
TEST_F(ElasticFaults, HungWorkerFailsTheStepAndMeshrunRestartsTheGroup) {
  const fs::path a = dir_ / "a", log = dir_ / "run.log";
  const int64_t steps = 600;
  const pid_t pid = start(
      kMeshrunBin + " --nproc-per-node 2 --max-restarts 1 --grace-period 3 -- " + kMeshtrainBin +
          " " + train_args(a, steps, 10, "--set dist.timeout_s=3 --set train.log_interval=50"),
      log);
  ASSERT_TRUE(wait_until([&] { return saved_from(a, 10); }, 60s)) << file_bytes(log);
  const std::vector<pid_t> workers = meshrun_workers(pid);
  ASSERT_EQ(workers.size(), 2u) << file_bytes(log);
  const int64_t hung_at = last_step(a);
  ASSERT_LT(hung_at, steps - 50) << "the job ran too fast to hang it mid-run";
  ::kill(workers[1], SIGSTOP);
  const auto t0 = Clock::now();
  ASSERT_TRUE(
      wait_until([&] { return file_bytes(log).find("restart 1 of 1") != std::string::npos; }, 30s))
      << file_bytes(log);
  const double to_restart = seconds_since(t0);
  const int status = finish(pid, 90s, file_bytes(log));
  const std::string out = file_bytes(log);
  EXPECT_EQ(exit_code(status), 0) << out;
  // Rank 0's step failed on the deadline, naming the rank, and the stopped rank was
  // stopped for good (SIGCONT lets it take the SIGTERM, or the grace period's SIGKILL ends it).
  EXPECT_TRUE(
      std::regex_search(out, std::regex("timed out[^\\n]*ranks \\[1\\] did not (answer|arrive)")))
      << out;
  EXPECT_NE(out.find("rank 0 (pid"), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  // The 3 s deadline, then at most the 3 s grace period, with slack for a loaded machine.
  EXPECT_LT(to_restart, 20.0) << out;
  std::printf("hung worker: the group was restarted %.1f s after the hang\n", to_restart);
  EXPECT_EQ(last_step(a), steps) << out;
}

// Node 1's worker finishes the job, then kills its own agent (kill -9 of the parent) before the
// agent can report it done: node 0, which hosts the store, hears nothing more from it.
TEST_F(ElasticFaults, MemberLostAfterTheJobFinishedDoesNotKeepTheStoreHostWaiting) {
  const fs::path a = dir_ / "a";
  const std::string endpoint = free_endpoint();
  const std::string train = kMeshtrainBin + " " + train_args(a, 30, 10);
  auto agent = [&](int node, const std::string& worker) {
    return "env MESHTRAIN_TOKEN=elastic-faults-token " + kMeshrunBin +
           " --nnodes 1:2 --node-rank " + std::to_string(node) + " --rdzv-endpoint " + endpoint +
           " --rdzv-last-call 20 --rdzv-timeout 60 --grace-period 2 --nproc-per-node 1 -- " +
           worker;
  };
  const fs::path log0 = dir_ / "node0.log", log1 = dir_ / "node1.log";
  const pid_t n0 = start(agent(0, train), log0);
  const pid_t n1 = start(agent(1, "sh -c '" + train + " && kill -9 $PPID'"), log1);
  const int s1 = finish(n1, 60s, file_bytes(log1));
  EXPECT_TRUE(WIFSIGNALED(s1) && WTERMSIG(s1) == SIGKILL) << file_bytes(log1);
  const auto lost = Clock::now();
  const int s0 = finish(n0, 40s, file_bytes(log0));
  const double waited = seconds_since(lost);
  const std::string out = file_bytes(log0);
  EXPECT_EQ(exit_code(s0), 0) << out;
  EXPECT_NE(out.find("the job finished here, but node 1 never reported its workers done"),
            std::string::npos)
      << out;
  EXPECT_LT(waited, 25.0) << out;  // a 10 s silence limit, with slack
  EXPECT_EQ(last_step(a), 30) << out;
}

// Node 1's "workers" fail at once every round. With --max-restarts 1 node 1 leaves after its
// second failure; node 0 (whose workers never failed) meets alone and finishes the job.
TEST_F(ElasticFaults, NodeWhoseWorkersKeepFailingLeavesAndTheOtherFinishes) {
  const fs::path a = dir_ / "a";
  const std::string endpoint = free_endpoint();
  auto agent = [&](int node, const std::string& worker) {
    return "env MESHTRAIN_TOKEN=elastic-faults-token " + kMeshrunBin +
           " --nnodes 1:2 --node-rank " + std::to_string(node) + " --rdzv-endpoint " + endpoint +
           " --rdzv-last-call 5 --rdzv-timeout 60 --max-restarts 1 --grace-period 2"
           " --nproc-per-node 1 -- " +
           worker;
  };
  const fs::path log0 = dir_ / "node0.log", log1 = dir_ / "node1.log";
  // Both agents are in the first round (it closes when both joined, or 5 s after the first).
  const pid_t n0 = start(agent(0, kMeshtrainBin + " " + train_args(a, 20, 10)), log0);
  const pid_t n1 = start(agent(1, "sh -c 'echo broken node; exit 7'"), log1);
  const int s1 = finish(n1, 60s, file_bytes(log1));
  const std::string out1 = file_bytes(log1);
  EXPECT_EQ(exit_code(s1), 7) << out1;
  EXPECT_NE(out1.find("this node's workers failed 2 times (--max-restarts 1); node 1 leaves the "
                      "job"),
            std::string::npos)
      << out1;
  const int s0 = finish(n0, 60s, file_bytes(log0));
  const std::string out0 = file_bytes(log0);
  EXPECT_EQ(exit_code(s0), 0) << out0;
  EXPECT_NE(out0.find("exited with status 7 on node 1"), std::string::npos) << out0;
  EXPECT_TRUE(std::regex_search(out0, std::regex("round [0-9]+: 1 node \\(0 on"))) << out0;
  EXPECT_EQ(last_step(a), 20) << out0;
}

// Three hosts, one agent and one worker each, the store on host 0; host 2's link is cut at the
// bridge mid-training (no reset reaches anyone). --max-restarts 0: the failure is host 2's, not
// that of the host that happened to report it, so nobody else leaves.
TEST_F(ElasticFaults, HostWithACutLinkIsLeftOutAndTheOthersFinish) {
  meshtrain::comm::testing::NetnsLab lab(3);
  MT_SKIP_UNLESS("netns", lab.available(), lab.unavailable_reason());
  const fs::path a = dir_ / "a";
  const int64_t steps = 400;
  const std::string endpoint = lab.address(0) + ":29512";
  const std::string train =
      kMeshtrainBin + " " +
      train_args(a, steps, 10,
                 std::string(kElasticBatch) + " --set dist.backend=tcp --set dist.timeout_s=4");
  std::vector<pid_t> agents;
  std::vector<fs::path> logs;
  for (int h = 0; h < 3; ++h) {
    logs.push_back(dir_ / ("host" + std::to_string(h) + ".log"));
    const std::string cmd = "exec " + kMeshrunBin + " --nnodes 2:3 --node-rank " +
                            std::to_string(h) + " --rdzv-endpoint " + endpoint +
                            " --rdzv-last-call 1 --rdzv-timeout 30 --max-restarts 0"
                            " --grace-period 2 --nproc-per-node 1 -- " +
                            train;
    agents.push_back(keep(lab.spawn(h, {"/bin/sh", "-c", cmd},
                                    {{"MESHTRAIN_TOKEN", "elastic-netns-token"},
                                     {"MESHTRAIN_HOST_ID", "host" + std::to_string(h)},
                                     {"OMP_NUM_THREADS", "1"}},
                                    logs.back().string())));
  }
  auto all_logs = [&] {
    std::string s;
    for (size_t h = 0; h < logs.size(); ++h)
      s += "---- host " + std::to_string(h) + "\n" + file_bytes(logs[h]);
    return s;
  };
  ASSERT_TRUE(wait_until([&] { return saved_from(a, 20); }, 60s)) << all_logs();
  ASSERT_NE(file_bytes(logs[0]).find("round 0: 3 nodes"), std::string::npos) << all_logs();
  ASSERT_LT(last_step(a), steps - 100) << "the job ran too fast to cut a link mid-run";
  ASSERT_TRUE(lab.cut_link(2));
  const auto cut = Clock::now();
  // The two hosts left meet again without host 2.
  ASSERT_TRUE(wait_until(
      [&] { return file_bytes(logs[0]).find("round 1: 2 nodes") != std::string::npos; }, 30s))
      << all_logs();
  const double to_new_round = seconds_since(cut);
  for (int h = 0; h < 2; ++h) {
    const int status = finish(agents[h], 120s, all_logs());
    EXPECT_EQ(exit_code(status), 0) << "host " << h << "\n" << all_logs();
  }
  // Host 2 cannot reach the store any more; it is stopped here rather than waiting out its
  // store timeout (its worker dies with its agent).
  ::kill(agents[2], SIGKILL);
  finish(agents[2], 10s, all_logs());
  const std::string out0 = file_bytes(logs[0]);
  const std::string out = all_logs();
  // The step in flight failed on its deadline (4 s) on a host that was not cut.
  EXPECT_TRUE(std::regex_search(file_bytes(logs[0]) + file_bytes(logs[1]),
                                std::regex("timed out[^\\n]*did not (answer|arrive)")))
      << out;
  EXPECT_NE((file_bytes(logs[0]) + file_bytes(logs[1])).find("node 2 went missing; not counted"),
            std::string::npos)
      << out;
  // The 4 s deadline, the 2 s grace period and 5 s for the other members to say they are
  // alive, then a 1 s last call; with slack for a loaded machine.
  EXPECT_LT(to_new_round, 25.0) << out;
  std::printf("cut link: the other hosts met again %.1f s after the cut\n", to_new_round);
  EXPECT_NE(out0.find("round 1: 2 nodes (0 on"), std::string::npos) << out;
  EXPECT_NE(out0.find("data-parallel size 3 -> 2: keeping the global batch of 18 sequences"),
            std::string::npos)
      << out;
  EXPECT_TRUE(std::regex_search(out0, std::regex("resumed from [^\\n]*step_[0-9]+"))) << out;
  const auto l = losses(a);
  ASSERT_FALSE(l.empty());
  EXPECT_EQ(l.rbegin()->first, steps) << out;
  for (const auto& [step, loss] : l) EXPECT_TRUE(std::isfinite(loss)) << "step " << step;
}

}  // namespace
}  // namespace meshtrain::testing
