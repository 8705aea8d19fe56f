// Expert parallelism's groups. The data-parallel ranks form blocks of `ep` neighbours; the ranks
// of one block share out the experts of every mixture-of-experts layer (each holds
// num_experts / ep of them) and exchange tokens by all-to-all, while each keeps its own batch
// and a whole copy of everything else. The ranks at the same place of every block hold the same
// experts: the experts' replicas, over which their gradients are averaged (DeepSpeed's
// expert-data-parallel group). Everything else is averaged over the whole data-parallel group as
// in DDP.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/expert_exchange.h"

namespace meshtrain::parallel {

struct ExpertGroups {
  int ep = 1;                   // ranks that share out the experts
  int replicas = 1;             // copies of each expert: data-parallel size / ep
  int coord = 0;                // this rank's place in its block: which experts it holds
  int replica = 0;              // which block: which copy of them
  int data_parallel = 1;        // the data-parallel size, which every gradient is averaged by
  comm::ProcessGroupPtr block;  // the ep ranks exchanging tokens
  comm::ProcessGroupPtr replica_group;  // the copies of this rank's experts; null when one
  std::shared_ptr<nn::ExpertExchange> exchange;
};

// Collective over `dp` (every member, in the same order relative to its other operations): the
// groups of `ep` neighbouring ranks and of the experts' copies.
ExpertGroups make_expert_groups(const comm::ProcessGroupPtr& dp, int ep);

// Collective over `dp`: only the copies' group make_expert_groups makes (null when each expert
// has one copy), for another group over the same ranks (the device group, whose copies' gradients
// live on the device).
comm::ProcessGroupPtr expert_replica_group(const comm::ProcessGroupPtr& dp, int ep);

// The rank counts of the groups make_expert_groups splits off a data-parallel group of `dp`
// ranks, in its order (for ProcessGroupOptions::shm_budget.planned_groups).
std::vector<int> expert_split_sizes(int dp, int ep);

// An ExpertExchange over a process group (its ranks the group's).
std::shared_ptr<nn::ExpertExchange> group_expert_exchange(comm::ProcessGroupPtr group);

}  // namespace meshtrain::parallel
