// See plan_command.h.
#include "apps/meshtrain/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/plan/indexed_job_patch.h"
#include "meshtrain/plan/planner.h"
#include "meshtrain/plan/simulator.h"
#include "meshtrain/runtime/config.h"
#include "meshtrain/runtime/memory_guard.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"

namespace meshtrain::apps {
namespace {

struct PlanArgs {
  std::string model, model_config, cluster = "cpu-host", out, calibrate_out, optimizer = "adamw";
  int64_t global_batch = 0, seq_len = 0, nodes = 0, devices_per_node = 0, top = 5;
  double device_memory_gb = 0;
  int64_t tp = -1, pp = -1, zero = -1, micro_batch = -1;
  bool calibrate = false, predict = false;
  int64_t ranks = 2, threads = 0;
};

plan::ClusterSpec cluster_from(const PlanArgs& a) {
  plan::ClusterSpec c;
  if (a.calibrate) {
    c = plan::calibrate(a.ranks, a.threads, &std::cout);
    std::cout << plan::cluster_to_toml(c);
    if (!a.calibrate_out.empty()) {
      write_file_atomic(a.calibrate_out, plan::cluster_to_toml(c));
      std::cout << "calibration written to " << a.calibrate_out << " (use it with --cluster FILE)"
                << std::endl;
    }
  } else if (std::filesystem::exists(a.cluster)) {
    c = plan::load_cluster(a.cluster);
  } else {
    c = plan::cluster_preset(a.cluster);
  }
  if (a.nodes > 0) c.nodes = a.nodes;
  if (a.devices_per_node > 0) c.devices_per_node = a.devices_per_node;
  if (a.device_memory_gb > 0) c.device_memory = a.device_memory_gb * 1e9;
  return c;
}

// --predict: the layout the config itself asks for (parallel.zero_stage, pp, tp, schedule,
// micro_batches, virtual_stages, sequence_parallel, data.batch_size, train.grad_accum_steps,
// model.activation_checkpointing) on every device of the cluster, as
// the trainer's memory guard sees it, with its step time: one readable block and a JSON line.
int run_predict(const runtime::TrainConfig& config, plan::TrainSetup job,
                const plan::ClusterSpec& cluster) {
  if (cluster.world() > std::numeric_limits<int>::max())
    MT_THROW(ValueError, "--predict: ", cluster.world(), " ranks is too many");
  const int world = static_cast<int>(cluster.world());
  const plan::MemoryInput in = runtime::memory_input(runtime::resolve_config(config), world);
  plan::MemoryBreakdown mem = plan::estimate_memory(in);
  mem.process = static_cast<int64_t>(cluster.process_memory);
  if (world % (in.pp * in.tp) != 0)
    MT_THROW(ValueError, "--predict: parallel.pp x parallel.tp = ", in.pp * in.tp,
             " does not divide the cluster's ", world, " devices");
  const plan::Layout l = plan::layout_of(in);
  job.global_batch = l.dp * l.micro_batch * l.micro_batches;
  const plan::StepTime t = plan::estimate_step_time(job, l, cluster);
  const auto mib = [](int64_t b) { return static_cast<double>(b) / 1048576.0; };
  char line[1024];
  std::snprintf(line, sizeof line,
                "predict: %s on %lld x %lld %s devices\n"
                "  memory per rank %.1f MiB: process %.1f, parameters %.1f, gradients %.1f, "
                "optimizer state %.1f, activations %.1f, buffers %.1f\n"
                "  step %.4g s: GEMMs %.4g, element-wise %.4g, optimizer %.4g, bubble %.4g, "
                "tensor-parallel %.4g, pipeline p2p %.4g, data-parallel exposed %.4g (of %.4g)\n",
                l.str().c_str(), static_cast<long long>(cluster.nodes),
                static_cast<long long>(cluster.devices_per_node), cluster.name.c_str(),
                mib(mem.total()), mib(mem.process), mib(mem.parameters), mib(mem.gradients),
                mib(mem.optimizer_state), mib(mem.activations), mib(mem.buffers), t.total, t.gemm,
                t.elementwise, t.optimizer, t.bubble, t.tp_comm, t.pp_comm, t.dp_exposed,
                t.dp_comm);
  std::cout << line
            << nlohmann::json{{"layout", l.str()},
                              {"ranks", world},
                              {"memory_bytes", mem.total()},
                              {"process_bytes", mem.process},
                              {"parameter_bytes", mem.parameters},
                              {"gradient_bytes", mem.gradients},
                              {"optimizer_state_bytes", mem.optimizer_state},
                              {"activation_bytes", mem.activations},
                              {"buffer_bytes", mem.buffers},
                              {"step_s", t.total},
                              {"compute_s", t.compute},
                              {"gemm_s", t.gemm},
                              {"elementwise_s", t.elementwise},
                              {"optimizer_s", t.optimizer},
                              {"bubble_s", t.bubble},
                              {"tp_comm_s", t.tp_comm},
                              {"pp_comm_s", t.pp_comm},
                              {"dp_comm_s", t.dp_comm},
                              {"dp_exposed_s", t.dp_exposed}}
                   .dump()
            << std::endl;
  return 0;
}

int run_plan(const PlanArgs& a) {
  if (a.model.empty() && a.model_config.empty()) {
    if (a.calibrate) {
      cluster_from(a);
      return 0;
    }
    MT_THROW(ValueError, "meshtrain plan needs --model PRESET or --model-config FILE");
  }
  if (!a.model.empty() && !a.model_config.empty())
    MT_THROW(ValueError, "give either --model or --model-config, not both");
  // The trainer's config is the base of what is written: the model section from the file, or
  // the preset's shape over the defaults.
  runtime::TrainConfig config = runtime::load_config(a.model_config);
  // The memory and time models know the transformer's tensors and GEMMs only.
  if (config.model.kind != "gpt")
    MT_THROW(ValueError, a.model_config, ": model.kind = \"", config.model.kind,
             "\": meshtrain plan models the GPT only for now; plan a GPT config or train this "
             "one with its own batch and layout");
  plan::TrainSetup job;
  if (!a.model.empty()) {
    job.model_name = a.model;
    job.model = plan::model_preset(a.model);
    config.model.n_layer = job.model.n_layer;
    config.model.n_embd = job.model.n_embd;
    config.model.n_head = job.model.n_head;
    config.model.vocab_size = job.model.vocab_size;
    config.model.block_size = job.model.block_size;
    config.model.bias = job.model.bias;
    config.model.tie_embeddings = job.model.tie_embeddings;
  } else {
    job.model_name = a.model_config;
    job.model = runtime::model_shape(config);
  }
  job.seq_len = a.seq_len;
  if (a.seq_len > job.model.block_size)
    MT_THROW(ValueError, "--seq-len ", a.seq_len, " is longer than the model's context of ",
             job.model.block_size);
  job.optimizer = plan::parse_optimizer(a.optimizer);
  job.bucket_bytes = static_cast<int64_t>(config.dist.bucket_mb * (1 << 20));
  job.global_batch =
      a.global_batch > 0 ? a.global_batch : config.data.batch_size * config.train.grad_accum_steps;
  if (a.predict && a.model_config.empty())
    MT_THROW(ValueError, "--predict needs --model-config FILE (the run whose layout it predicts)");
  const plan::ClusterSpec cluster = cluster_from(a);
  if (a.predict) return run_predict(config, job, cluster);
  plan::PlanOptions opts;
  opts.fixed_tp = a.tp;
  opts.fixed_pp = a.pp;
  opts.fixed_zero = a.zero;
  opts.fixed_micro_batch = a.micro_batch;
  std::cout << "plan: " << job.model_name << " ("
            << static_cast<double>(plan::model_params(job.model)) / 1e6 << " M parameters), "
            << "global batch " << job.global_batch << " x " << job.tokens_per_sequence()
            << " tokens, on " << cluster.nodes << " x " << cluster.devices_per_node << " "
            << cluster.name << " devices of " << cluster.device_memory / 1e9 << " GB" << std::endl;
  const plan::Plan p = plan::make_plan(job, cluster, opts);
  std::cout << plan::plan_table(p, job, cluster, static_cast<size_t>(a.top));
  if (a.out.empty()) return 0;

  // The best layout this trainer can run: a layout that needs a strategy not available yet is
  // passed over with a line saying so, never written as a config the trainer would refuse.
  const runtime::TrainConfig base = config;
  const plan::Candidate* chosen = nullptr;
  std::string passed_over;
  for (const plan::Candidate& c : p.kept) {
    config = base;
    config.data.batch_size = c.layout.micro_batch;
    // A pipeline takes the replica's batch (data.batch_size x train.grad_accum_steps) as its
    // parallel.micro_batches micro-batches: the same count, so each is data.batch_size.
    config.train.grad_accum_steps = c.layout.micro_batches;
    config.model.activation_checkpointing =
        c.layout.checkpoint_every == 0
            ? "none"
            : (c.layout.checkpoint_every == 1
                   ? "all"
                   : "every:" + std::to_string(c.layout.checkpoint_every));
    config.optim.name = a.optimizer == "adamw" ? "adamw" : "sgd";
    config.train.device = cluster.device;
    config.train.precision = cluster.precision == "f32" ? "f32" : "bf16";
    if (a.seq_len > 0) config.model.block_size = a.seq_len;
    config.parallel.zero_stage = c.layout.zero_stage;
    config.parallel.pp = c.layout.pp;
    config.parallel.tp = c.layout.tp;
    config.parallel.schedule = std::string(plan::schedule_kind_name(c.layout.schedule));
    config.parallel.micro_batches = c.layout.pp > 1 ? c.layout.micro_batches : 1;
    config.parallel.virtual_stages = c.layout.virtual_stages;
    config.parallel.sequence_parallel = c.layout.sequence_parallel;
    try {
      runtime::validate(config);
      chosen = &c;
      break;
    } catch (const ValueError& e) {
      if (passed_over.empty()) passed_over = c.layout.str() + ": " + e.what();
    }
  }
  if (chosen == nullptr)
    MT_THROW(ValueError, "plan: none of the ", p.kept.size(),
             " layouts that fit can be trained by this build (first: ", passed_over, ")");
  if (chosen != &p.kept.front())
    std::cout << "note: passed over layouts this build cannot train yet (first: " << passed_over
              << ")" << std::endl;
  const plan::Candidate& best = *chosen;
  char head[512];
  std::snprintf(head, sizeof head,
                "# meshtrain plan: %s on %lld x %lld %s devices: %s\n"
                "# predicted %.2f GB per device, %.4g s per step\n",
                job.model_name.c_str(), static_cast<long long>(cluster.nodes),
                static_cast<long long>(cluster.devices_per_node), cluster.name.c_str(),
                best.layout.str().c_str(), static_cast<double>(best.memory.total()) / 1e9,
                best.time.total);
  write_file_atomic(a.out, std::string(head) + runtime::to_toml(config));
  std::cout << "wrote " << a.out << " (" << best.layout.str() << ")" << std::endl;
  return 0;
}

struct PlaceArgs {
  std::string inventory, jobs, policy = "topology", out_dir;
  bool preempt = false, simulate = false;
  int64_t racks = 4, nodes_per_rack = 16, devices = 8, island = 8, trace_jobs = 300;
  uint64_t seed = 7;
  double load = 0.9;
};

int run_simulation(const PlaceArgs& a) {
  const plan::Inventory inv =
      a.inventory.empty()
          ? plan::synthetic_inventory(a.racks, a.nodes_per_rack, a.devices, a.island)
          : plan::load_inventory(a.inventory);
  int64_t devices = 0;
  for (const auto& n : inv.nodes) devices += n.devices;
  const auto trace = plan::synthetic_trace(a.trace_jobs, a.seed, a.load, devices);
  std::cout << "simulate: " << trace.size() << " jobs on " << inv.nodes.size() << " nodes ("
            << devices << " devices), offered load " << a.load << ", seed " << a.seed << std::endl;
  std::printf("%-12s %12s %14s %14s %18s %18s\n", "policy", "utilisation", "mean wait s",
              "max wait s", "cross-node GB/step", "cross-rack GB/step");
  for (plan::Policy p :
       {plan::Policy::kTopology, plan::Policy::kRoundRobin, plan::Policy::kFirstFit}) {
    const plan::SimResult r = plan::simulate(inv, trace, p);
    std::printf("%-12s %12.3f %14.0f %14.0f %18.1f %18.1f\n", r.policy.c_str(), r.utilisation,
                r.mean_wait, r.max_wait, r.cross_node_bytes / 1e9, r.cross_rack_bytes / 1e9);
  }
  std::cout << "(bytes per step summed over the trace's jobs, each as placed)" << std::endl;
  return 0;
}

int run_place(const PlaceArgs& a) {
  if (a.simulate) return run_simulation(a);
  if (a.inventory.empty() || a.jobs.empty())
    MT_THROW(ValueError, "meshtrain place needs --inventory FILE and --jobs FILE (or --simulate)");
  plan::ClusterState state(plan::load_inventory(a.inventory));
  auto jobs = plan::load_jobs(a.jobs);
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const auto& x, const auto& y) { return x.priority > y.priority; });
  const plan::Policy policy = plan::parse_policy(a.policy);
  if (!a.out_dir.empty()) std::filesystem::create_directories(a.out_dir);
  int waiting = 0;
  for (const plan::JobRequest& j : jobs) {
    auto p = state.place(j, policy, a.preempt);
    if (!p) {
      std::cout << "job " << j.name << ": waits (needs " << j.devices() << " devices, "
                << state.free_devices() << " free)" << std::endl;
      ++waiting;
      continue;
    }
    std::vector<std::string> nodes;
    for (const auto& r : p->ranks) {
      const std::string& n = state.inventory().nodes[static_cast<size_t>(r.node)].name;
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
    std::cout << "job " << j.name << ": " << j.devices() << " ranks (dp " << j.dp << " tp " << j.tp
              << " pp " << j.pp << ") on " << nodes.size() << " node(s):";
    for (const auto& n : nodes) std::cout << " " << n;
    std::cout << std::endl;
    for (const auto& v : p->preempted)
      std::cout << "  preempted " << v
                << " (it resumes from its latest checkpoint when placed again)" << std::endl;
    if (!a.out_dir.empty()) {
      const std::filesystem::path d(a.out_dir);
      write_file_atomic(d / (j.name + ".ranks"), plan::rank_table(state.inventory(), *p));
      write_file_atomic(d / (j.name + ".hostfile"), plan::hostfile(state.inventory(), *p));
      write_file_atomic(d / (j.name + ".meshrun.sh"),
                        plan::meshrun_commands(state.inventory(), *p));
      write_file_atomic(d / (j.name + ".affinity.yaml"),
                        plan::node_affinity_yaml(state.inventory(), *p));
      write_file_atomic(d / (j.name + ".k8s-patch.yaml"),
                        plan::indexed_job_patch_yaml(state.inventory(), *p));
      const auto args = plan::indexed_job_args_patch_yaml(state.inventory(), *p);
      const auto gpus = plan::indexed_job_gpu_patch_yaml(state.inventory(), *p);
      if (args && gpus) {
        write_file_atomic(d / (j.name + ".k8s-args.yaml"), *args);
        write_file_atomic(d / (j.name + ".k8s-gpu.yaml"), *gpus);
      } else
        std::cout << "  " << j.name
                  << ": the nodes hold different numbers of ranks, which one Indexed Job pod "
                     "template cannot express; no "
                  << j.name << ".k8s-args.yaml or .k8s-gpu.yaml (use " << j.name << ".meshrun.sh)"
                  << std::endl;
    }
  }
  if (!a.out_dir.empty())
    std::cout << "rank tables, hostfiles, meshrun commands and node affinity in " << a.out_dir
              << std::endl;
  std::cout << state.free_devices() << " of " << state.total_devices() << " devices free, "
            << waiting << " job(s) waiting" << std::endl;
  return 0;
}

}  // namespace

std::function<int()> add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan",
      "choose a parallel layout (dp x tp x pp, ZeRO, micro-batches, checkpointing) that "
      "fits and runs fastest, and write it as a config");
  std::string models;
  for (const auto& n : plan::model_preset_names()) models += (models.empty() ? "" : ", ") + n;
  std::string clusters;
  for (const auto& n : plan::cluster_preset_names()) clusters += (clusters.empty() ? "" : ", ") + n;
  cmd->add_option("--model", a->model, "model preset: " + models);
  cmd->add_option("--model-config", a->model_config,
                  "a trainer config whose [model] (and the rest) the written config keeps");
  cmd->add_option("--global-batch", a->global_batch,
                  "sequences per optimizer step (default: the config's data.batch_size x "
                  "train.grad_accum_steps)");
  cmd->add_option("--seq-len", a->seq_len, "tokens per sequence (default: the model's context)");
  cmd->add_option("--cluster", a->cluster,
                  "cluster preset (" + clusters + ") or a TOML file with a [cluster] table");
  cmd->add_option("--nodes", a->nodes, "number of nodes (overrides the cluster's)");
  cmd->add_option("--devices-per-node", a->devices_per_node, "devices (ranks) per node");
  cmd->add_option("--device-memory-gb", a->device_memory_gb, "memory per device, GB");
  cmd->add_option("--optimizer", a->optimizer, "adamw, sgd (momentum) or sgd-plain");
  cmd->add_option("--tp", a->tp, "fix the tensor-parallel degree");
  cmd->add_option("--pp", a->pp, "fix the pipeline degree");
  cmd->add_option("--zero", a->zero, "fix the ZeRO stage (0-3)");
  cmd->add_option("--micro-batch", a->micro_batch, "fix the micro-batch size");
  cmd->add_option("--top", a->top, "layouts to show")->check(CLI::PositiveNumber);
  cmd->add_option("--out", a->out,
                  "write the best layout as a trainer config ([model], [data], [train], ... and "
                  "[parallel])");
  cmd->add_flag("--predict", a->predict,
                "predict the memory per rank and step time of the layout --model-config asks "
                "for, on every device of the cluster, instead of searching (JSON line last)");
  cmd->add_flag("--calibrate", a->calibrate,
                "measure this machine (GEMM FLOP/s, element-wise bandwidth, shm and tcp "
                "all-reduce) and plan for it");
  cmd->add_option("--ranks", a->ranks, "ranks per node to calibrate with")
      ->check(CLI::Range(2, 64));
  cmd->add_option("--threads", a->threads, "threads per rank to calibrate with (0: cores / ranks)");
  cmd->add_option("--calibrate-out", a->calibrate_out, "write the calibrated cluster TOML here");
  return [cmd, a]() -> int {
    if (!cmd->parsed()) return -1;
    return run_plan(*a);
  };
}

std::function<int()> add_place_command(CLI::App& app) {
  auto a = std::make_shared<PlaceArgs>();
  auto* cmd = app.add_subcommand(
      "place",
      "place a queue of jobs on a cluster inventory knowing its racks and NVLink "
      "islands (rank order, hostfile, meshrun commands, Kubernetes node affinity), or "
      "simulate a trace beside round-robin and first-fit");
  cmd->add_option("--inventory", a->inventory,
                  "TOML with one [[node]] per node: name, rack, devices, islands, used, "
                  "device_memory_gb");
  cmd->add_option("--jobs", a->jobs,
                  "TOML with one [[job]] per job: name, devices or dp/tp/pp, priority, memory_gb, "
                  "layout (a config written by `meshtrain plan`)");
  cmd->add_option("--policy", a->policy, "topology, round-robin or first-fit")
      ->check(CLI::IsMember({"topology", "round-robin", "first-fit"}));
  cmd->add_flag("--preempt", a->preempt,
                "a job may stop jobs of lower priority (they resume from their checkpoints)");
  cmd->add_option("--out-dir", a->out_dir,
                  "write JOB.ranks, JOB.hostfile, JOB.meshrun.sh, JOB.affinity.yaml, and "
                  "JOB.k8s-patch.yaml, JOB.k8s-args.yaml, JOB.k8s-gpu.yaml (kustomize patches for "
                  "deploy/k8s/indexed-job) here");
  cmd->add_flag("--simulate", a->simulate,
                "replay a synthetic job trace under each policy (on --inventory or a synthetic "
                "cluster)");
  cmd->add_option("--racks", a->racks, "synthetic cluster: racks");
  cmd->add_option("--nodes-per-rack", a->nodes_per_rack, "synthetic cluster: nodes per rack");
  cmd->add_option("--devices", a->devices, "synthetic cluster: devices per node");
  cmd->add_option("--island", a->island, "synthetic cluster: devices per NVLink island");
  cmd->add_option("--trace-jobs", a->trace_jobs, "simulated jobs");
  cmd->add_option("--seed", a->seed, "trace seed");
  cmd->add_option("--load", a->load, "offered load (device demand / devices)");
  return [cmd, a]() -> int {
    if (!cmd->parsed()) return -1;
    return run_place(*a);
  };
}

}  // namespace meshtrain::apps
