// Straggler mitigation end to end with the built meshtrain and meshrun programs: two meshrun
// agents on loopback stand for two nodes, and MESHTRAIN_TEST_SLOWDOWN=3 in one agent's
// environment makes that node's compute three times slower. Elastic (--nnodes 1:2) with
// elastic.drop_stragglers, the slow node is named, every rank checkpoints and stops, its agent
// leaves the job cleanly and the other node finishes alone from the checkpoint; on a fixed
// number of nodes the slow node is only named, with the reason it stays.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "meshtrain/comm/socket.h"
#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class StragglerRun : public TrainRunTest {
 protected:
  // One node's agent: `nnodes` is "1:2" (elastic) or "2"; node 1 is 3x slower.
  std::string agent(int node, const std::string& nnodes, const std::string& endpoint,
                    const fs::path& out, int64_t steps) const {
    return std::string("env MESHTRAIN_TOKEN=straggler-test-token ") +
           (node == 1 ? "MESHTRAIN_TEST_SLOWDOWN=3 " : "") + kMeshrunBin + " --nnodes " + nnodes +
           " --node-rank " + std::to_string(node) + " --rdzv-endpoint " + endpoint +
           // A long last call: round 0 waits for both nodes (it closes once both joined).
           " --rdzv-last-call 30 --rdzv-timeout 60 --grace-period 5 --nproc-per-node 1 -- " +
           kMeshtrainBin + " " +
           train_args(out, steps, 1000,
                      "--set model.n_embd=128 --set model.n_head=4 --set model.n_layer=2"
                      " --set model.block_size=128"
                      " --set elastic.straggler_factor=2 --set elastic.straggler_steps=5"
                      " --set elastic.drop_stragglers=true");
  }

  static std::string free_endpoint() {
    const uint16_t port = comm::Socket::listen("127.0.0.1", 0).local_port();
    return "127.0.0.1:" + std::to_string(port);
  }

  // Runs both agents to their end; fills each one's exit status and output.
  void run_two_nodes(const std::string& nnodes, const fs::path& out, int64_t steps,
                     std::optional<int> status[2], std::string log[2]) {
    const std::string endpoint = free_endpoint();
    const fs::path logs[2] = {dir_ / (nnodes + "_node0.log"), dir_ / (nnodes + "_node1.log")};
    ChildProcess n0 = spawn(agent(0, nnodes, endpoint, out, steps), logs[0].string());
    ASSERT_TRUE(n0.started());
    ChildProcess n1 = spawn(agent(1, nnodes, endpoint, out, steps), logs[1].string());
    ASSERT_TRUE(n1.started());
    status[1] = n1.wait_for(90s);
    status[0] = n0.wait_for(90s);
    for (int k = 0; k < 2; ++k) log[k] = file_bytes(logs[k]);
  }
};

TEST_F(StragglerRun, ElasticJobLeavesTheSlowNodeOutAndFinishesFromTheCheckpoint) {
  const fs::path out = dir_ / "elastic";
  const int64_t steps = 60;
  std::optional<int> status[2];
  std::string log[2];
  run_two_nodes("1:2", out, steps, status, log);
  ASSERT_FALSE(HasFatalFailure());
  const std::string both = log[0] + "\n---- node 1\n" + log[1];
  ASSERT_TRUE(status[0] && status[1]) << "an agent did not finish\n" << both;

  // Named on node 0's rank 0, with its rank and the factor measured: about 3, spread by the
  // host's load (the fault stretches any wait inside a step of the slow node too: up to 5 seen
  // on a loaded 2-core host).
  std::smatch named;
  ASSERT_TRUE(std::regex_search(
      log[0], named,
      std::regex("straggler: node 1 \\(GROUP_RANK 1, rank 1\\) took ([0-9.]+)x the median "
                 "compute time of the other nodes for 5 consecutive steps[^\\n]*; leaving it "
                 "out: every rank checkpoints at step ([0-9]+) and stops")))
      << both;
  const double factor = std::stod(named[1]);
  EXPECT_GT(factor, 2.0) << both;
  EXPECT_LT(factor, 8.0) << both;
  const int64_t at = std::stoll(named[2]);
  EXPECT_LT(at, steps) << both;

  // The slow node's agent leaves cleanly, saying why, and never joins round 1.
  ASSERT_TRUE(WIFEXITED(*status[1])) << both;
  EXPECT_EQ(WEXITSTATUS(*status[1]), 0) << both;
  EXPECT_NE(log[1].find("node 1 leaves the job: its workers were named a straggler"),
            std::string::npos)
      << both;
  EXPECT_EQ(log[1].find("round 1:"), std::string::npos) << both;

  // Node 0 meets again alone, resumes from the step the straggler was named at with the global
  // batch kept (dist.elastic_batch = keep) and finishes.
  ASSERT_TRUE(WIFEXITED(*status[0])) << both;
  EXPECT_EQ(WEXITSTATUS(*status[0]), 0) << both;
  EXPECT_NE(log[0].find("round 0: 2 nodes"), std::string::npos) << both;
  EXPECT_NE(log[0].find("round 1: 1 node"), std::string::npos) << both;
  EXPECT_NE(log[0].find("(step " + std::to_string(at) + " of " + std::to_string(steps) + ")"),
            std::string::npos)
      << both;
  EXPECT_NE(log[0].find("data-parallel size 2 -> 1: keeping the global batch of 8 sequences "
                        "with gradient accumulation 2"),
            std::string::npos)
      << both;
  const auto l = losses(out);
  ASSERT_FALSE(l.empty()) << both;
  EXPECT_EQ(l.rbegin()->first, steps) << both;
  for (const auto& [step, loss] : l) EXPECT_TRUE(std::isfinite(loss)) << "step " << step;
  // The row of the step that named it says so.
  const auto events = by_step<nlohmann::json>(out, "straggler");
  ASSERT_EQ(events.size(), 1u) << both;
  EXPECT_EQ(events.begin()->first, at);
  EXPECT_EQ(events.begin()->second["index"], 1);
  EXPECT_EQ(events.begin()->second["left_out"], true);
}

TEST_F(StragglerRun, AFixedSizeJobOnlyNamesTheSlowNodeAndSaysWhy) {
  const fs::path out = dir_ / "fixed";
  const int64_t steps = 40;
  std::optional<int> status[2];
  std::string log[2];
  run_two_nodes("2", out, steps, status, log);
  ASSERT_FALSE(HasFatalFailure());
  const std::string both = log[0] + "\n---- node 1\n" + log[1];
  ASSERT_TRUE(status[0] && status[1]) << "an agent did not finish\n" << both;
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(WIFEXITED(*status[k])) << both;
    EXPECT_EQ(WEXITSTATUS(*status[k]), 0) << both;
  }
  EXPECT_NE(log[0].find("straggler: node 1 (GROUP_RANK 1, rank 1) took "), std::string::npos)
      << both;
  EXPECT_NE(log[0].find("; not left out: the job was not started by meshrun --nnodes MIN:MAX"),
            std::string::npos)
      << both;
  EXPECT_EQ(last_step(out), steps) << both;
  const auto events = by_step<nlohmann::json>(out, "straggler");
  ASSERT_EQ(events.size(), 1u) << both;
  EXPECT_EQ(events.begin()->second["left_out"], false);
}

}  // namespace
}  // namespace meshtrain::testing
