// Names the node that holds an all-reduce job back, and with elastic.drop_stragglers leaves it
// out. Every step it takes the per-rank compute times that the engine gathers for every rank
// (StepOutcome::rank_step_s: to the end of each rank's backward, before any wait for the
// others), takes each node's slowest rank as the node's time and hands them to a
// StragglerDetector (elastic.straggler_factor, elastic.straggler_steps). In a job of one node
// the units are its ranks, which are named but never left out. It watches jobs whose ranks are
// all data-parallel replicas (DDP, ZeRO): pipeline stages and tensor shards differ by design.
//
// The node named is said in one line, in the step's metrics.jsonl row ("straggler") and in
// meshtrain_stragglers_named_total. With elastic.drop_stragglers under meshrun --nnodes
// MIN:MAX, when the job has more than MIN nodes and checkpoints on, every rank checkpoints
// that step and stops (TrainResult::regrouped; the straggler's ranks also left_out): their
// exit statuses tell the agents to meet again without that node (regroup_exit_status.h).
// Every rank decides alike, from the same gathered times and the same settings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/obs/metrics.h"
#include "meshtrain/runtime/node_place.h"
#include "meshtrain/runtime/step_observer.h"
#include "meshtrain/runtime/straggler_detector.h"

namespace meshtrain::runtime {

class StragglerWatch : public StepObserver {
 public:
  StragglerWatch(const RunState& run, NodePlace place);
  // Learns every rank's node (one small all-gather, on every rank alike).
  void on_start(RunState& run) override;
  void after_step(RunState& run, StepContext& step) override;
  void on_step_end(RunState& run, StepContext& step) override;

 private:
  // Why the unit named is not left out, or "" when it is.
  std::string why_kept(const RunState& run, const StepContext& step, int unit) const;
  std::string describe_unit(int unit) const;

  NodePlace place_;
  StragglerDetector detector_;
  bool enabled_ = false;
  bool by_node_ = false;                 // units are nodes (else ranks)
  std::vector<std::vector<int>> units_;  // the ranks of each unit, in rank order
  std::vector<int> unit_nodes_;          // by node: each unit's GROUP_RANK
  int my_unit_ = 0;
  std::optional<int> leaving_;  // the unit left out, from the step it was named
  obs::Counter* named_ = nullptr;
};

}  // namespace meshtrain::runtime
