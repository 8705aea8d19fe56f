// Elastic training end to end with the built meshtrain and meshrun programs on a tiny model: a
// checkpoint written by 4 ranks resumes on 2 with the global batch kept through accumulation
// and the loss trajectory of the uninterrupted 4-rank run; and an elastic meshrun job
// (--nnodes 1:2) that a second node joins and then leaves (its agent killed) finishes on the
// node that stays.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "meshtrain/comm/socket.h"
#include "meshtrain/runtime/checkpointing.h"
#include "meshtrain/util/error.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using meshtrain::runtime::plan_elastic_batch;
using meshtrain::runtime::TrainConfig;
using meshtrain::testing::ChildProcess;

const std::string kBin = MESHTRAIN_BINARY_DIR;
const std::string kMeshtrain = kBin + "/meshtrain";
const std::string kMeshrun = kBin + "/meshrun";

using Result = meshtrain::testing::CommandResult;
Result run(const std::string& cmd) {
  return meshtrain::testing::run_command(cmd);
}

TEST(ElasticBatch, KeepsTheGlobalBatchThroughAccumulation) {
  TrainConfig c;
  c.data.batch_size = 4;
  c.train.grad_accum_steps = 1;
  // Saved by 4 ranks x 4 x 1 = 16; 2 ranks keep 16 with accumulation 2.
  auto plan = plan_elastic_batch(resolve_config(c), 4, 16, 2);
  EXPECT_EQ(plan.grad_accum_steps, 2);
  EXPECT_NE(plan.message.find("data-parallel size 4 -> 2: keeping the global batch of 16"),
            std::string::npos)
      << plan.message;
  // Growing back: 2 ranks with accumulation 2 saved 16; 4 ranks need 1 again.
  c.train.grad_accum_steps = 2;
  EXPECT_EQ(plan_elastic_batch(resolve_config(c), 2, 16, 4).grad_accum_steps, 1);
  // Nothing changed, nothing to say.
  c.train.grad_accum_steps = 1;
  EXPECT_TRUE(plan_elastic_batch(resolve_config(c), 4, 16, 4).message.empty());
  // 16 is not a multiple of 4 x 3.
  try {
    plan_elastic_batch(resolve_config(c), 4, 16, 3);
    ADD_FAILURE() << "no error for an indivisible global batch";
  } catch (const meshtrain::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot keep the global batch of 16"), std::string::npos)
        << e.what();
  }
}

TEST(ElasticBatch, RescaleLrKeepsTheConfiguredAccumulation) {
  TrainConfig c;
  c.data.batch_size = 4;
  c.train.grad_accum_steps = 1;
  c.dist.elastic_batch = "rescale_lr";
  c.optim.lr_scale_rule = "linear";
  auto plan = plan_elastic_batch(resolve_config(c), 4, 16, 3);
  EXPECT_EQ(plan.grad_accum_steps, 1);
  EXPECT_NE(plan.message.find("global batch 16 -> 12"), std::string::npos) << plan.message;
  EXPECT_NE(plan.message.find("lr_scale_rule=linear"), std::string::npos) << plan.message;
}

class Elastic : public meshtrain::testing::TrainRunTest {};

// 4 ranks train 6 steps and checkpoint; 2 ranks resume to step 12 keeping the global batch of
// 16 through accumulation 2. Each step then averages the gradients of the same 16 sequences
// (the sampler's global order continues at offset 6 x 16), so the losses follow the
// uninterrupted 4-rank run; only the grouping of the sums differs (micro-batches of other
// sequences, 2 ranks instead of 4), which changes float rounding and nothing else. Tolerance
// 1e-5 on losses near 3-5 (a few float32 ulps of the loss, ~2e-6 relative): reordered float32
// sums differ by about 1e-7 relative per step and AdamW steps of 1e-3 carry that over six
// steps (measured: 4.8e-7); a data-order or batch-size mistake moves the loss by 1e-3 or more.
TEST_F(Elastic, ResumeFrom4To2RanksKeepsTheLossTrajectory) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  Result first = run(meshrun(4) + train_args(a, 6, 6));
  ASSERT_EQ(first.status, 0) << first.output;

  // 3 ranks cannot keep a global batch of 16 with micro-batches of 4: one clear error.
  Result three = run(meshrun(3) + train_args(a, 12, 6));
  EXPECT_NE(three.status, 0) << three.output;
  EXPECT_NE(
      three.output.find("cannot keep the global batch of 16 sequences at data-parallel size 3"),
      std::string::npos)
      << three.output;

  Result second = run(meshrun(2) + train_args(a, 12, 6));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("(step 6 of 12)"), std::string::npos) << second.output;
  EXPECT_NE(
      second.output.find("data-parallel size 4 -> 2: keeping the global batch of 16 sequences "
                         "with gradient accumulation 2"),
      std::string::npos)
      << second.output;

  Result straight = run(meshrun(4) + train_args(b, 12, 0));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto resumed = losses(a), reference = losses(b);
  ASSERT_EQ(reference.size(), 12u);
  ASSERT_EQ(resumed.size(), 12u);
  float worst = 0;
  for (int64_t step = 1; step <= 12; ++step) {
    const float tol = step <= 6 ? 1e-6f : 1e-5f;
    EXPECT_NEAR(resumed.at(step), reference.at(step), tol) << "step " << step;
    if (step > 6) worst = std::max(worst, std::fabs(resumed.at(step) - reference.at(step)));
  }
  std::printf("largest loss difference after the resume on 2 ranks: %.3g\n", worst);
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Node 0 starts alone (world 2), node 1 joins (a new round, world 4), then node 1's agent is
// killed: node 0 restarts alone (world 2) from the newest checkpoint and finishes the job. The
// global batch of 8 is kept throughout (micro-batch 2 x accumulation 2 x 2 ranks, then x 1 x 4).
TEST_F(Elastic, MeshrunNodeJoinsAndLeavesAndTheJobFinishes) {
  const fs::path a = dir_ / "a";
  const int64_t steps = 3000;
  const uint16_t port = meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto agent = [&](int node) {
    return "env MESHTRAIN_TOKEN=elastic-test-token " + kMeshrun + " --nnodes 1:2 --node-rank " +
           std::to_string(node) + " --rdzv-endpoint " + endpoint +
           " --rdzv-last-call 1 --rdzv-timeout 60 --max-restarts 1 --grace-period 5"
           " --nproc-per-node 2 -- " +
           kMeshtrain + " " +
           train_args(a, steps, 20,
                      "--set data.batch_size=2 --set train.grad_accum_steps=2"
                      " --set dist.timeout_s=15 --set train.log_interval=50");
  };
  const fs::path log0 = dir_ / "node0.log", log1 = dir_ / "node1.log";
  ChildProcess n0 = spawn(agent(0), log0);
  ASSERT_TRUE(n0.started());
  if (!wait_until([&] { return losses(a).size() >= 3; }, 60s))
    FAIL() << "node 0 did not start training\n" << file_text(log0);
  ChildProcess n1 = spawn(agent(1), log1);
  auto last_step = [&] {
    const auto l = losses(a);
    return l.empty() ? int64_t{0} : l.rbegin()->first;
  };
  // The members stop for a new round that admits node 1 (world 4), then train on past a
  // checkpoint written by 4 ranks.
  const bool grew = wait_until(
      [&] { return file_text(log0).find("data-parallel size 2 -> 4") != std::string::npos; }, 90s);
  const int64_t grown_at = last_step();
  if (!grew || !wait_until([&] { return last_step() >= grown_at + 25; }, 60s) ||
      last_step() >= steps - 100) {
    FAIL() << "the job did not grow to 4 ranks in time\n"
           << file_text(log0) << "\n---- node 1\n"
           << file_text(log1);
  }
  n1.kill_and_reap();
  const std::optional<int> finished = n0.wait_for(240s);
  if (!finished) FAIL() << "node 0 did not finish\n" << file_text(log0);
  const int status = *finished;
  const std::string out = file_text(log0);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("round 0: 1 node"), std::string::npos) << out;
  EXPECT_NE(out.find("a node is waiting to join"), std::string::npos) << out;
  EXPECT_NE(out.find("round 1: 2 nodes (0 on"), std::string::npos) << out;
  EXPECT_NE(out.find("world size 4"), std::string::npos) << out;
  EXPECT_NE(out.find("round 2: 1 node"), std::string::npos) << out;
  EXPECT_NE(
      out.find("data-parallel size 4 -> 2: keeping the global batch of 8 sequences with gradient "
               "accumulation 2"),
      std::string::npos)
      << out;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex("resumed from [^\\n]* \\(step [0-9]+ of ")))
      << out;
  const auto l = losses(a);
  ASSERT_FALSE(l.empty());
  EXPECT_EQ(l.rbegin()->first, steps);
  for (const auto& [step, loss] : l) EXPECT_TRUE(std::isfinite(loss)) << "step " << step;
}

}  // namespace
