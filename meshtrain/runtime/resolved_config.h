// The configuration as a run acts on it: every string-valued key parsed into its type once, here,
// and every combination checked (plan_check.h). The TrainConfig stays the surface users write
// (TOML, --set, --help-config, the effective-config dump); everything downstream (the trainer,
// the engine factory, the memory guard, checkpoints) reads the resolved values and parses nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/moe_config.h"
#include "meshtrain/obs/log_line.h"
#include "meshtrain/optim/lr_schedule.h"
#include "meshtrain/parallel/ddp/comm_hook.h"
#include "meshtrain/plan/schedule_kind.h"
#include "meshtrain/runtime/config.h"
#include "meshtrain/runtime/config_choice.h"
#include "meshtrain/tensor/device.h"
#include "meshtrain/tensor/dtype.h"

namespace meshtrain::runtime {

struct ResolvedConfig {
  TrainConfig config;                                 // the keys as written
  ConfigChoices choice;                               // the one-of keys as enums (config_choice.h)
  DType precision = DType::f32;                       // train.precision
  optim::LrDecay lr_decay = optim::LrDecay::cosine;   // optim.schedule
  obs::LogFormat log_format = obs::LogFormat::kText;  // train.log_format
  Device device;                                      // train.device
  bool device_per_local_rank = false;                 // "cuda": cuda:<LOCAL_RANK>
  plan::ScheduleKind schedule = plan::ScheduleKind::one_f_one_b;   // parallel.schedule
  models::PartitionCost partition = models::PartitionCost::flops;  // parallel.partition
  std::vector<bool> checkpointed_blocks;     // model.activation_checkpointing, n_layer flags
  bool memory_check = true;                  // train.max_memory != "off"
  std::optional<uint64_t> memory_limit;      // train.max_memory as bytes; nullopt: auto
  std::optional<uint64_t> data_cache_limit;  // data.cache_limit in bytes; nullopt: unbounded
  parallel::CommHookSpec comm_hook;          // dist.comm_hook
  std::vector<int64_t> mlp_hidden;           // model.mlp_hidden (model.kind = mlp)
  nn::MoEConfig moe;                         // model.moe.*

  bool activation_checkpointing() const;  // any block checkpointed
};

// "64,64" -> {64, 64}: positive widths, comma-separated; ValueError naming model.mlp_hidden.
std::vector<int64_t> parse_mlp_hidden(const std::string& value);

// Parses every key and runs the plan check; `world` (the job's ranks, when known) adds the checks
// that depend on it. A bad value or combination is one ValueError line naming the keys (exit 2).
ResolvedConfig resolve_config(const TrainConfig& config, std::optional<int> world = std::nullopt);

}  // namespace meshtrain::runtime
