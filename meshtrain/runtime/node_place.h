// Where this rank's node sits in its job, for the decisions taken about whole nodes (leaving a
// straggling node out of an elastic job). Read once from the launcher's environment (DistEnv)
// by the command line; the defaults describe a job that cannot shrink.
#pragma once

namespace meshtrain::runtime {

struct NodePlace {
  int node = 0;  // GROUP_RANK: the node's index among the job's nodes
  // meshrun --nnodes MIN:MAX: MIN, the fewest nodes the job may go on with; 0 when the launch
  // is not elastic (the job has exactly the nodes it started with).
  int min_nodes = 0;
  // The first node hosts the rendezvous store (meshrun's tcp store), so it can never leave.
  bool first_node_stays = false;
};

}  // namespace meshtrain::runtime
