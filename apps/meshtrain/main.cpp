// The meshtrain command: train, sample and data preparation. Library errors become one line on
// stderr and an exit status: 2 for bad input (config, flags, files), 1 for anything else.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/meshtrain/bench_command.h"
#include "apps/meshtrain/ckpt_command.h"
#include "apps/meshtrain/env_command.h"
#include "apps/meshtrain/obs_commands.h"
#include "apps/meshtrain/plan_command.h"
#include "apps/meshtrain/tls_command.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/termination.h"
#include "meshtrain/cuda/availability.h"
#include "meshtrain/data/byte_tokenizer.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/remote_dataset.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/expert/expert_groups.h"
#include "meshtrain/runtime/config.h"
#include "meshtrain/runtime/dist_env.h"
#include "meshtrain/runtime/engine_factory.h"
#include "meshtrain/runtime/parameter_server_role.h"
#include "meshtrain/runtime/regroup_exit_status.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/runtime/tls_config.h"
#include "meshtrain/runtime/trainer.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/util/env_registry.h"

using namespace meshtrain;

namespace {

int cmd_train(const std::string& config_path, const std::vector<std::string>& overrides,
              bool print_config) {
  // meshrun --ps-servers N: a parameter-server job whose last N ranks serve. Applied before the
  // --set overrides, which may still change the servers' settings.
  std::vector<std::string> all_overrides;
  if (const auto servers = env_value(Env::ps_servers); servers && !servers->empty())
    all_overrides = {"parallel.mode=parameter_server", "parallel.ps.servers=" + *servers};
  all_overrides.insert(all_overrides.end(), overrides.begin(), overrides.end());
  runtime::TrainConfig config = runtime::load_config(config_path, all_overrides);
  if (print_config) {
    std::cout << runtime::to_toml(config);
    return 0;
  }
  runtime::TrainerOptions opts;
  opts.progress = &std::cout;
  // The launcher's environment, read once here and passed down.
  const runtime::DistEnv env = runtime::discover_dist_env();
  opts.ranks_on_host = env.local_world_size;
  opts.local_rank = env.local_rank;
  opts.restart_count = env.restart_count;
  opts.job_id = runtime::job_id(env);
  opts.place.node = env.group_rank;
  opts.place.min_nodes = env.elastic_min_nodes;
  // meshrun's tcp store lives with the node of --node-rank 0, the first of every round.
  opts.place.first_node_stays = env.agent_hosts_store && env.store_backend == "tcp";
  // Every key and combination checked for this world size before any rank meets another.
  // A parameter-server job trains on its workers; its last parallel.ps.servers ranks serve.
  const bool param_server = config.parallel.mode == "parameter_server";
  const int train_world =
      param_server ? runtime::ps_worker_count(config, env.world_size) : env.world_size;
  runtime::ResolvedConfig resolved = runtime::resolve_config(config, train_world);
  // The faults a test injects, read once here and passed down (none outside the fault tests).
  opts.faults = FaultPlan::from_env();
  // TLS (dist.tls or MESHTRAIN_TLS) for the store and the tcp collectives; a missing file stops
  // the run here (exit 2), on one rank as on many.
  comm::set_default_tls(runtime::tls_from_config(config));
  if (env.world_size > 1) {
    // A machine without a usable GPU cannot run NCCL: say it as a configuration error (exit 2,
    // not restarted), before the store, instead of the CUDA runtime's message from inside it.
    if (config.dist.backend == "nccl" && cuda::device_count() == 0)
      MT_THROW(ValueError,
               "config: dist.backend = \"nccl\" needs a CUDA device on every rank, "
               "and rank ",
               env.rank, " has none (", cuda::unavailable_reason(),
               "); use dist.backend = \"shm\" or \"tcp\" here");
    // Data parallelism across the ranks the launcher started (meshrun, torchrun, srun, mpirun).
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.dist.timeout_s * 1000));
    opts.store = runtime::connect_store(env, timeout);
    comm::register_builtin_backends();
    comm::ProcessGroupOptions po;
    po.name = "world";
    po.timeout = timeout;
    po.master_addr = env.master_addr;
    // The groups the engine's mesh will split off share the world's /dev/shm and core budget.
    if (const auto dims = runtime::engine_mesh_dims(config, env.world_size);
        dims[0].size * dims[1].size * dims[2].size == env.world_size) {
      po.shm_budget.planned_groups = parallel::DeviceMesh::split_sizes(dims);
      // Expert parallelism splits its groups off the data-parallel group, which is then the
      // world (it runs without pp and tp).
      if (dims[1].size == env.world_size)
        for (int n :
             parallel::expert_split_sizes(dims[1].size, static_cast<int>(config.parallel.ep)))
          po.shm_budget.planned_groups.push_back(n);
    }
    if (env.replacement > 0) {
      // This rank's process failed and the job went on without it (an asynchronous
      // parameter-server worker): no group of the job to meet, only new links to the servers.
      MT_CHECK(param_server, "meshrun replaces a rank alone only in a parameter-server job");
      po.shm_budget.host_ranks = env.local_world_size;
      const runtime::PsRoles roles =
          runtime::join_ps_job(config, env.rank, env.world_size, opts.store, po);
      opts.param_server = roles.worker_spec(config);
      opts.group = roles.workers;
    } else {
      opts.group =
          comm::make_process_group(config.dist.backend, opts.store, env.rank, env.world_size, po);
    }
    if (param_server && env.replacement == 0) {
      const runtime::PsRoles roles = runtime::split_ps_roles(config, opts.group, opts.store);
      if (roles.is_server()) return runtime::run_parameter_server(resolved, roles, &std::cout);
      opts.param_server = roles.worker_spec(config);
      opts.group = roles.workers;
    }
  }
  const bool json_lines = resolved.log_format == obs::LogFormat::kJson;
  runtime::Trainer trainer(std::move(resolved), opts);
  runtime::TrainResult r;
  try {
    r = trainer.run();
  } catch (const std::exception& e) {
    // Failed after a termination signal (a collective abandoned on peers that are gone): the
    // launcher's SIGKILL follows within its grace period, and unwinding may wait on what is gone
    // (the checkpoint writer's store barrier). Say why now and leave: an unfinished save is a
    // .tmp directory the next run ignores, and the run directory's lock is taken over.
    if (comm::termination_signal()) {
      std::cerr << "meshtrain: error: " << e.what() << std::endl;
      std::_Exit(1);
    }
    throw;
  }
  if (r.regrouped) {
    // Every rank says it: each node's agent reads its own workers' statuses.
    if (env.rank == 0)
      std::cout << "stopped at step " << r.last_step
                << " to leave a straggling node out; the job goes on from this step's checkpoint"
                << std::endl;
    return r.left_out ? runtime::kLeftOutExitStatus : runtime::kRegroupExitStatus;
  }
  if (env.rank != 0) return 0;
  if (r.nothing_to_do) return 0;  // the trainer said so, with the steps
  if (r.preempted) {
    // The same fact as the preemption line above it: saved only when checkpoints are on.
    std::cout << "stopped at step " << r.last_step << " on a signal; "
              << (r.preemption_saved
                      ? "the checkpoint is saved and the next run resumes from it"
                      : "checkpoints are off (ckpt.interval = 0), so the next run starts over")
              << std::endl;
    return 0;
  }
  const float first = r.val_losses.front().second, final = r.val_losses.back().second;
  if (json_lines) {
    std::cout << nlohmann::json{{"msg", "done"},
                                {"rank", 0},
                                {"val_loss_first", first},
                                {"val_loss_final", final},
                                {r.throughput_unit + "_per_s", r.throughput},
                                {"skipped_steps", r.skipped_steps}}
                     .dump()
              << std::endl;
    return 0;
  }
  std::cout << "done: val_loss " << first << " -> " << final << ", "
            << static_cast<int64_t>(r.throughput) << " " << r.throughput_unit << "/s";
  if (r.skipped_steps > 0) std::cout << ", " << r.skipped_steps << " steps skipped (non-finite)";
  std::cout << std::endl;
  return 0;
}

int cmd_sample(const std::string& weights, const std::string& prompt, int64_t tokens,
               float temperature, int64_t top_k, uint64_t seed) {
  ckpt::SafetensorsFile f = ckpt::load_safetensors(weights);
  auto it = f.metadata.find("meshtrain_config");
  if (it == f.metadata.end())
    MT_THROW(ValueError, weights,
             ": no meshtrain_config in the file's metadata; was it written by `meshtrain train`?");
  runtime::TrainConfig config = runtime::config_from_json(nlohmann::json::parse(it->second));
  nn::GPT model(runtime::gpt_config(runtime::resolve_config(config)));
  std::map<std::string, Tensor> state(f.tensors.begin(), f.tensors.end());
  model.load_state_dict(state);
  data::ByteTokenizer tok;
  Generator gen(seed);
  auto ids = tok.encode(prompt);
  auto out = model.generate(ids, tokens, temperature, top_k, gen);
  std::vector<int32_t> printable;
  for (int32_t t : out)
    if (t < 256) printable.push_back(t);
  std::cout << prompt << tok.decode(printable) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: distributed deep-learning training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", MESHTRAIN_VERSION);

  auto* train = app.add_subcommand("train", "train a GPT from a TOML config");
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  train->add_option("--config", config_path, "TOML config file (keys: see --help-config)");
  train->add_option("--set", overrides, "override a config key: --set optim.lr=3e-4 (repeatable)");
  train->add_flag("--print-config", print_config, "print the effective config and exit");
  std::string trace_path;
  train->add_option("--trace", trace_path,
                    "write a Chrome/Perfetto trace of the run (same as --set train.trace=FILE)");
  std::string log_format;
  train
      ->add_option("--log-format", log_format,
                   "progress lines: text or json (same as --set train.log_format=FORMAT)")
      ->check(CLI::IsMember({"text", "json"}));
  bool help_config = false;
  train->add_flag("--help-config", help_config, "list every config key with its default");

  auto* sample = app.add_subcommand("sample", "generate text from trained weights");
  std::string weights, prompt = "\n";
  int64_t tokens = 200, top_k = 40;
  float temperature = 0.8f;
  uint64_t seed = 1;
  sample->add_option("--weights", weights, "model.safetensors written by `meshtrain train`")
      ->required();
  sample->add_option("--prompt", prompt, "text to continue");
  sample->add_option("--tokens", tokens, "tokens to generate")->check(CLI::PositiveNumber);
  sample->add_option("--temperature", temperature, "sampling temperature (0 = greedy)");
  sample->add_option("--top-k", top_k, "sample from the k most likely tokens (0 = all)");
  sample->add_option("--seed", seed, "sampling seed");

  auto* data_cmd = app.add_subcommand("data", "dataset tools");
  data_cmd->require_subcommand(1);
  auto* prepare = data_cmd->add_subcommand("prepare", "tokenize a text file into .bin shards");
  std::string input, out_dir;
  double val_fraction = 0.1;
  prepare->add_option("--input", input, "text file")->required();
  prepare->add_option("--out", out_dir, "output directory")->required();
  prepare
      ->add_option("--val-fraction", val_fraction, "fraction of the text held out for validation")
      ->check(CLI::Range(0.0, 0.9));

  auto* fetch = data_cmd->add_subcommand(
      "fetch", "bring an s3:// dataset into this host's cache and print its local directory");
  std::string fetch_uri;
  fetch->add_option("uri", fetch_uri, "s3://bucket/prefix, as data.dir")->required();

  auto run_ckpt = apps::add_ckpt_command(app);
  auto run_report = apps::add_report_command(app);
  auto run_trace = apps::add_trace_command(app);
  auto run_bench = apps::add_bench_command(app);
  auto run_plan = apps::add_plan_command(app);
  auto run_place = apps::add_place_command(app);
  auto run_env = apps::add_env_command(app);
  auto run_tls = apps::add_tls_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  apps::warn_unknown_env();

  try {
    if (train->parsed()) {
      if (help_config) {
        std::cout << runtime::config_help();
        return 0;
      }
      if (!trace_path.empty()) overrides.push_back("train.trace=" + trace_path);
      if (!log_format.empty()) overrides.push_back("train.log_format=" + log_format);
      return cmd_train(config_path, overrides, print_config);
    }
    if (app.got_subcommand("ckpt")) return run_ckpt();
    if (int rc = run_report(); rc >= 0) return rc;
    if (int rc = run_trace(); rc >= 0) return rc;
    if (int rc = run_bench(); rc >= 0) return rc;
    if (int rc = run_plan(); rc >= 0) return rc;
    if (int rc = run_place(); rc >= 0) return rc;
    if (int rc = run_env(); rc >= 0) return rc;
    if (int rc = run_tls(); rc >= 0) return rc;
    if (sample->parsed()) return cmd_sample(weights, prompt, tokens, temperature, top_k, seed);
    if (fetch->parsed()) {
      if (!ckpt::is_object_uri(fetch_uri))
        MT_THROW(ValueError, "meshtrain data fetch takes an s3://bucket/prefix URI, got '",
                 fetch_uri, "'");
      std::cout << data::resolve_data_dir(fetch_uri) << std::endl;
      return 0;
    }
    if (prepare->parsed()) {
      auto r = data::prepare_text(input, out_dir, val_fraction);
      std::cout << data::prepare_summary(r) << std::endl;
      return 0;
    }
  } catch (const ValueError& e) {
    std::cerr << "meshtrain: error: " << e.what() << std::endl;
    return 2;
  } catch (const IoError& e) {
    std::cerr << "meshtrain: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "meshtrain: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
