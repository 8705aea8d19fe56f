#include "meshtrain/plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshtrain/plan/planner.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/splitmix64.h"

namespace meshtrain::plan {
namespace {

struct Kind {
  const char* model;
  int64_t dp, tp, pp;
  double weight;
};

// Most jobs are small, most device-hours go to big ones (as on shared training clusters).
constexpr Kind kKinds[] = {
    {"gpt2-124m", 1, 1, 1, 0.20}, {"gpt2-124m", 2, 1, 1, 0.15}, {"gpt2-350m", 4, 1, 1, 0.15},
    {"dense-7b", 1, 4, 1, 0.10},  {"dense-7b", 1, 8, 1, 0.12},  {"dense-7b", 2, 8, 1, 0.10},
    {"dense-7b", 2, 8, 2, 0.08},  {"dense-70b", 2, 8, 4, 0.06}, {"dense-70b", 2, 8, 8, 0.04},
};

double uniform(uint64_t key, uint64_t n) {
  return (static_cast<double>(splitmix64_at(key, n) >> 11) + 0.5) / 9007199254740992.0;
}

}  // namespace

std::string policy_name(Policy p) {
  switch (p) {
    case Policy::kTopology:
      return "topology";
    case Policy::kRoundRobin:
      return "round-robin";
    case Policy::kFirstFit:
      return "first-fit";
  }
  return "?";
}

std::vector<TraceJob> synthetic_trace(int64_t jobs, uint64_t seed, double load,
                                      int64_t cluster_devices) {
  const uint64_t key = splitmix64_key(seed, 0x7ace);
  std::vector<TraceJob> out;
  double total_weight = 0, mean_devices = 0;
  for (const Kind& k : kKinds) total_weight += k.weight;
  for (const Kind& k : kKinds)
    mean_devices += k.weight / total_weight * static_cast<double>(k.dp * k.tp * k.pp);
  const double mean_duration = 3600;
  // Poisson arrivals offering `load` x the cluster: rate x mean devices x duration = load x D.
  const double rate = load * static_cast<double>(cluster_devices) / (mean_devices * mean_duration);
  double t = 0;
  for (int64_t i = 0; i < jobs; ++i) {
    const auto n = static_cast<uint64_t>(i) * 4;
    t += -std::log(uniform(key, n)) / rate;
    double pick = uniform(key, n + 1) * total_weight;
    const Kind* kind = &kKinds[0];
    for (const Kind& k : kKinds) {
      kind = &k;
      if ((pick -= k.weight) <= 0) break;
    }
    TraceJob j;
    j.arrival = t;
    j.duration = -std::log(uniform(key, n + 2)) * mean_duration;
    j.request.name = "job" + std::to_string(i);
    j.request.dp = kind->dp;
    j.request.tp = kind->tp;
    j.request.pp = kind->pp;
    j.request.priority = uniform(key, n + 3) < 0.1 ? 1 : 0;
    TrainSetup setup;
    setup.model_name = kind->model;
    setup.model = model_preset(kind->model);
    Layout l;
    l.dp = kind->dp;
    l.tp = kind->tp;
    l.pp = kind->pp;
    l.micro_batch = 1;
    l.micro_batches = std::max<int64_t>(4 * kind->pp, 8);
    l.checkpoint_every = 1;
    setup.global_batch = l.dp * l.micro_batch * l.micro_batches;
    j.request.traffic = traffic_per_step(setup, l, Precision::kMixed);
    out.push_back(std::move(j));
  }
  return out;
}

SimResult simulate(const Inventory& inv, const std::vector<TraceJob>& trace, Policy policy) {
  ClusterState state(inv);
  const double devices = static_cast<double>(state.total_devices());
  for (const TraceJob& j : trace)
    if (static_cast<double>(j.request.devices()) > devices)
      MT_THROW(ValueError, "trace job ", j.request.name, " wants ", j.request.devices(),
               " devices; the cluster has ", state.total_devices());
  SimResult r;
  r.policy = policy_name(policy);
  r.jobs = static_cast<int64_t>(trace.size());
  std::vector<size_t> order(trace.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return trace[a].arrival < trace[b].arrival; });
  std::vector<size_t> queue;
  struct Running {
    size_t job;
    double end;
  };
  std::vector<Running> running;
  size_t next = 0;
  double now = order.empty() ? 0 : trace[order[0]].arrival;
  const double start = now;
  double busy = 0, waited = 0;
  while (next < order.size() || !queue.empty() || !running.empty()) {
    // Finish what ends now, admit what arrives now.
    for (auto it = running.begin(); it != running.end();) {
      if (it->end <= now) {
        state.release(trace[it->job].request.name);
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    while (next < order.size() && trace[order[next]].arrival <= now) queue.push_back(order[next++]);
    std::stable_sort(queue.begin(), queue.end(), [&](size_t a, size_t b) {
      return trace[a].request.priority > trace[b].request.priority;
    });
    for (auto it = queue.begin(); it != queue.end();) {
      const TraceJob& j = trace[*it];
      auto placed = state.place(j.request, policy);
      if (!placed) {
        ++it;
        continue;
      }
      const PlacedTraffic t = state.traffic(j.request, *placed);
      r.cross_node_bytes += t.cross_node;
      r.cross_rack_bytes += t.cross_rack;
      r.total_bytes += t.total;
      const double wait = now - j.arrival;
      waited += wait;
      r.max_wait = std::max(r.max_wait, wait);
      busy += j.duration * static_cast<double>(j.request.devices());
      running.push_back({*it, now + j.duration});
      it = queue.erase(it);
    }
    double t_next = std::numeric_limits<double>::infinity();
    if (next < order.size()) t_next = trace[order[next]].arrival;
    for (const Running& x : running) t_next = std::min(t_next, x.end);
    if (std::isinf(t_next)) {
      MT_CHECK(queue.empty(), "simulation stalled with ", queue.size(), " jobs queued");
      break;
    }
    now = t_next;
  }
  r.makespan = now - start;
  r.utilisation = r.makespan > 0 ? busy / (devices * r.makespan) : 0;
  r.mean_wait = trace.empty() ? 0 : waited / static_cast<double>(trace.size());
  return r;
}

}  // namespace meshtrain::plan
