// The planner: every layout of a job on a cluster, each with its predicted memory and step time
// or the reason it was dropped, best first; and the chosen one as the config the trainer reads.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "meshtrain/plan/cluster.h"
#include "meshtrain/plan/layout.h"
#include "meshtrain/plan/time_model.h"

namespace meshtrain::plan {

// Dense GPT shapes: "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "dense-7b", "dense-70b",
// "dense-175b" (GPT-3's shape; 7B/70B use GPT-2 style blocks at LLaMA's widths).
ModelShape model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

struct PlanOptions {
  int64_t max_micro_batch = 64;  // micro-batch sizes tried: powers of two up to this
  double memory_headroom = 0.9;  // fraction of device memory a layout may plan to use
  double max_bubble = 0.5;       // bubble / compute above this is dropped
  bool allow_cross_node_tp = false;
  bool try_zero = true;
  bool try_checkpointing = true;
  bool try_interleaved = true;
  bool try_sequence_parallel = true;
  // Fix a field instead of searching it (-1 = search).
  int64_t fixed_tp = -1, fixed_pp = -1, fixed_zero = -1, fixed_micro_batch = -1;
};

struct Candidate {
  Layout layout;
  MemoryBreakdown memory;
  StepTime time;
  std::string dropped;      // empty when kept; else the reason ("does not fit: 92.1 GB > 72 GB")
  std::string reason_kind;  // "does not fit", "bubble", "cross-node TP", "batch", ...
};

struct Plan {
  std::vector<Candidate> kept;     // best (shortest step) first
  std::vector<Candidate> dropped;  // every pruned layout with its reason
  std::map<std::string, int64_t> dropped_by_reason;
  int64_t tokens_per_step = 0;
};

// ValueError with one line when nothing fits (naming the smallest footprint and the device
// memory) or when the job cannot be split on this cluster at all.
Plan make_plan(const TrainSetup& job, const ClusterSpec& cluster, const PlanOptions& opts = {});

// The best `n` as a text table, then one line per reason with its count and an example.
std::string plan_table(const Plan& plan, const TrainSetup& job, const ClusterSpec& cluster,
                       size_t n);

// The `[parallel]` section (and nothing else) for a layout, keys as the trainer names them.
std::string parallel_toml(const Layout& layout);

}  // namespace meshtrain::plan
