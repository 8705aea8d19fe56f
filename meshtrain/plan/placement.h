// Placing jobs' ranks on a cluster's devices, knowing its topology: nodes in racks, devices in
// NVLink islands inside a node. The topology-aware policy puts a job on one node when it fits
// there (the fullest such node, to keep whole nodes free for big jobs); otherwise on the fewest
// nodes, in one rack when one has room, with every tensor-parallel group inside one island; and
// a higher-priority job may preempt lower ones. Round-robin and first-fit, the policies schedulers
// default to, are here too so the simulator can compare them on the same trace.
//
// Ranks follow the engine's mesh order (pp-major, then dp, tp fastest), filled node by node, so
// a node holds consecutive ranks (as meshrun numbers them), pipeline neighbours sit on the same
// or adjacent nodes and data-parallel replicas of a stage are spread last.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/plan/time_model.h"

namespace meshtrain::plan {

struct NodeInfo {
  std::string name;
  std::string rack = "rack0";
  int64_t devices = 8;
  std::vector<int64_t> islands;  // sizes of the NVLink islands, in device order (empty: one)
  double device_memory = 80e9;
  std::vector<int64_t> used;  // devices busy with work outside this inventory
};

struct Inventory {
  std::vector<NodeInfo> nodes;
};

// TOML: one [[node]] table per node with name, rack, devices, islands (sizes), device_memory_gb,
// used (device indices). ValueError naming the node and key for a contradiction: islands that do
// not add up to the devices, a used device out of range or listed twice, duplicate names.
Inventory load_inventory(const std::string& path);
void validate(const Inventory& inv);
// `racks` racks of `nodes_per_rack` nodes of `devices` devices in islands of `island` devices.
Inventory synthetic_inventory(int64_t racks, int64_t nodes_per_rack, int64_t devices,
                              int64_t island);

struct JobRequest {
  std::string name;
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t priority = 0;
  double memory_per_device = 0;  // bytes (0: anything)
  TrafficPerStep traffic;        // bytes one rank sends per step, per group kind
  int64_t devices() const { return dp * tp * pp; }
};

// TOML: one [[job]] table per job with name, devices or dp/tp/pp, priority, memory_gb, and
// optionally a plan config (`layout = "plan.toml"`: its [parallel] section sets tp and pp).
std::vector<JobRequest> load_jobs(const std::string& path);

struct DeviceRef {
  int node = 0;
  int device = 0;
};

struct Placement {
  std::string job;
  std::vector<DeviceRef> ranks;        // global rank -> device
  std::vector<std::string> preempted;  // jobs stopped to make room (resume from checkpoints)
};

enum class Policy { kTopology, kRoundRobin, kFirstFit };
Policy parse_policy(const std::string& s);  // "topology" | "round-robin" | "first-fit"

// Traffic of a placed job per step, summed over its ranks: bytes that leave a node / a rack.
struct PlacedTraffic {
  double cross_node = 0, cross_rack = 0, total = 0;
};

class ClusterState {
 public:
  explicit ClusterState(Inventory inv);

  // Places the job, or returns nothing when it does not fit now. With `preempt`, jobs of lower
  // priority may be stopped (lowest priority first, then the most recently placed) when that
  // makes room; they are released and named in the result.
  std::optional<Placement> place(const JobRequest& job, Policy policy, bool preempt = false);
  void release(const std::string& job);

  const Inventory& inventory() const { return inv_; }
  int64_t free_devices() const;
  int64_t total_devices() const;
  // The owner of each device ("" free, "-" busy outside).
  const std::vector<std::vector<std::string>>& owners() const { return owner_; }
  const std::map<std::string, JobRequest>& running() const { return running_; }
  PlacedTraffic traffic(const JobRequest& job, const Placement& p) const;

 private:
  std::optional<std::vector<DeviceRef>> choose(const JobRequest& job, Policy policy);
  std::optional<std::vector<DeviceRef>> choose_topology(const JobRequest& job);
  void take(const JobRequest& job, const std::vector<DeviceRef>& devs);

  Inventory inv_;
  std::vector<std::vector<std::string>> owner_;
  std::vector<std::vector<int>> island_of_;  // node -> device -> island index
  std::map<std::string, JobRequest> running_;
  std::map<std::string, std::vector<DeviceRef>> placed_;
  std::vector<std::string> order_;  // placement order of running jobs
  size_t rr_next_ = 0;              // round-robin cursor
};

// Outputs for a placement: "rank node device" lines; a hostfile ("node slots=N", node-rank
// order) with the meshrun command per node; Kubernetes node affinity for the manifests.
std::string rank_table(const Inventory& inv, const Placement& p);
std::string hostfile(const Inventory& inv, const Placement& p);
std::string meshrun_commands(const Inventory& inv, const Placement& p);
std::string node_affinity_yaml(const Inventory& inv, const Placement& p);

}  // namespace meshtrain::plan
