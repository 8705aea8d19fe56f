// meshrun with the etcd rendezvous backend end to end, on a three-member etcd cluster on
// loopback: two agents (two "nodes") meet in etcd, their workers find the store through the
// MESHTRAIN_RDZV_* variables, and a two-rank training job of a tiny model finishes with the
// etcd member listed first dead -- no process of the job hosts the store.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

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

}  // namespace
