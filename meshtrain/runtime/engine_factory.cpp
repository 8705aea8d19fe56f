#include "meshtrain/runtime/engine_factory.h"

#include <algorithm>
#include <chrono>

#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/runtime/memory_guard.h"
#include "meshtrain/runtime/plan_check.h"
#include "meshtrain/runtime/task_factory.h"
#include "meshtrain/runtime/train_device.h"
#include "meshtrain/runtime/trainer.h"

namespace meshtrain::runtime {

parallel::EngineOptions engine_options(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  parallel::EngineOptions o;
  o.zero_stage = static_cast<int>(c.parallel.zero_stage);
  o.fsdp_unit_per_block = r.choice.fsdp_unit == FsdpUnit::block;
  o.reducer.bucket_bytes = static_cast<size_t>(c.dist.bucket_mb * 1048576.0);
  o.reducer.first_bucket_bytes = static_cast<size_t>(c.dist.first_bucket_mb * 1048576.0);
  o.reducer.find_unused_parameters = c.dist.find_unused_parameters;
  o.broadcast_buffers = c.dist.broadcast_buffers;
  o.reducer.comm_hook = r.comm_hook;
  o.reducer.gradient_as_bucket_view = c.dist.gradient_as_bucket_view;
  o.reducer.shared_buckets = c.dist.shared_buckets;
  o.optimizer = r.choice.optimizer;
  o.adamw.lr = static_cast<float>(c.optim.lr);
  o.adamw.beta1 = static_cast<float>(c.optim.beta1);
  o.adamw.beta2 = static_cast<float>(c.optim.beta2);
  o.adamw.eps = static_cast<float>(c.optim.eps);
  o.sgd.lr = static_cast<float>(c.optim.lr);
  o.sgd.momentum = static_cast<float>(c.optim.momentum);
  o.sgd.nesterov = c.optim.nesterov;
  o.weight_decay = static_cast<float>(c.optim.weight_decay);
  o.precision = r.precision;
  if (o.precision == DType::f16) {
    optim::LossScalerOptions lo;
    lo.init_scale = c.train.loss_scale_init;
    lo.growth_factor = c.train.loss_scale_growth_factor;
    lo.backoff_factor = c.train.loss_scale_backoff_factor;
    lo.growth_interval = c.train.loss_scale_growth_interval;
    o.loss_scaler = lo;
  }
  o.seed = static_cast<uint64_t>(c.train.seed);
  o.pipeline.stages = static_cast<int>(c.parallel.pp);
  o.pipeline.kind = r.schedule;
  o.pipeline.micro_batches = static_cast<int>(c.parallel.micro_batches);
  o.pipeline.virtual_stages = static_cast<int>(c.parallel.virtual_stages);
  o.sequence_parallel = c.parallel.sequence_parallel;
  o.pipeline.partition = r.partition;
  if (c.parallel.mode == "gossip") o.gossip = parallel::parse_gossip_graph(c.parallel.gossip_graph);
  return o;
}

std::vector<parallel::MeshDim> engine_mesh_dims(const TrainConfig& config, int world) {
  const int pp = static_cast<int>(config.parallel.pp), tp = static_cast<int>(config.parallel.tp);
  return {{"pp", pp}, {"dp", std::max(1, world / std::max(1, pp * tp))}, {"tp", tp}};
}

std::unique_ptr<parallel::TrainEngine> make_engine(
    const ResolvedConfig& resolved, comm::ProcessGroupPtr group, std::shared_ptr<comm::Store> store,
    comm::ProcessGroupPtr device_group, Device device, int ranks_on_host,
    std::optional<parallel::ParamServerSpec> param_server) {
  const TrainConfig& config = resolved.config;
  const int world = group ? group->size() : 1;
  check_plan(resolved, world);
  // The mesh has the dimensions every strategy uses; tp varies fastest, so a tp group shares a
  // host. Without a pipeline or tensor parallelism the data-parallel group is the whole job.
  const int pp = static_cast<int>(config.parallel.pp), tp = static_cast<int>(config.parallel.tp);
  // Before any parameter exists: a run that cannot fit stops here with what would fit (the
  // estimate is per rank of this pp x dp x tp layout).
  check_memory(resolved, world, std::clamp(ranks_on_host, 1, world));
  parallel::EngineSpec spec;
  spec.mesh = parallel::DeviceMesh(group, engine_mesh_dims(config, world));
  if (config.parallel.ep > 1)
    spec.experts =
        parallel::make_expert_groups(spec.mesh.group("dp"), static_cast<int>(config.parallel.ep));
  spec.model = make_model_source(resolved);
  spec.device = device;
  spec.options = engine_options(resolved);
  spec.param_server = std::move(param_server);
  // A parameter server's workers start from the same keyed initial values as the servers, and
  // hold no buffers a step must share.
  if (spec.param_server) spec.options.broadcast_buffers = false;
  // Tensor or pipeline parallelism on a device arranges the device group as the mesh (the
  // engine's parts).
  if (group && !device_group && ((pp == 1 && tp == 1) || !device.is_cpu()) && !spec.param_server)
    device_group = device_process_group(
        device, group, std::move(store),
        std::chrono::milliseconds(static_cast<int64_t>(config.dist.timeout_s * 1000)));
  spec.grad_group = std::move(device_group);
  return parallel::make_engine(std::move(spec));
}

}  // namespace meshtrain::runtime
