#include "meshtrain/plan/planner.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b",
          "dense-7b",  "dense-70b", "dense-175b"};
}

ModelShape model_preset(const std::string& name) {
  if (name == "gpt2-124m") return {12, 768, 12, 50257, 1024, true, true};
  if (name == "gpt2-350m") return {24, 1024, 16, 50257, 1024, true, true};
  if (name == "gpt2-774m") return {36, 1280, 20, 50257, 1024, true, true};
  if (name == "gpt2-1.5b") return {48, 1600, 25, 50257, 1024, true, true};
  if (name == "dense-7b") return {32, 4096, 32, 32000, 4096, false, false};
  if (name == "dense-70b") return {80, 8192, 64, 32000, 4096, false, false};
  if (name == "dense-175b") return {96, 12288, 96, 50257, 2048, true, true};
  std::string names;
  for (const auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  MT_THROW(ValueError, "unknown model preset \"", name, "\"; known: ", names,
           " (or --model-config FILE)");
}

Plan make_plan(const TrainSetup& job, const ClusterSpec& cluster, const PlanOptions& opts) {
  const ModelShape& m = job.model;
  MemoryInput probe;
  probe.model = m;
  validate(probe);  // the shape itself
  if (job.global_batch <= 0) MT_THROW(ValueError, "the global batch must be > 0");
  if (cluster.nodes <= 0 || cluster.devices_per_node <= 0)
    MT_THROW(ValueError, "the cluster needs at least one node with one device");
  const Precision precision = parse_precision(cluster.precision);
  const int64_t world = cluster.world();
  const double budget = cluster.device_memory * opts.memory_headroom;
  Plan plan;
  plan.tokens_per_step = job.global_batch * job.tokens_per_sequence();

  auto drop = [&](Candidate c, const std::string& kind, const std::string& why) {
    c.reason_kind = kind;
    c.dropped = why;
    ++plan.dropped_by_reason[kind];
    plan.dropped.push_back(std::move(c));
  };

  for (int64_t tp : divisors(world)) {
    if (opts.fixed_tp > 0 && tp != opts.fixed_tp) continue;
    if (m.n_head % tp != 0) continue;  // not a layout at all
    for (int64_t pp : divisors(world / tp)) {
      if (opts.fixed_pp > 0 && pp != opts.fixed_pp) continue;
      if (m.n_layer % pp != 0) continue;
      const int64_t dp = world / (tp * pp);
      Candidate base;
      base.layout.tp = tp;
      base.layout.pp = pp;
      base.layout.dp = dp;
      if (tp > cluster.devices_per_node && !opts.allow_cross_node_tp) {
        drop(base, "cross-node TP",
             "tp " + std::to_string(tp) + " spans more than a node's " +
                 std::to_string(cluster.devices_per_node) + " devices");
        continue;
      }
      if (job.global_batch % dp != 0) {
        drop(base, "batch",
             "global batch " + std::to_string(job.global_batch) + " is not a multiple of dp " +
                 std::to_string(dp));
        continue;
      }
      const int64_t per_replica = job.global_batch / dp;
      for (int64_t B = 1; B <= std::min(per_replica, opts.max_micro_batch); B *= 2) {
        if (opts.fixed_micro_batch > 0 && B != opts.fixed_micro_batch) continue;
        if (per_replica % B != 0) continue;
        const int64_t mbs = per_replica / B;
        Candidate cb = base;
        cb.layout.micro_batch = B;
        cb.layout.micro_batches = mbs;
        if (pp > 1 && mbs < pp) {
          drop(cb, "bubble",
               std::to_string(mbs) + " micro-batches cannot fill " + std::to_string(pp) +
                   " pipeline stages");
          continue;
        }
        std::vector<int> zeros = {0};
        if (dp > 1 && opts.try_zero) zeros = {0, 1, 2, 3};
        for (int z : zeros) {
          if (opts.fixed_zero >= 0 && z != opts.fixed_zero) continue;
          Candidate cz = cb;
          cz.layout.zero_stage = z;
          if (pp > 1 && z >= 2) {
            drop(cz, "zero-2/3 with pp",
                 "under a pipeline ZeRO-2 keeps whole gradients through the program (no lower "
                 "peak than ZeRO-1) and ZeRO-3 is not available");
            continue;
          }
          for (int64_t ckpt :
               opts.try_checkpointing ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0}) {
            std::vector<std::pair<ScheduleKind, int64_t>> scheds = {{ScheduleKind::one_f_one_b, 1}};
            if (pp > 1 && opts.try_interleaved && m.n_layer % (2 * pp) == 0)
              scheds.push_back({ScheduleKind::interleaved, 2});
            for (auto [sched, v] : scheds) {
              for (bool sp : tp > 1 && opts.try_sequence_parallel ? std::vector<bool>{false, true}
                                                                  : std::vector<bool>{false}) {
                Candidate c = cz;
                c.layout.checkpoint_every = ckpt;
                c.layout.schedule = sched;
                c.layout.virtual_stages = v;
                c.layout.sequence_parallel = sp;
                c.memory = estimate_memory(memory_input(job, c.layout, precision));
                c.memory.process = static_cast<int64_t>(cluster.process_memory);
                c.time = estimate_step_time(job, c.layout, cluster);
                if (static_cast<double>(c.memory.total()) > budget) {
                  drop(c, "does not fit",
                       gb(static_cast<double>(c.memory.total())) + " > " + gb(budget) +
                           " per device");
                  continue;
                }
                if (pp > 1 && c.time.bubble > opts.max_bubble * c.time.compute) {
                  drop(c, "bubble",
                       "bubble " +
                           std::to_string(static_cast<int>(100 * c.time.bubble / c.time.compute)) +
                           "% of compute");
                  continue;
                }
                plan.kept.push_back(std::move(c));
              }
            }
          }
        }
      }
    }
  }
  auto faster = [](const Candidate& a, const Candidate& b) {
    if (a.time.total != b.time.total) return a.time.total < b.time.total;
    return a.memory.total() < b.memory.total();
  };
  std::stable_sort(plan.kept.begin(), plan.kept.end(), faster);
  if (plan.kept.empty()) {
    const Candidate* smallest = nullptr;
    for (const Candidate& c : plan.dropped)
      if (c.reason_kind == "does not fit" &&
          (smallest == nullptr || c.memory.total() < smallest->memory.total()))
        smallest = &c;
    if (smallest != nullptr)
      MT_THROW(ValueError, "no layout of ", job.model_name, " fits ", world, " devices of ",
               gb(cluster.device_memory), ": the smallest (", smallest->layout.str(), ") needs ",
               gb(static_cast<double>(smallest->memory.total())),
               " per device; add devices or lower the batch");
    MT_THROW(ValueError, "no layout of ", job.model_name, " with global batch ", job.global_batch,
             " on ", world, " devices: ",
             plan.dropped.empty() ? std::string("heads and layers share no divisor with it")
                                  : plan.dropped.front().dropped);
  }
  return plan;
}

std::string plan_table(const Plan& plan, const TrainSetup& job, const ClusterSpec& cluster,
                       size_t n) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-4s %-34s %9s %9s %9s %9s %10s %8s %6s\n", "#", "layout",
                "state GB", "act GB", "buf GB", "total GB", "step s", "tok/s", "MFU");
  os << line;
  const double peak = cluster.peak_flops;
  for (size_t i = 0; i < std::min(n, plan.kept.size()); ++i) {
    const Candidate& c = plan.kept[i];
    const double state =
        static_cast<double>(c.memory.parameters + c.memory.gradients + c.memory.optimizer_state);
    const double mfu = c.time.model_flops / c.time.total / peak;
    std::snprintf(
        line, sizeof line, "%-4zu %-34s %9.2f %9.2f %9.2f %9.2f %10.4g %8.4g %5.1f%%\n", i + 1,
        c.layout.str().c_str(), state / 1e9, static_cast<double>(c.memory.activations) / 1e9,
        static_cast<double>(c.memory.buffers) / 1e9, static_cast<double>(c.memory.total()) / 1e9,
        c.time.total, c.time.tokens_per_s(plan.tokens_per_step), 100 * mfu);
    os << line;
  }
  os << plan.kept.size() << " layouts fit; dropped:";
  if (plan.dropped_by_reason.empty()) os << " none";
  os << "\n";
  for (const auto& [kind, count] : plan.dropped_by_reason) {
    const Candidate* ex = nullptr;
    for (const Candidate& c : plan.dropped)
      if (c.reason_kind == kind) {
        ex = &c;
        break;
      }
    os << "  " << count << " " << kind << " (e.g. " << ex->layout.str() << ": " << ex->dropped
       << ")\n";
  }
  (void)job;
  return os.str();
}

std::string parallel_toml(const Layout& l) {
  std::ostringstream os;
  os << "[parallel]\n"
     << "zero_stage = " << l.zero_stage << "\n"
     << "pp = " << l.pp << "\n"
     << "tp = " << l.tp << "\n"
     << "schedule = \"" << schedule_kind_name(l.schedule) << "\"\n"
     << "micro_batches = " << (l.pp > 1 ? l.micro_batches : 1) << "\n"
     << "virtual_stages = " << l.virtual_stages << "\n"
     << "sequence_parallel = " << (l.sequence_parallel ? "true" : "false") << "\n";
  return os.str();
}

}  // namespace meshtrain::plan
