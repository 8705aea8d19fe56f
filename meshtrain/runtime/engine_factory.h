// The one place a run's configuration becomes its training engine: config -> mesh -> model ->
// engine. The trainer, the tests and the benchmarks build engines through it, so a strategy's
// settings are read in one place and an illegal combination is refused before anything starts.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/runtime/resolved_config.h"

namespace meshtrain::runtime {

// The engine's settings for a resolved config (optimizer, precision, buckets, ZeRO stage,
// schedule, comm hook): read from its typed values, nothing parsed.
parallel::EngineOptions engine_options(const ResolvedConfig& config);

// The mesh every engine is built on, {pp, dp, tp} for `world` ranks (tp varies fastest, so a tp
// group shares a host); dp = world / (pp x tp), which make_engine checks divides.
std::vector<parallel::MeshDim> engine_mesh_dims(const TrainConfig& config, int world);

// Builds the model from [model] and the engine from [parallel], [optim], [dist] and [train].
// `group`: all ranks (null for one process); `device_group` reduces device gradients (null: made
// from `group` and `store` when the device needs one); `ranks_on_host`: the launcher's
// LOCAL_WORLD_SIZE (DistEnv), which shares the host's memory in the memory guard. Runs the plan
// check for the group's world size first. `param_server`: this rank is a worker of a
// parameter-server job (`group` is the workers'). Collective over `group`.
std::unique_ptr<parallel::TrainEngine> make_engine(
    const ResolvedConfig& config, comm::ProcessGroupPtr group, std::shared_ptr<comm::Store> store,
    comm::ProcessGroupPtr device_group, Device device, int ranks_on_host,
    std::optional<parallel::ParamServerSpec> param_server = std::nullopt);

}  // namespace meshtrain::runtime
