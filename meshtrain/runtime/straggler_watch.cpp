#include "meshtrain/runtime/straggler_watch.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

StragglerWatch::StragglerWatch(const RunState& run, NodePlace place)
    : place_(place),
      detector_(run.config.config.elastic.straggler_factor,
                run.config.config.elastic.straggler_steps) {}

void StragglerWatch::on_start(RunState& run) {
  // Only where every rank is a replica doing the same work: pipeline stages and tensor shards
  // differ in their compute by design, and a stage's time includes its waits for the others.
  enabled_ = run.config.config.elastic.straggler_factor > 0 && run.world > 1 && run.group &&
             !run.group->detached() && run.dp_world == run.world;
  if (!enabled_) return;
  named_ = &obs::default_registry().counter(
      "meshtrain_stragglers_named_total",
      "Nodes (ranks, in a job of one node) named as stragglers: slower than "
      "elastic.straggler_factor x the others' median for elastic.straggler_steps steps.");
  // Small integers are exact in f32, the dtype every backend gathers.
  const float mine = static_cast<float>(place_.node);
  std::vector<float> nodes(static_cast<size_t>(run.world));
  run.group->all_gather(&mine, nodes.data(), 1, DType::f32, {})->wait();
  std::map<int, std::vector<int>> by_node;  // in GROUP_RANK order
  for (int r = 0; r < run.world; ++r)
    by_node[static_cast<int>(nodes[static_cast<size_t>(r)])].push_back(r);
  by_node_ = by_node.size() > 1;
  units_.clear();
  unit_nodes_.clear();
  if (by_node_) {
    for (auto& [node, ranks] : by_node) {
      if (node == place_.node) my_unit_ = static_cast<int>(units_.size());
      units_.push_back(ranks);
      unit_nodes_.push_back(node);
    }
  } else {
    for (int r = 0; r < run.world; ++r) units_.push_back({r});
    my_unit_ = run.rank;
  }
}

std::string StragglerWatch::describe_unit(int unit) const {
  const std::vector<int>& ranks = units_.at(static_cast<size_t>(unit));
  if (!by_node_) return detail::str_cat("rank ", unit);
  std::string list;
  for (int r : ranks) list += detail::str_cat(list.empty() ? "" : ",", r);
  const int node = unit_nodes_.at(static_cast<size_t>(unit));
  return detail::str_cat("node ", node, " (GROUP_RANK ", node, ", rank",
                         ranks.size() == 1 ? " " : "s ", list, ")");
}

std::string StragglerWatch::why_kept(const RunState& run, const StepContext& step, int unit) const {
  const int nodes = static_cast<int>(units_.size());
  if (!run.config.config.elastic.drop_stragglers) return "elastic.drop_stragglers = false";
  if (!by_node_) return "the job runs on one node, and only whole nodes are left out";
  if (place_.min_nodes <= 0)
    return "the job was not started by meshrun --nnodes MIN:MAX, so it cannot go on smaller";
  if (nodes - 1 < place_.min_nodes)
    return detail::str_cat("the job has ", nodes, " nodes and meshrun --nnodes says at least ",
                           place_.min_nodes);
  if (unit_nodes_.at(static_cast<size_t>(unit)) == 0 && place_.first_node_stays)
    return "it hosts the rendezvous store (the node with --node-rank 0 must stay)";
  if (run.checkpoints == nullptr)
    return "checkpoints are off (ckpt.interval = 0), so the others would start over";
  if (step.last) return "this is the run's last step";
  return {};
}

void StragglerWatch::after_step(RunState& run, StepContext& step) {
  if (leaving_) {
    // A rollback rewound the step that named it before it could stop: stop at this one.
    step.checkpoint_now = true;
    return;
  }
  const std::vector<double>& ranks = step.outcome.rank_step_s;
  if (!enabled_ || ranks.size() != static_cast<size_t>(run.world)) return;
  std::vector<double> times;
  for (const std::vector<int>& unit : units_) {
    double slowest = 0;
    for (int r : unit) slowest = std::max(slowest, ranks[static_cast<size_t>(r)]);
    times.push_back(slowest);
  }
  const std::optional<StragglerVerdict> v = detector_.observe(times);
  if (!v) return;
  named_->inc();
  const ElasticConfig& e = run.config.config.elastic;
  const std::string kept = why_kept(run, step, v->unit);
  std::ostringstream line;
  line << "straggler: " << describe_unit(v->unit) << " took " << std::fixed << std::setprecision(2)
       << v->factor << "x the median compute time of the other " << (by_node_ ? "nodes" : "ranks")
       << " for " << e.straggler_steps
       << " consecutive steps (elastic.straggler_factor = " << e.straggler_factor << ")";
  if (kept.empty()) {
    leaving_ = v->unit;
    step.checkpoint_now = true;
    const size_t rest = units_.size() - 1;
    line << "; leaving it out: every rank checkpoints at step " << step.step << " and stops, and "
         << (rest == 1 ? std::string("the other node goes")
                       : detail::str_cat("the other ", rest, " nodes go"))
         << " on from that checkpoint";
  } else {
    line << "; not left out: " << kept;
  }
  std::vector<int> unit_ranks = units_.at(static_cast<size_t>(v->unit));
  const nlohmann::json event{
      {"unit", by_node_ ? "node" : "rank"},
      {"index", by_node_ ? unit_nodes_.at(static_cast<size_t>(v->unit)) : v->unit},
      {"ranks", unit_ranks},
      {"factor", v->factor},
      {"steps", e.straggler_steps},
      {"left_out", kept.empty()}};
  step.record["straggler"] = event;
  run.log(line.str(), nlohmann::json{{"straggler", event}});
}

void StragglerWatch::on_step_end(RunState& run, StepContext& step) {
  if (!leaving_) return;
  // The checkpoint policy, earlier in the list, started this step's save; the job may only
  // meet again once every rank's part of it is on disk.
  run.checkpoints->wait();
  run.result.regrouped = true;
  run.result.left_out = *leaving_ == my_unit_;
  run.log(detail::str_cat("stopped at step ", step.step,
                          " with its checkpoint saved; the job meets again without ",
                          describe_unit(*leaving_)),
          nullptr);
  step.stop = true;
}

}  // namespace meshtrain::runtime
