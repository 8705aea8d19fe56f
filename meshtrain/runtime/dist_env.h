// Where this process sits in the job, read from the environment its launcher left. The contract
// is torchrun's (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT), which meshrun and the Kubeflow PyTorchJob operator
// also set; Slurm (SLURM_*), Open MPI (OMPI_COMM_WORLD_*) and PMI (PMI_*) are translated into
// it. MESHTRAIN_<FIELD> variables override any launcher (MESHTRAIN_RANK, MESHTRAIN_WORLD_SIZE,
// MESHTRAIN_LOCAL_RANK, MESHTRAIN_LOCAL_WORLD_SIZE, MESHTRAIN_GROUP_RANK, MESHTRAIN_MASTER_ADDR,
// MESHTRAIN_MASTER_PORT, MESHTRAIN_RESTART_COUNT). Without any launcher: rank 0 of 1.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "meshtrain/comm/store.h"

namespace meshtrain::runtime {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;  // the node's index
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  int restart_count = 0;
  int replacement = 0;  // meshrun's MESHTRAIN_REPLACEMENT (worker_environment.h)
  // meshrun --nnodes MIN:MAX: MIN (MESHTRAIN_ELASTIC_MIN_NODES); 0 when the launch is not
  // elastic.
  int elastic_min_nodes = 0;
  // "meshrun", "torchrun", "slurm", "openmpi", "pmi" or "none".
  std::string launcher = "none";
  // True when a launcher agent (meshrun) hosts the store; otherwise rank 0 hosts it.
  bool agent_hosts_store = false;
  // Where the rendezvous store lives (MESHTRAIN_RDZV_BACKEND): "tcp" is the TcpStore at
  // MASTER_ADDR:MASTER_PORT; "etcd" is an etcd cluster, whose members MESHTRAIN_RDZV_ENDPOINT
  // lists ("h1:2379,h2:2379") and in which MESHTRAIN_RDZV_ID names the job. With etcd no
  // process hosts the store, so no single node's loss ends the job.
  std::string store_backend = "tcp";
  std::string store_endpoint;
  std::string rdzv_id;
};

constexpr uint16_t kDefaultMasterPort = 29500;

// Returns the value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the process environment. Throws ValueError naming the variable on a non-numeric or
// inconsistent value (RANK >= WORLD_SIZE, a port out of range, ...).
DistEnv discover_dist_env();
DistEnv discover_dist_env(const EnvLookup& env);

// The job's identity, shared by its ranks and its restarts and different for another job: the
// rendezvous id (MESHTRAIN_RDZV_ID) when there is one, else the store's address and a hash of
// the job token. Empty without a launcher (one process is its own job).
std::string job_id(const DistEnv& env);

// First host of a Slurm node list: "gpu[03-05,9],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& nodelist);
// Tasks on node `node_id` from SLURM_TASKS_PER_NODE syntax: "2(x3),1" -> 2,2,2,1.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

// Connects to the job's rendezvous store at MASTER_ADDR:MASTER_PORT, authenticated with the job
// token from the environment. Rank 0 hosts the server itself unless a launcher agent does
// (MESHTRAIN_STORE_HOST=agent, set by meshrun). With store_backend "etcd" it connects to the
// etcd members instead (credentials from MESHTRAIN_ETCD_*, see comm/etcd_store.h), under the
// job's prefix. Keys are namespaced by the restart count so that a restarted job never reads a
// previous attempt's keys.
std::shared_ptr<comm::Store> connect_store(const DistEnv& env,
                                           comm::Duration timeout = std::chrono::seconds(300));

}  // namespace meshtrain::runtime
