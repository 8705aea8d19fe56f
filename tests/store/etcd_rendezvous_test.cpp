// meshrun with the etcd rendezvous backend end to end, on a three-member etcd cluster on
// loopback: two agents (two "nodes") meet in etcd, their workers find the store through the
// MESHTRAIN_RDZV_* variables, and a two-rank training job of a tiny model finishes with the
// etcd member listed first dead -- no process of the job hosts the store. And an elastic job of
// three nodes loses an etcd member and then its first node (kill -9), and the two nodes left
// finish it from the newest checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "meshtrain/comm/etcd_store.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/store/etcd_cluster.h"
#include "tests/support/run_command.h"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using meshtrain::testing::EtcdCluster;
using meshtrain::testing::run_command;

const std::string kBin = MESHTRAIN_BINARY_DIR;
const std::string kMeshtrain = kBin + "/meshtrain";
const std::string kMeshrun = kBin + "/meshrun";

class EtcdRendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& p : {kMeshrun, kMeshtrain}) {
      ASSERT_TRUE(fs::exists(p)) << p << " is not built";
    }
    dir_ = fs::temp_directory_path() /
           ("mt_etcd_rdzv_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Both agents of a two-node job, node 1 in the background; prints both exit statuses.
  std::string two_nodes(const std::string& endpoints, const std::string& id,
                        const std::string& worker) const {
    auto agent = [&](int node) {
      return "env MESHTRAIN_TOKEN=etcd-rdzv-test-token " + kMeshrun +
             " --nnodes 2 --nproc-per-node 1 --node-rank " + std::to_string(node) +
             " --rdzv-backend etcd --rdzv-endpoint " + endpoints + " --rdzv-id " + id +
             " --rdzv-timeout 60 --grace-period 2 -- " + worker;
    };
    const std::string n1 = (dir_ / "node1.log").string();
    return agent(1) + " > " + n1 + " 2>&1 & p=$!; " + agent(0) + "; s0=$?; wait $p; s1=$?; cat " +
           n1 + "; echo status $s0 $s1";
  }

  fs::path dir_;
};

TEST_F(EtcdRendezvous, WorkersGetTheEtcdStoreInTheirEnvironment) {
  EtcdCluster cluster(1);
  const std::string id = "env-" + std::to_string(::getpid());
  auto r = run_command(two_nodes(cluster.endpoint_list(), id,
                                 "sh -c 'echo env $RANK $WORLD_SIZE $MESHTRAIN_RDZV_BACKEND "
                                 "$MESHTRAIN_RDZV_ID $MESHTRAIN_RDZV_ENDPOINT'"));
  EXPECT_NE(r.output.find("status 0 0"), std::string::npos) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line = "[rank " + std::to_string(rank) + "] env " + std::to_string(rank) +
                             " 2 etcd " + id + " " + cluster.endpoint_list();
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
}

TEST_F(EtcdRendezvous, MissingIdOrEndpointIsAClearError) {
  auto r = run_command(kMeshrun + " --rdzv-backend etcd --rdzv-endpoint 127.0.0.1:1 -- true");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--rdzv-id"), std::string::npos) << r.output;
  r = run_command(kMeshrun + " --rdzv-backend etcd --rdzv-id x -- true");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--rdzv-endpoint"), std::string::npos) << r.output;
  r = run_command(kMeshrun + " --help");
  EXPECT_NE(r.output.find("--rdzv-backend"), std::string::npos) << r.output;
}

TEST_F(EtcdRendezvous, TwoNodeTrainingSurvivesLosingAnEtcdMember) {
  // A tiny data set and model: a few steps of real data-parallel training.
  {
    std::ofstream text(dir_ / "text.txt");
    for (int i = 0; i < 3000; ++i) text << "line " << i % 53 << " says " << (i * 7) % 29 << ".\n";
  }
  auto prep = run_command(kMeshtrain + " data prepare --input " + (dir_ / "text.txt").string() +
                          " --out " + (dir_ / "data").string() + " --val-fraction 0.1");
  ASSERT_EQ(prep.status, 0) << prep.output;
  const std::string train =
      kMeshtrain + " train --set data.dir=" + (dir_ / "data").string() +
      " --set train.out_dir=" + (dir_ / "out").string() +
      " --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2"
      " --set model.block_size=32 --set data.batch_size=4 --set train.threads=1"
      " --set data.val_batches=2 --set train.eval_interval=0 --set train.log_interval=1"
      " --set train.sample_tokens=0 --set dist.timeout_s=30 --set train.steps=8"
      " --set ckpt.interval=0";

  EtcdCluster cluster(3);
  const std::string id = "train-" + std::to_string(::getpid());
  // The member every agent and worker tries first is gone: they all fail over to the others.
  // (store_test covers a member dying under requests that are in flight.)
  cluster.kill(0);
  auto r = run_command(two_nodes(cluster.endpoint_list(), id, train));
  EXPECT_NE(r.output.find("status 0 0"), std::string::npos) << r.output;
  // Both ranks trained: each wrote its own metrics.
  EXPECT_GT(fs::file_size(dir_ / "out" / "metrics_rank1.jsonl"), 0u) << r.output;
  std::ifstream metrics(dir_ / "out" / "metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line);)
    records += line.find("\"loss\"") != std::string::npos;
  EXPECT_GE(records, 8) << r.output;
}

// Three nodes (one agent and one worker each, node ids 0-2 in start order) meet in a
// three-member etcd cluster. The etcd member every client tries first is killed mid-training,
// then node 0 -- the first node, which with the tcp backend would have hosted the store -- is
// killed outright with its worker. Nodes 1 and 2 meet again in etcd and finish the job from the
// newest checkpoint, keeping the global batch.
class EtcdElastic : public meshtrain::testing::TrainRunTest {
 protected:
  std::vector<meshtrain::testing::ChildProcess> nodes_;  // killed and reaped with the test
};

TEST_F(EtcdElastic, LosingTheFirstNodeAndAnEtcdMemberDoesNotEndTheJob) {
  EtcdCluster cluster(3);
  const fs::path a = dir_ / "a";
  const int64_t steps = 800;
  const std::string id = "elastic-" + std::to_string(::getpid());
  // A global batch of 6 x the first world size divides by every world size 1-3.
  const std::string train =
      meshtrain::testing::kMeshtrainBin + " " +
      train_args(a, steps, 10,
                 "--set data.batch_size=1 --set train.grad_accum_steps=6"
                 " --set train.log_interval=50 --set dist.backend=tcp --set dist.timeout_s=5");
  std::vector<fs::path> logs;
  for (int node = 0; node < 3; ++node) {
    logs.push_back(dir_ / ("node" + std::to_string(node) + ".log"));
    nodes_.push_back(spawn("env MESHTRAIN_TOKEN=etcd-elastic-token MESHTRAIN_HOST_ID=node" +
                               std::to_string(node) + " " + meshtrain::testing::kMeshrunBin +
                               " --nnodes 2:3 --node-rank " + std::to_string(node) +
                               " --rdzv-backend etcd --rdzv-endpoint " + cluster.endpoint_list() +
                               " --rdzv-id " + id +
                               " --rdzv-last-call 1 --rdzv-timeout 60 --max-restarts 2"
                               " --grace-period 2 --nproc-per-node 1 -- " +
                               train,
                           logs.back().string()));
    if (node == 0) {
      // Node 0 is the first to join: the others start once its agent claimed its id in round 0.
      meshtrain::comm::EtcdStoreOptions eo;
      eo.endpoints = meshtrain::comm::parse_etcd_endpoints(cluster.endpoint_list());
      eo.prefix = meshtrain::comm::etcd_job_prefix(id);
      eo.timeout = 60s;
      meshtrain::comm::EtcdStore store(std::move(eo));
      ASSERT_NO_THROW(store.wait({"rdzv/" + id + "/elastic/0/id/0"}, 60s)) << file_bytes(logs[0]);
    }
  }
  auto all_logs = [&] {
    std::string s;
    for (size_t n = 0; n < logs.size(); ++n)
      s += "---- node " + std::to_string(n) + "\n" + file_bytes(logs[n]);
    return s;
  };
  auto checkpoint_after = [&](int64_t step) {
    return wait_until(
        [&] {
          for (int64_t s = (step / 10 + 1) * 10; s <= step + 100; s += 10) {
            if (fs::exists(a / "checkpoints" / ("step_" + std::to_string(s)) / "manifest.json"))
              return true;
          }
          return false;
        },
        60s);
  };
  // All three train (round 0, or round 1 if one node came late).
  ASSERT_TRUE(wait_until(
      [&] { return file_bytes(logs[0]).find(": 3 nodes (0 on") != std::string::npos; }, 60s))
      << all_logs();
  ASSERT_TRUE(checkpoint_after(last_step(a))) << all_logs();

  cluster.kill(0);
  const int64_t etcd_lost_at = last_step(a);
  // Training and checkpointing (a barrier in the store) go on through the other two members.
  ASSERT_TRUE(checkpoint_after(etcd_lost_at + 10)) << all_logs();

  const int64_t node_lost_at = last_step(a);
  ASSERT_LT(node_lost_at, steps - 100) << "the job ran too fast to lose a node mid-run";
  const std::vector<pid_t> workers = meshrun_workers(nodes_[0].pid());
  ASSERT_EQ(workers.size(), 1u) << all_logs();
  nodes_[0].kill_and_reap();
  ::kill(workers[0], SIGKILL);

  for (int node = 1; node < 3; ++node) {
    const auto status = nodes_[node].wait_for(120s);
    ASSERT_TRUE(status.has_value()) << "node " << node << " did not finish\n" << all_logs();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "node " << node << "\n"
                                                                 << all_logs();
  }
  const std::string out = file_bytes(logs[1]);
  EXPECT_TRUE(std::regex_search(out, std::regex("round [0-9]+: 2 nodes \\(1 on [^,]*, 2 on")))
      << all_logs();
  // 18 sequences when the first round had all three nodes, 12 when one of them came late.
  EXPECT_TRUE(std::regex_search(
      out, std::regex("data-parallel size 3 -> 2: keeping the global batch of (18|12) sequences")))
      << all_logs();
  // Resumed (the last resume there: node 1's worker logs only as rank 0, after node 0 is gone)
  // from a checkpoint written after the etcd member was lost.
  int64_t resumed = -1;
  static const std::regex kResumed("resumed from [^\\n]*\\(step ([0-9]+) of ");
  for (std::sregex_iterator it(out.begin(), out.end(), kResumed), end; it != end; ++it)
    resumed = std::stoll((*it)[1]);
  EXPECT_GT(resumed, etcd_lost_at) << all_logs();
  EXPECT_LE(resumed, node_lost_at + 20) << all_logs();
  std::printf(
      "etcd member lost at step %lld, node 0 at step %lld; nodes 1 and 2 resumed from "
      "step %lld\n",
      static_cast<long long>(etcd_lost_at), static_cast<long long>(node_lost_at),
      static_cast<long long>(resumed));
  const auto l = losses(a);
  ASSERT_FALSE(l.empty());
  EXPECT_EQ(l.rbegin()->first, steps) << all_logs();
  for (const auto& [step, loss] : l) EXPECT_TRUE(std::isfinite(loss)) << "step " << step;
}

}  // namespace
