// The torchrun environment contract round trip: what meshrun writes for a worker
// (worker_environment) is what the worker reads back (discover_dist_env).
#include "meshtrain/runtime/worker_environment.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "meshtrain/runtime/dist_env.h"

namespace meshtrain::runtime {
namespace {

std::map<std::string, std::string> as_map(const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    EXPECT_TRUE(out.emplace(e.substr(0, eq), e.substr(eq + 1)).second)
        << e.substr(0, eq) << " is set twice";
  }
  return out;
}

DistEnv read_back(const std::vector<std::string>& env) {
  const auto vars = as_map(env);
  return discover_dist_env([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

WorkerIdentity identity() {
  WorkerIdentity who;
  who.rank = 5;
  who.local_rank = 1;
  who.world_size = 8;
  who.local_world_size = 4;
  who.group_rank = 1;
  who.master_addr = "node0.example";
  who.master_port = 29511;
  who.restart_count = 2;
  who.token = "job-token";
  return who;
}

// The launcher's own identity (a meshrun started by another launcher) does not leak through.
const std::vector<std::string> kInherited = {"PATH=/usr/bin",
                                             "RANK=99",
                                             "WORLD_SIZE=100",
                                             "MESHTRAIN_RANK=7",
                                             "MESHTRAIN_TOKEN_FILE=/t",
                                             "MESHTRAIN_LOG_LEVEL=debug",
                                             "TORCHELASTIC_RESTART_COUNT=9"};

TEST(WorkerEnvironment, TheWorkerReadsBackWhatTheLauncherWrote) {
  const WorkerIdentity who = identity();
  const auto env = worker_environment(kInherited, who);
  const DistEnv d = read_back(env);
  EXPECT_EQ(d.rank, who.rank);
  EXPECT_EQ(d.local_rank, who.local_rank);
  EXPECT_EQ(d.world_size, who.world_size);
  EXPECT_EQ(d.local_world_size, who.local_world_size);
  EXPECT_EQ(d.group_rank, who.group_rank);
  EXPECT_EQ(d.master_addr, who.master_addr);
  EXPECT_EQ(d.master_port, who.master_port);
  EXPECT_EQ(d.restart_count, who.restart_count);
  EXPECT_EQ(d.launcher, "meshrun");
  EXPECT_TRUE(d.agent_hosts_store);
  EXPECT_EQ(d.store_backend, "tcp");
  const auto vars = as_map(env);
  EXPECT_EQ(vars.at("MESHTRAIN_TOKEN"), "job-token");
  EXPECT_EQ(vars.at("PATH"), "/usr/bin");
  EXPECT_EQ(vars.at("MESHTRAIN_LOG_LEVEL"), "debug");
  EXPECT_EQ(vars.count("MESHTRAIN_RANK"), 0u);
  EXPECT_EQ(vars.count("MESHTRAIN_TOKEN_FILE"), 0u);
}

// An elastic launch tells its workers the fewest nodes the job may go on with; a fixed one
// says nothing, and an inherited value does not leak through.
TEST(WorkerEnvironment, AnElasticJobsMinimumReachesTheWorker) {
  WorkerIdentity who = identity();
  std::vector<std::string> inherited = kInherited;
  inherited.push_back("MESHTRAIN_ELASTIC_MIN_NODES=5");
  EXPECT_EQ(read_back(worker_environment(inherited, who)).elastic_min_nodes, 0);
  who.min_nodes = 2;
  EXPECT_EQ(read_back(worker_environment(inherited, who)).elastic_min_nodes, 2);
}

TEST(WorkerEnvironment, AnEtcdRendezvousReachesTheWorker) {
  WorkerIdentity who = identity();
  who.rdzv_backend = "etcd";
  who.rdzv_endpoint = "etcd1:2379,etcd2:2379";
  who.rdzv_id = "run-42";
  const DistEnv d = read_back(worker_environment(kInherited, who));
  EXPECT_EQ(d.store_backend, "etcd");
  EXPECT_EQ(d.store_endpoint, who.rdzv_endpoint);
  EXPECT_EQ(d.rdzv_id, who.rdzv_id);
  EXPECT_EQ(d.rank, who.rank);
}

// A worker that is itself a launcher (meshrun under meshrun) gives its workers their own
// identity, never two values of one variable.
TEST(WorkerEnvironment, EveryVariableItWritesIsOneItReplaces) {
  const auto first = worker_environment(kInherited, identity());
  WorkerIdentity inner = identity();
  inner.rank = 0;
  const auto second = worker_environment(first, inner);
  EXPECT_EQ(read_back(second).rank, 0);
  for (const std::string& e : worker_environment({}, identity()))
    EXPECT_TRUE(is_worker_identity_variable(e.substr(0, e.find('=')))) << e;
}

}  // namespace
}  // namespace meshtrain::runtime
