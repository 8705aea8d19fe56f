#include "meshtrain/runtime/parameter_server_role.h"

#include <filesystem>
#include <fstream>
#include <numeric>

#include "meshtrain/comm/detached_group.h"
#include "meshtrain/parallel/model_source.h"
#include "meshtrain/parallel/param_server/parameter_server.h"
#include "meshtrain/runtime/checkpointing.h"
#include "meshtrain/runtime/core_binding.h"
#include "meshtrain/runtime/engine_factory.h"
#include "meshtrain/runtime/job_store_keys.h"
#include "meshtrain/runtime/preemption.h"
#include "meshtrain/runtime/task_factory.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

namespace {

parallel::PsConsistency consistency_of(const TrainConfig& c) {
  if (c.parallel.ps_consistency == "async") return parallel::PsConsistency::async;
  if (c.parallel.ps_consistency == "ssp") return parallel::PsConsistency::ssp;
  return parallel::PsConsistency::sync;
}

}  // namespace

int ps_worker_count(const TrainConfig& c, int world) {
  const int64_t servers = c.parallel.ps_servers;
  if (servers >= world)
    MT_THROW(ValueError, "config: parallel.ps.servers = ", servers, " leaves no worker among the ",
             world, " ranks; launch more ranks than servers (meshrun --nproc-per-node)");
  const int64_t workers = world - servers;
  if (c.parallel.ps_backup_workers >= workers)
    MT_THROW(ValueError, "config: parallel.ps.backup_workers = ", c.parallel.ps_backup_workers,
             " must be below the ", workers, " workers (", world, " ranks less ", servers,
             " servers), or no step would wait for any gradient");
  return static_cast<int>(workers);
}

parallel::ParamServerSpec PsRoles::worker_spec(const TrainConfig& c) const {
  parallel::ParamServerSpec spec;
  spec.links = links;
  spec.servers = servers_count;
  spec.consistency = static_cast<int>(consistency_of(c));
  spec.staleness = static_cast<int>(c.parallel.ps_staleness);
  spec.backup_workers = static_cast<int>(c.parallel.ps_backup_workers);
  spec.replacement = replacement;
  return spec;
}

namespace {

bool replaceable_workers(const TrainConfig& c) {
  return consistency_of(c) != parallel::PsConsistency::sync;
}

}  // namespace

PsRoles split_ps_roles(const TrainConfig& c, comm::ProcessGroupPtr job,
                       std::shared_ptr<comm::Store> store) {
  MT_CHECK(job != nullptr, "a parameter-server job needs more than one rank");
  PsRoles roles;
  roles.workers_count = ps_worker_count(c, job->size());
  roles.servers_count = job->size() - roles.workers_count;
  std::vector<int> workers(static_cast<size_t>(roles.workers_count));
  std::iota(workers.begin(), workers.end(), 0);
  std::vector<int> servers(static_cast<size_t>(roles.servers_count));
  std::iota(servers.begin(), servers.end(), roles.workers_count);
  // Every rank splits both, in this order: a split is collective over the job.
  roles.workers = job->split(workers);
  roles.servers = job->split(servers);
  const int rank = job->rank();
  if (rank >= roles.workers_count) roles.server = rank - roles.workers_count;
  const int W = roles.workers_count, S = roles.servers_count;
  if (!replaceable_workers(c)) {
    roles.links = roles.is_server() ? parallel::job_peers_of_server(job, W)
                                    : parallel::job_peers_of_worker(job, W, S);
    roles.job = std::move(job);
    return roles;
  }
  parallel::PsLinkOptions& lo = roles.link_options;
  lo.store = std::move(store);
  lo.backend = c.dist.backend;
  lo.group = job->options();
  if (roles.is_server()) {
    roles.links = parallel::make_server_links(lo, W, roles.server);
  } else {
    roles.links = parallel::make_worker_links(lo, S, rank, 0);
    roles.workers =
        std::make_shared<comm::DetachedGroup>(rank, W, "asynchronous parameter-server workers");
    // From here a failure of this process costs the others nothing: its launcher may replace it
    // alone.
    lo.store->set_string(job_keys::replaceable(rank), "1");
  }
  roles.job = std::move(job);
  return roles;
}

PsRoles join_ps_job(const TrainConfig& c, int rank, int world, std::shared_ptr<comm::Store> store,
                    const comm::ProcessGroupOptions& group) {
  PsRoles roles;
  roles.workers_count = ps_worker_count(c, world);
  roles.servers_count = world - roles.workers_count;
  if (!replaceable_workers(c) || rank >= roles.workers_count)
    MT_THROW(ValueError, "rank ", rank,
             " cannot join the running job alone: only the workers of an asynchronous "
             "parameter-server job (parallel.ps.consistency = \"async\" or \"ssp\") are "
             "replaced while the others go on");
  parallel::PsLinkOptions& lo = roles.link_options;
  lo.store = std::move(store);
  lo.backend = c.dist.backend;
  lo.group = group;
  lo.group.shm_budget.host_cpus = static_cast<int>(allowed_cpus().size());
  const int64_t generation = parallel::next_link_generation(*lo.store, rank);
  roles.links = parallel::make_worker_links(lo, roles.servers_count, rank, generation);
  roles.workers = std::make_shared<comm::DetachedGroup>(rank, roles.workers_count,
                                                        "asynchronous parameter-server workers");
  roles.replacement = true;
  return roles;
}

int run_parameter_server(const ResolvedConfig& resolved, const PsRoles& roles,
                         std::ostream* progress) {
  const TrainConfig& c = resolved.config;
  const parallel::EngineOptions eo = engine_options(resolved);
  // The whole model once, for its keyed initial values: the range kept, the rest released.
  nn::NamedTensors params;
  std::vector<int64_t> sizes;
  {
    const std::shared_ptr<parallel::TrainModel> model = make_model_source(resolved)->build({});
    params = model->module().named_parameters();
    for (const auto& [name, p] : params) sizes.push_back(p.numel());
  }
  parallel::PsLayout layout(roles.workers_count, roles.servers_count, sizes);
  const parallel::KeyRange range = layout.ranges[static_cast<size_t>(roles.server)];
  parallel::ParameterServerOptions o;
  o.consistency = consistency_of(c);
  o.staleness = static_cast<int>(c.parallel.ps_staleness);
  o.backup_workers = static_cast<int>(c.parallel.ps_backup_workers);
  o.staleness_lr = c.parallel.ps_staleness_lr;
  o.grad_clip = c.optim.grad_clip;
  o.weight_decay = eo.weight_decay;
  if (c.ckpt.interval > 0 || c.ckpt.interval_minutes > 0) {
    // Beside the workers' step directories, one file per step for each server.
    o.checkpoint_dir = (std::filesystem::path(checkpoint_root(c)) / "param_servers" /
                        ("server" + std::to_string(roles.server)))
                           .string();
    o.checkpoint_interval = c.ckpt.interval;
    o.last_step = c.train.steps;
    o.keep_last = c.ckpt.keep_last;
    o.keep_every = c.ckpt.keep_every;
  }
  if (roles.link_options.store)
    o.relink = [lo = roles.link_options, server = roles.server](int worker, int64_t generation) {
      return parallel::make_server_link(lo, worker, server, generation);
    };
  parallel::ParameterServer server(
      params, layout, roles.server, roles.links, roles.servers_count > 1 ? roles.servers : nullptr,
      [&eo](std::vector<optim::ParamGroup> g) {
        return parallel::make_engine_optimizer(eo, std::move(g));
      },
      o);
  params.clear();
  // SIGTERM or SIGINT (meshrun stopping the job, a scheduler reclaiming the node) reaches the
  // workers too: they agree on a last step, checkpoint it (the servers with them) and end with
  // their "done" pushes, so a server keeps serving until then instead of dying under them.
  const PreemptionGuard preemption;
  const parallel::ParameterServerReport report = server.serve();
  nlohmann::json summary = report.to_json();
  summary["server"] = roles.server;
  summary["params"] = {range.begin, range.end};
  summary["elements"] = layout.range_size(roles.server);
  std::filesystem::create_directories(c.train.out_dir);
  std::ofstream(std::filesystem::path(c.train.out_dir) /
                ("ps_server" + std::to_string(roles.server) + ".json"))
      << summary.dump() << "\n";
  if (progress)
    *progress << "parameter server " << roles.server << ": " << report.steps << " steps, "
              << report.applied << " gradients applied, " << report.dropped << " dropped, "
              << "staleness max " << report.max_staleness << ", load "
              << (report.wall_s > 0 ? report.busy_s / report.wall_s : 0.0) << std::endl;
  return 0;
}

}  // namespace meshtrain::runtime
