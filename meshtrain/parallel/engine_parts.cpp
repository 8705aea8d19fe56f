// make_engine: the parts of an engine, chosen once from the layout and the options. This is the
// one place that knows which parts go together; adding a strategy is one new implementation of
// one part (parts/) plus its case here.
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/expert/expert_grad_sync.h"
#include "meshtrain/parallel/gossip/gossip_average.h"
#include "meshtrain/parallel/gossip/local_grad_sync.h"
#include "meshtrain/parallel/model_source.h"
#include "meshtrain/parallel/param_server/ps_client.h"
#include "meshtrain/parallel/parts/local_runner.h"
#include "meshtrain/parallel/parts/pipeline_runner.h"
#include "meshtrain/parallel/parts/reducer_grad_sync.h"
#include "meshtrain/parallel/parts/sharded_update.h"
#include "meshtrain/parallel/parts/whole_update.h"
#include "meshtrain/parallel/zero/fsdp_units.h"
#include "meshtrain/parallel/zero/zero_shards.h"

namespace meshtrain::parallel {

std::unique_ptr<optim::Optimizer> make_engine_optimizer(const EngineOptions& o,
                                                        std::vector<optim::ParamGroup> groups) {
  if (o.optimizer == optim::OptimizerKind::adamw)
    return std::make_unique<optim::AdamW>(std::move(groups), o.adamw);
  return std::make_unique<optim::Sgd>(std::move(groups), o.sgd);
}

namespace {

// The runner: a pipeline when the model is cut into stages. ZeRO over tensor-parallel parts runs
// as a pipeline of one stage too: its held gradients are complete (sequence parallelism's parts
// summed over tp) before the reduce-scatter shards them, which the overlapped reduction of the
// local runner cannot wait for.
// device_mesh: the device group's mesh where tensor or pipeline parallelism runs on a device
// (null elsewhere): tensor parallelism's activations go through its tp groups.
std::shared_ptr<StepRunner> make_runner(const EngineSpec& spec, bool staged,
                                        const DeviceMesh* device_mesh) {
  const EngineOptions& o = spec.options;
  const DeviceMesh& mesh = spec.mesh;
  const int tp = mesh.size("tp");
  if (tp == 1)
    MT_CHECK(!o.sequence_parallel,
             "sequence parallelism needs a tp dimension of more than one rank");
  if (staged) {
    MT_CHECK(o.zero_stage <= 2,
             "ZeRO-3 with pipeline or tensor parallelism is not available (parallel.zero_stage = ",
             o.zero_stage, "); use parallel.zero_stage = 0, 1 or 2");
    if (tp > 1) {
      MT_CHECK(o.precision == DType::f32 && !o.loss_scaler,
               "tensor parallelism with a pipeline or ZeRO runs in f32 for now "
               "(train.precision = f32)");
      MT_CHECK(spec.device.is_cpu() || device_mesh, "tensor parallelism on ", spec.device.str(),
               " needs the device's group");
    }
    return std::make_shared<PipelineRunner>(*spec.model, o.pipeline, mesh, o.sequence_parallel,
                                            spec.device,
                                            device_mesh ? device_mesh->group("tp") : nullptr);
  }
  tp::TpContext ctx;
  if (tp > 1) {
    MT_CHECK(o.precision == DType::f32 && !o.loss_scaler,
             "tensor parallelism runs in f32 for now (train.precision = f32)");
    MT_CHECK(spec.device.is_cpu() || device_mesh, "tensor parallelism on ", spec.device.str(),
             " needs the device's group");
    ctx = tp::TpContext{device_mesh ? device_mesh->group("tp") : mesh.group("tp"),
                        o.sequence_parallel};
  }
  std::optional<comm::ProcessGroupPtr> expert_copies;
  if (spec.experts) {
    ctx.experts = spec.experts->exchange;
    expert_copies = spec.experts->replica_group;
  }
  return std::make_shared<LocalRunner>(spec.model->build(ctx), mesh.group("dp"), spec.device,
                                       o.broadcast_buffers, expert_copies);
}

}  // namespace

DeviceMesh data_parallel_mesh(comm::ProcessGroupPtr world) {
  const int n = world ? world->size() : 1;
  return DeviceMesh(std::move(world), {{"pp", 1}, {"dp", n}, {"tp", 1}});
}

std::unique_ptr<TrainEngine> make_engine(EngineSpec spec) {
  const EngineOptions& o = spec.options;
  MT_CHECK(spec.model != nullptr, "an engine needs a model");
  MT_CHECK(o.zero_stage >= 0 && o.zero_stage <= 3, "ZeRO stage ", o.zero_stage,
           " does not exist (0, 1, 2 and 3 do)");
  const bool staged = spec.mesh.size("pp") > 1 || (spec.mesh.size("tp") > 1 && o.zero_stage > 0);
  // Tensor or pipeline parallelism on a device: the device group arranged as the host mesh (the
  // same ranks in the same places), whose tp groups carry the activations and dp groups the
  // gradients (the stages' transfers go through the host's pp group).
  std::optional<DeviceMesh> device_mesh;
  if (!spec.device.is_cpu() && spec.grad_group &&
      (spec.mesh.size("tp") > 1 || spec.mesh.size("pp") > 1))
    device_mesh.emplace(spec.grad_group, spec.mesh.dims());
  // Where the gradients are reduced: the device group (its dp groups under tensor or pipeline
  // parallelism), else the host's dp group.
  const comm::ProcessGroupPtr grad_group = device_mesh ? device_mesh->group("dp") : spec.grad_group;
  // Device gradients cannot go through a host group.
  MT_CHECK(spec.device.is_cpu() || !spec.mesh.group("dp") || spec.grad_group || spec.param_server ||
               o.gossip,
           "data parallelism on ", spec.device.str(), " needs the device's group");
  TrainEngine::Parts parts;
  parts.runner = make_runner(spec, staged, device_mesh ? &*device_mesh : nullptr);
  const nn::NamedTensors& params = parts.runner->parameters();
  const comm::ProcessGroupPtr& dp = spec.mesh.group("dp");
  const OptimizerFactory factory = [&o](std::vector<optim::ParamGroup> g) {
    return make_engine_optimizer(o, std::move(g));
  };
  const int stage = dp ? o.zero_stage : 0;
  // ZeRO on a device: the buckets, the shards and the gathered parameters are device memory,
  // exchanged over the device group.
  const comm::ProcessGroupPtr& zero_group = spec.device.is_cpu() || !grad_group ? dp : grad_group;
  if (spec.param_server) {
    // A parameter-server worker: gradients pushed to the servers, the update theirs.
    MT_CHECK(!staged && stage == 0,
             "a parameter-server worker holds the whole model: no ZeRO or pipeline");
    const ParamServerSpec& ps = *spec.param_server;
    std::vector<int64_t> sizes;
    for (const auto& [name, p] : params) sizes.push_back(p.numel());
    PsClientOptions co;
    co.consistency = static_cast<PsConsistency>(ps.consistency);
    co.backup_workers = ps.backup_workers;
    co.staleness = ps.staleness;
    auto client =
        std::make_shared<PsClient>(params, PsLayout(spec.mesh.size("dp"), ps.servers, sizes),
                                   spec.mesh.coord("dp"), ps.links, co);
    parts.grads = client;
    parts.params = client;
    parts.update = client;
  } else if (o.gossip && dp) {
    // Gossip: each replica steps on its own gradients, then averages with its neighbours.
    MT_CHECK(o.zero_stage == 0 && !staged && spec.mesh.size("tp") == 1,
             "gossip averages whole replicas: no ZeRO, pipeline or tensor parallelism");
    parts.grads = std::make_shared<LocalGradSync>();
    parts.params = std::make_shared<GossipAverage>(params, dp, *o.gossip);
    parts.update = std::make_shared<WholeUpdate>(
        params, make_engine_optimizer(o, optim::decay_groups(params, o.weight_decay)));
  } else if (spec.experts) {
    // Expert parallelism: DDP for everything but the experts, whose gradients are averaged over
    // their copies in the other blocks.
    MT_CHECK(!staged && stage == 0 && spec.mesh.size("tp") == 1,
             "expert parallelism runs with DDP: no ZeRO, pipeline or tensor parallelism");
    MT_CHECK(spec.device.is_cpu() || spec.grad_group, "expert parallelism on ", spec.device.str(),
             " needs the device's group");
    std::vector<bool> is_expert;
    for (const nn::ParamInfo& info : parts.runner->param_infos()) is_expert.push_back(info.expert);
    ExpertGroups groups = *spec.experts;
    // The tokens travel through host memory over the host block; the experts' gradients on a
    // device are summed over their copies through the device group's split of the same ranks.
    if (!spec.device.is_cpu() && groups.replicas > 1)
      groups.replica_group = expert_replica_group(spec.grad_group, groups.ep);
    parts.grads = std::make_shared<ExpertGradSync>(
        params, is_expert, spec.grad_group ? spec.grad_group : dp, groups, o.reducer);
    parts.params = std::make_shared<ParamSync>();
    parts.update = std::make_shared<WholeUpdate>(
        params, make_engine_optimizer(o, optim::decay_groups(params, o.weight_decay)));
  } else if (stage == 0) {
    // DDP, or one replica.
    if (dp)
      parts.grads = std::make_shared<ReducerGradSync>(
          std::make_unique<Reducer>(params, grad_group ? grad_group : dp, o.reducer), staged);
    else
      parts.grads = std::make_shared<GradSync>();
    parts.params = std::make_shared<ParamSync>();
    parts.update = std::make_shared<WholeUpdate>(
        params, make_engine_optimizer(o, optim::decay_groups(params, o.weight_decay)));
  } else if (stage <= 2) {
    // ZeRO-1/2: the buckets padded to the group, all-reduced (1) or reduce-scattered (2); each
    // rank updates its slices and all-gathers the parameters after the step.
    auto reducer = std::make_unique<Reducer>(
        params, zero_group, ZeroShards::reducer_options(o.reducer, stage, dp->size()));
    auto zero =
        std::make_shared<ZeroShards>(params, *reducer, zero_group, stage, factory, o.weight_decay);
    parts.grads = std::make_shared<ReducerGradSync>(std::move(reducer), staged);
    parts.update = std::make_shared<ShardedUpdate>(
        params, zero->optimizer(),
        stage == 1 ? ShardedUpdate::Holds::whole_gradients : ShardedUpdate::Holds::gradient_shards);
    parts.params = std::move(zero);
  } else {
    // ZeRO-3: the model's layers as units, gathered around their use and reduce-scattered as
    // their backward ends.
    auto& local = static_cast<LocalRunner&>(*parts.runner);
    auto fsdp = std::make_shared<FsdpUnits>(local.model(), zero_group, o.fsdp_unit_per_block,
                                            factory, o.weight_decay);
    parts.update = std::make_shared<ShardedUpdate>(params, fsdp->optimizer(),
                                                   ShardedUpdate::Holds::parameter_shards);
    parts.grads = fsdp;
    parts.params = fsdp;
  }
  return std::make_unique<TrainEngine>(std::move(spec), std::move(parts));
}

}  // namespace meshtrain::parallel
