// The launcher contract: each launcher's variables map onto the same DistEnv, and a bad value
// is reported with the name of the variable to fix.
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>

#include "meshtrain/runtime/dist_env.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

DistEnv discover(const std::map<std::string, std::string>& vars) {
  return discover_dist_env([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

void expect_value_error_naming(const std::map<std::string, std::string>& vars,
                               const std::string& variable) {
  try {
    discover(vars);
    FAIL() << "no error for " << variable;
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(variable), std::string::npos) << e.what();
  }
}

TEST(DistEnvTest, DefaultsToASingleProcess) {
  DistEnv e = discover({});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
}

TEST(DistEnvTest, Torchrun) {
  DistEnv e = discover({{"RANK", "5"},
                        {"WORLD_SIZE", "8"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "4"},
                        {"GROUP_RANK", "1"},
                        {"MASTER_ADDR", "10.0.0.7"},
                        {"MASTER_PORT", "1234"},
                        {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.group_rank, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_FALSE(e.agent_hosts_store);
}

TEST(DistEnvTest, KubeflowPyTorchJobOneProcessPerPod) {
  DistEnv e = discover({{"RANK", "3"},
                        {"WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "job-master-0"},
                        {"MASTER_PORT", "23456"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.group_rank, 3);
  EXPECT_EQ(e.master_addr, "job-master-0");
}

TEST(DistEnvTest, MeshrunAgentHostsStore) {
  DistEnv e = discover({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MESHTRAIN_STORE_HOST", "agent"}});
  EXPECT_TRUE(e.agent_hosts_store);
  EXPECT_EQ(e.launcher, "meshrun");
  expect_value_error_naming({{"MESHTRAIN_STORE_HOST", "elsewhere"}}, "MESHTRAIN_STORE_HOST");
}

TEST(DistEnvTest, Slurm) {
  DistEnv e = discover({{"SLURM_PROCID", "6"},
                        {"SLURM_NTASKS", "7"},
                        {"SLURM_LOCALID", "0"},
                        {"SLURM_NODEID", "3"},
                        {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                        {"SLURM_JOB_NODELIST", "gpu[007-010,12],cpu1"},
                        {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 7);
  EXPECT_EQ(e.group_rank, 3);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "gpu007");
  // MASTER_ADDR wins over the node list.
  DistEnv f = discover({{"SLURM_PROCID", "0"},
                        {"SLURM_NTASKS", "2"},
                        {"SLURM_NTASKS_PER_NODE", "2"},
                        {"SLURM_JOB_NODELIST", "a,b"},
                        {"MASTER_ADDR", "head"}});
  EXPECT_EQ(f.master_addr, "head");
  EXPECT_EQ(f.local_world_size, 2);
  DistEnv g = discover(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}});
  EXPECT_EQ(g.master_addr, "10.1.1.1");
}

TEST(DistEnvTest, SlurmHelpers) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node[3-4],x"), "node3");
  EXPECT_EQ(first_slurm_host("rack[2,5]-n[1-2]"), "rack2-n[1-2]");
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), ValueError);
  EXPECT_THROW(slurm_tasks_on_node("2(y3)", 0), ValueError);
}

TEST(DistEnvTest, OpenMpiAndPmi) {
  DistEnv o = discover({{"OMPI_COMM_WORLD_RANK", "5"},
                        {"OMPI_COMM_WORLD_SIZE", "6"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(o.launcher, "openmpi");
  EXPECT_EQ(o.rank, 5);
  EXPECT_EQ(o.local_rank, 2);
  EXPECT_EQ(o.group_rank, 1);
  DistEnv p = discover({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(p.launcher, "pmi");
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.world_size, 2);
}

TEST(DistEnvTest, MeshtrainVariablesOverride) {
  DistEnv e = discover({{"RANK", "1"},
                        {"WORLD_SIZE", "2"},
                        {"MESHTRAIN_RANK", "3"},
                        {"MESHTRAIN_WORLD_SIZE", "4"},
                        {"MESHTRAIN_MASTER_ADDR", "override"},
                        {"MASTER_ADDR", "original"},
                        {"MESHTRAIN_MASTER_PORT", "999"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.master_addr, "override");
  EXPECT_EQ(e.master_port, 999);
}

TEST(DistEnvTest, BadValuesNameTheVariable) {
  expect_value_error_naming({{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK");
  expect_value_error_naming({{"RANK", "x"}, {"WORLD_SIZE", "4"}}, "RANK");
  expect_value_error_naming({{"RANK", "0"}, {"WORLD_SIZE", "4 "}}, "WORLD_SIZE");
  expect_value_error_naming({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE");
  expect_value_error_naming({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK");
  expect_value_error_naming(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
      "LOCAL_RANK");
  expect_value_error_naming({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}},
                            "MASTER_PORT");
  expect_value_error_naming({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID");
  expect_value_error_naming({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "two"}},
                            "OMPI_COMM_WORLD_SIZE");
  expect_value_error_naming({{"MESHTRAIN_RANK", "9"}}, "MESHTRAIN_RANK");
}

TEST(DistEnvTest, JobIdTellsJobsApartAndKeepsItAcrossRestarts) {
  DistEnv one;
  EXPECT_EQ(job_id(one), "") << "one process without a launcher is its own job";
  DistEnv a;
  a.launcher = "meshrun";
  a.world_size = 2;
  a.master_addr = "10.0.0.3";
  a.master_port = 29500;
  ::setenv("MESHTRAIN_TOKEN", "token-a", 1);
  const std::string id = job_id(a);
  DistEnv restarted = a;
  restarted.restart_count = 3;
  restarted.rank = 1;
  EXPECT_EQ(job_id(restarted), id);
  EXPECT_EQ(id.find("token-a"), std::string::npos) << "the token must not reach the lock file";
  ::setenv("MESHTRAIN_TOKEN", "token-b", 1);
  EXPECT_NE(job_id(a), id);
  // A loopback store address is the same on every host: the host's name tells them apart.
  DistEnv local = a;
  local.master_addr = "127.0.0.1";
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(job_id(local).rfind(std::string(host) + "/127.0.0.1:29500/", 0), 0u) << job_id(local);
  ::unsetenv("MESHTRAIN_TOKEN");
  DistEnv etcd = a;
  etcd.rdzv_id = "run-42";
  EXPECT_EQ(job_id(etcd), "run-42");
}

TEST(DistEnvTest, ConnectStoreRankZeroHostsWithoutAgent) {
  DistEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = 0;  // any free port; a real job names one
  // Port 0 cannot be shared with other ranks, but it shows that rank 0 hosts and connects.
  auto store = connect_store(env, std::chrono::seconds(5));
  store->set_string("k", "v");
  EXPECT_EQ(store->get_string("k"), "v");
}

}  // namespace
}  // namespace meshtrain::runtime
