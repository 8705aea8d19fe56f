// meshrun end to end: the built binary runs small shell workers on this machine. Checks the
// environment contract, the output prefixes, failure propagation, signal forwarding and a
// two-node rendezvous on loopback.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "meshtrain/comm/socket.h"
#include "meshtrain/runtime/core_binding.h"
#include "tests/support/child_process.h"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kMeshrun = std::string(MESHTRAIN_BINARY_DIR) + "/meshrun";

class MeshrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshrun_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    children_.clear();
    fs::remove_all(dir_);
  }

  // Starts meshrun with the given arguments; stdout and stderr go to files in the test dir.
  pid_t start(const std::vector<std::string>& args, const std::string& tag = "run",
              const std::vector<std::string>& extra_env = {}) {
    std::string out = (dir_ / (tag + ".out")).string();
    std::string err = (dir_ / (tag + ".err")).string();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(o, 1);
      ::dup2(e, 2);
      ::unsetenv("MESHTRAIN_TOKEN");
      ::unsetenv("MESHTRAIN_TOKEN_FILE");
      for (const auto& kv : extra_env) ::putenv(const_cast<char*>(kv.c_str()));
      std::vector<std::string> full = {kMeshrun};
      full.insert(full.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : full) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(99);
    }
    if (pid > 0) {
      ::setpgid(pid, pid);
      children_.emplace(pid, meshtrain::testing::ChildProcess(pid));
    }
    return pid;
  }

  // Waits for the process (killing it after `limit`) and returns its wait status.
  int finish(pid_t pid, std::chrono::seconds limit = 60s) {
    meshtrain::testing::ChildProcess& child = children_.at(pid);
    if (const std::optional<int> status = child.wait_for(limit)) return *status;
    ADD_FAILURE() << "meshrun did not finish in time";
    return child.kill_and_reap();
  }

  std::string read(const std::string& name) const {
    std::ifstream in(dir_ / name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  static std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }

  // Worker pids written by the workers themselves into pid.<RANK> files.
  std::vector<pid_t> worker_pids(int n, std::chrono::seconds limit = 20s) const {
    auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      fs::path p = dir_ / ("pid." + std::to_string(r));
      pid_t pid = 0;
      while (std::chrono::steady_clock::now() < deadline) {
        std::ifstream in(p);
        if (in >> pid && pid > 0) break;
        std::this_thread::sleep_for(20ms);
      }
      pids.push_back(pid);
    }
    return pids;
  }

  static bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

  std::string pid_file_cmd() const { return "echo $$ > " + dir_.string() + "/pid.$RANK; "; }

  fs::path dir_;
  // Every meshrun started: what still runs when the test ends is killed and reaped.
  std::map<pid_t, meshtrain::testing::ChildProcess> children_;
};

TEST_F(MeshrunTest, SetsTheEnvironmentAndPrefixesOutput) {
  pid_t pid = start({"--nproc-per-node", "3", "--", "sh", "-c",
                     "echo env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK "
                     "$TORCHELASTIC_RESTART_COUNT ${#MESHTRAIN_TOKEN} $MASTER_ADDR $MASTER_PORT; "
                     "echo to-stderr >&2"});
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << read("run.err");
  std::set<int> ranks;
  std::string port;
  for (const auto& l : lines(read("run.out"))) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(
        l, m, std::regex(R"(\[rank (\d)\] env (\d) (\d) 3 3 0 0 64 127\.0\.0\.1 (\d+))")))
        << l;
    EXPECT_EQ(m[1], m[2]);
    EXPECT_EQ(m[2], m[3]);  // one node: LOCAL_RANK == RANK
    if (port.empty()) port = m[4];
    EXPECT_EQ(m[4], port);  // every worker gets the same store address
    ranks.insert(std::stoi(m[1]));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  int err_lines = 0;
  for (const auto& l : lines(read("run.err"))) {
    if (std::regex_match(l, std::regex(R"(\[rank \d\] to-stderr)"))) ++err_lines;
  }
  EXPECT_EQ(err_lines, 3);
}

TEST_F(MeshrunTest, GivenTokenReachesWorkers) {
  std::string token_file = (dir_ / "token").string();
  std::ofstream(token_file) << "s3cret-token\n";
  pid_t pid = start({"--nproc-per-node", "1", "--token-file", token_file, "--", "sh", "-c",
                     "echo token=$MESHTRAIN_TOKEN"});
  ASSERT_EQ(finish(pid), 0) << read("run.err");
  EXPECT_EQ(read("run.out"), "[rank 0] token=s3cret-token\n");
}

TEST_F(MeshrunTest, ManyLinesStayWholeAndPrefixed) {
  pid_t pid = start({"--nproc-per-node", "3", "--", "sh", "-c",
                     "i=0; while [ $i -lt 300 ]; do echo line-$RANK-$i-xxxxxxxxxxxxxxxxxxxx; "
                     "i=$((i+1)); done"});
  ASSERT_EQ(finish(pid), 0) << read("run.err");
  auto out = lines(read("run.out"));
  EXPECT_EQ(out.size(), 900u);
  std::regex re(R"(\[rank (\d)\] line-(\d)-\d+-x{20})");
  for (const auto& l : out) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, re)) << l;
    EXPECT_EQ(m[1], m[2]);
  }
}

TEST_F(MeshrunTest, FailingWorkerStopsTheOthersAndSetsExitStatus) {
  pid_t pid =
      start({"--nproc-per-node", "4", "--grace-period", "5", "--", "sh", "-c",
             pid_file_cmd() + "if [ $RANK = 2 ]; then sleep 0.5; exit 7; fi; exec sleep 60"});
  auto pids = worker_pids(4);
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
  std::string err = read("run.err");
  EXPECT_NE(err.find("meshrun: rank 2 (pid " + std::to_string(pids[2]) +
                     ") exited with status 7; stopped the other 3 workers"),
            std::string::npos)
      << err;
  for (pid_t p : pids) EXPECT_FALSE(alive(p)) << "worker " << p << " survived";
}

TEST_F(MeshrunTest, WorkerKilledBySignalIsReported) {
  pid_t pid = start({"--nproc-per-node", "2", "--", "sh", "-c",
                     pid_file_cmd() + "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 60"});
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + 9);
  std::string err = read("run.err");
  EXPECT_NE(err.find("rank 0 (pid"), std::string::npos) << err;
  EXPECT_NE(err.find("was killed by signal 9 (SIGKILL); stopped the other 1 worker"),
            std::string::npos)
      << err;
  // Rank 1 may be stopped before it wrote its pid file; missing pids read as 0.
  for (pid_t p : worker_pids(2, 2s)) EXPECT_FALSE(alive(p));
}

TEST_F(MeshrunTest, SigtermIsForwardedAndStubbornWorkersAreKilled) {
  // Rank 1 ignores SIGTERM, so only the SIGKILL after the grace period stops it.
  pid_t pid = start({"--nproc-per-node", "3", "--grace-period", "0.5", "--", "sh", "-c",
                     pid_file_cmd() + "if [ $RANK = 1 ]; then trap '' TERM; fi; exec sleep 60"});
  auto pids = worker_pids(3);
  for (pid_t p : pids) ASSERT_TRUE(alive(p));
  ::kill(pid, SIGTERM);
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_NE(read("run.err").find("received SIGTERM"), std::string::npos) << read("run.err");
  for (pid_t p : pids) EXPECT_FALSE(alive(p)) << "worker " << p << " survived";
}

TEST_F(MeshrunTest, MissingProgramFailsWith127) {
  pid_t pid = start({"--nproc-per-node", "2", "--", "/nonexistent/program"});
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 127);
  EXPECT_NE(read("run.err").find("cannot execute '/nonexistent/program'"), std::string::npos);
}

TEST_F(MeshrunTest, BadFlagsExitWithUsageError) {
  int status = finish(start({"--nproc-per-node", "2"}));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(read("run.err").find("no program"), std::string::npos) << read("run.err");
  status = finish(start({"--nnodes", "2", "--", "true"}));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(read("run.err").find("--rdzv-endpoint"), std::string::npos) << read("run.err");
  status = finish(start({"--help"}));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint",
                           "--rdzv-id", "--token-file", "--grace-period"}) {
    EXPECT_NE(read("run.out").find(flag), std::string::npos) << flag;
  }
}

// Every worker runs on its own share of the cores (threads inherit the mask at exec).
TEST_F(MeshrunTest, BindCoresToRankGivesEachWorkerItsOwnCores) {
  const std::vector<int> allowed = meshtrain::runtime::allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  const int workers = std::min<int>(2, static_cast<int>(allowed.size()));
  const auto shares = meshtrain::runtime::split_cpus(allowed, workers);
  pid_t pid = start({"--nproc-per-node", std::to_string(workers), "--bind-cores-to-rank", "--",
                     "sh", "-c", "grep Cpus_allowed_list /proc/self/status"});
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << read("run.err");
  std::set<int> seen;
  for (const auto& l : lines(read("run.out"))) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, std::regex(R"(\[rank (\d+)\] Cpus_allowed_list:\s*(\S+))")))
        << l;
    const int rank = std::stoi(m[1]);
    ASSERT_LT(rank, workers);
    EXPECT_EQ(meshtrain::runtime::parse_cpu_list(m[2].str()), shares[static_cast<size_t>(rank)])
        << l;
    seen.insert(rank);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(workers));
  EXPECT_NE(read("run.err").find("meshrun: cores per local rank: 0: "), std::string::npos)
      << read("run.err");
}

TEST_F(MeshrunTest, BadCoreBindingIsAUsageError) {
  const std::vector<int> allowed = meshtrain::runtime::allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  const std::string one = std::to_string(allowed.front());
  // Two workers, one core.
  int status = finish(start(
      {"--nproc-per-node", "2", "--bind-cores-to-rank", "--bind-core-list", one, "--", "true"}));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(read("run.err").find("cannot have a core each"), std::string::npos) << read("run.err");
  status = finish(start({"--nproc-per-node", "1", "--bind-core-list", one, "--", "true"}));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(read("run.err").find("needs --bind-cores-to-rank"), std::string::npos)
      << read("run.err");
  status = finish(start(
      {"--nproc-per-node", "1", "--bind-cores-to-rank", "--bind-core-list", "1-x", "--", "true"}));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(read("run.err").find("bad core list '1-x'"), std::string::npos) << read("run.err");
  if (allowed.back() < 1023) {
    status = finish(start({"--nproc-per-node", "1", "--bind-cores-to-rank", "--bind-core-list",
                           "1023", "--", "true"}));
    EXPECT_EQ(WEXITSTATUS(status), 2);
    EXPECT_NE(read("run.err").find("core 1023 is not usable here"), std::string::npos)
        << read("run.err");
  }
}

TEST_F(MeshrunTest, TwoNodesRendezvousOnLoopback) {
  uint16_t port = meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port();
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> env = {"MESHTRAIN_TOKEN=two-node-test-token"};
  auto node = [&](int k) {
    return start({"--nnodes", "2", "--node-rank", std::to_string(k), "--rdzv-endpoint", endpoint,
                  "--rdzv-timeout", "30", "--nproc-per-node", "2", "--", "sh", "-c",
                  "echo $RANK $WORLD_SIZE $GROUP_RANK $LOCAL_RANK $MASTER_PORT"},
                 "node" + std::to_string(k), env);
  };
  pid_t n1 = node(1);  // the non-host node may start first: it retries until node 0 is up
  std::this_thread::sleep_for(100ms);
  pid_t n0 = node(0);
  EXPECT_EQ(finish(n0), 0) << read("node0.err");
  EXPECT_EQ(finish(n1), 0) << read("node1.err");
  std::set<std::string> seen;
  for (int k = 0; k < 2; ++k) {
    for (const auto& l : lines(read("node" + std::to_string(k) + ".out"))) seen.insert(l);
  }
  std::string p = std::to_string(port);
  EXPECT_EQ(seen, (std::set<std::string>{"[rank 0] 0 4 0 0 " + p, "[rank 1] 1 4 0 1 " + p,
                                         "[rank 2] 2 4 1 0 " + p, "[rank 3] 3 4 1 1 " + p}));
}

TEST_F(MeshrunTest, FailureOnOneNodeStopsTheOther) {
  uint16_t port = meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port();
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> env = {"MESHTRAIN_TOKEN=two-node-test-token"};
  auto node = [&](int k) {
    return start(
        {"--nnodes", "2", "--node-rank", std::to_string(k), "--rdzv-endpoint", endpoint,
         "--rdzv-timeout", "30", "--nproc-per-node", "1", "--grace-period", "2", "--", "sh", "-c",
         pid_file_cmd() + "if [ $RANK = 1 ]; then sleep 0.5; exit 5; fi; exec sleep 60"},
        "node" + std::to_string(k), env);
  };
  pid_t n0 = node(0);
  pid_t n1 = node(1);
  auto pids = worker_pids(2);
  int s1 = finish(n1);
  int s0 = finish(n0);
  EXPECT_EQ(WEXITSTATUS(s1), 5) << read("node1.err");
  EXPECT_NE(WEXITSTATUS(s0), 0) << read("node0.err");
  EXPECT_NE(read("node0.err").find("rank 1"), std::string::npos) << read("node0.err");
  for (pid_t p : pids) EXPECT_FALSE(alive(p));
}

TEST_F(MeshrunTest, MaxRestartsGivesUpWithTheLastStatus) {
  pid_t pid = start({"--nproc-per-node", "1", "--max-restarts", "1", "--grace-period", "2", "--",
                     "sh", "-c", "echo attempt=$TORCHELASTIC_RESTART_COUNT; exit 3"});
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(read("run.out"), "[rank 0] attempt=0\n[rank 0] attempt=1\n");
  EXPECT_NE(read("run.err").find("restart 1 of 1 (reason: rank 0"), std::string::npos)
      << read("run.err");
  EXPECT_NE(read("run.err").find("giving up after 1 restart"), std::string::npos)
      << read("run.err");
}

// Exit status 2 is meshtrain's configuration or input error: restarting would fail the same
// way, so meshrun says so once and stops.
TEST_F(MeshrunTest, ABadInputExitIsNotRestarted) {
  pid_t pid = start({"--nproc-per-node", "1", "--max-restarts", "3", "--grace-period", "2", "--",
                     "sh", "-c", "echo attempt=$TORCHELASTIC_RESTART_COUNT; exit 2"});
  int status = finish(pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_EQ(read("run.out"), "[rank 0] attempt=0\n") << "run once, not four times";
  const std::string err = read("run.err");
  EXPECT_NE(err.find("not restarting: a worker exited with status 2, a configuration or input "
                     "error"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("restart 1 of 3"), std::string::npos) << err;
}

TEST_F(MeshrunTest, TwoNodesRestartTogetherAfterAFailure) {
  uint16_t port = meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port();
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> env = {"MESHTRAIN_TOKEN=two-node-test-token"};
  // Rank 1 fails on the first attempt while rank 0 is still busy; on the second attempt both
  // succeed.
  const std::string script =
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then"
      "  if [ $RANK = 1 ]; then sleep 0.5; exit 5; fi; exec sleep 60; fi;"
      " echo attempt=$TORCHELASTIC_RESTART_COUNT";
  auto node = [&](int k) {
    return start({"--nnodes", "2", "--node-rank", std::to_string(k), "--rdzv-endpoint", endpoint,
                  "--rdzv-timeout", "30", "--nproc-per-node", "1", "--grace-period", "2",
                  "--max-restarts", "1", "--", "sh", "-c", script},
                 "node" + std::to_string(k), env);
  };
  pid_t n0 = node(0);
  pid_t n1 = node(1);
  int s1 = finish(n1);
  int s0 = finish(n0);
  EXPECT_EQ(WEXITSTATUS(s0), 0) << read("node0.err");
  EXPECT_EQ(WEXITSTATUS(s1), 0) << read("node1.err");
  EXPECT_EQ(read("node0.out"), "[rank 0] attempt=1\n");
  EXPECT_EQ(read("node1.out"), "[rank 1] attempt=1\n");
  EXPECT_NE(read("node0.err").find("restart 1 of 1"), std::string::npos) << read("node0.err");
}

TEST_F(MeshrunTest, ASignalledNodeStopsTheJobInsteadOfRestartingIt) {
  uint16_t port = meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port();
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> env = {"MESHTRAIN_TOKEN=two-node-test-token"};
  auto node = [&](int k) {
    return start({"--nnodes", "2", "--node-rank", std::to_string(k), "--rdzv-endpoint", endpoint,
                  "--rdzv-timeout", "30", "--nproc-per-node", "1", "--grace-period", "2",
                  "--max-restarts", "3", "--", "sh", "-c",
                  pid_file_cmd() + "echo attempt=$TORCHELASTIC_RESTART_COUNT; exec sleep 60"},
                 "node" + std::to_string(k), env);
  };
  pid_t n0 = node(0);
  pid_t n1 = node(1);
  worker_pids(2);
  ::kill(n1, SIGTERM);
  int s1 = finish(n1);
  int s0 = finish(n0);
  EXPECT_EQ(WEXITSTATUS(s1), 128 + SIGTERM) << read("node1.err");
  EXPECT_NE(WEXITSTATUS(s0), 0) << read("node0.err");
  EXPECT_EQ(read("node0.out"), "[rank 0] attempt=0\n");
  EXPECT_NE(read("node0.err").find("not restarting: node 1 received SIGTERM"), std::string::npos)
      << read("node0.err");
}

// A rendezvous that cannot complete ends in bounded time with one line naming what is missing
// and a non-zero status: fixed node counts (node 0 alone; node 1 with no node 0 to publish the
// layout) and an elastic job short of MIN nodes.
TEST_F(MeshrunTest, RendezvousThatCannotCompleteEndsWithOneLine) {
  uint16_t port = meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port();
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> env = {"MESHTRAIN_TOKEN=two-node-test-token"};
  auto run = [&](const std::string& tag, const std::string& nnodes, const std::string& node) {
    return finish(start({"--nnodes", nnodes, "--node-rank", node, "--rdzv-endpoint", endpoint,
                         "--rdzv-timeout", "1", "--nproc-per-node", "1", "--", "true"},
                        tag, env),
                  30s);
  };
  int status = run("fixed", "3", "0");
  EXPECT_EQ(WEXITSTATUS(status), 1) << read("fixed.err");
  EXPECT_NE(read("fixed.err")
                .find("meshrun: error: rendezvous: node ranks [1, 2] of 3 did not "
                      "join within 1 s (--rdzv-timeout)"),
            std::string::npos)
      << read("fixed.err");
  status = run("elastic", "2:3", "0");
  EXPECT_EQ(WEXITSTATUS(status), 1) << read("elastic.err");
  EXPECT_NE(read("elastic.err")
                .find("meshrun: error: rendezvous round 0: only 1 of at least 2 nodes joined "
                      "within 1 s"),
            std::string::npos)
      << read("elastic.err");
  // Nobody hosts the store at all: node 1 cannot reach it.
  status = run("orphan", "2", "1");
  EXPECT_NE(WEXITSTATUS(status), 0) << read("orphan.err");
  EXPECT_NE(read("orphan.err").find("meshrun: error: "), std::string::npos) << read("orphan.err");
  EXPECT_EQ(read("orphan.out"), "");
}

}  // namespace
