// See resolved_config.h. Single keys first (the constraint table, then the parsers of keys whose
// values carry arguments), then the plan check of their combinations.
#include "meshtrain/runtime/resolved_config.h"

#include <algorithm>
#include <exception>
#include <string>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/runtime/config_constraint.h"
#include "meshtrain/runtime/plan_check.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

DType precision_dtype(PrecisionChoice p) {
  switch (p) {
    case PrecisionChoice::bf16:
      return DType::bf16;
    case PrecisionChoice::f16:
      return DType::f16;
    case PrecisionChoice::f32:
      break;
  }
  return DType::f32;
}

void resolve_device(ResolvedConfig& r) {
  const std::string& setting = r.config.train.device;
  if (r.choice.device == DeviceKind::cpu) return;
  try {
    r.device = Device::parse(setting);
  } catch (const ValueError&) {
    MT_THROW(ValueError, "config: train.device = \"", setting,
             "\" is not a device (expected cpu, cuda or cuda:N)");
  }
  r.device_per_local_rank = setting == "cuda";
}

}  // namespace

std::vector<int64_t> parse_mlp_hidden(const std::string& value) {
  std::vector<int64_t> widths;
  size_t at = 0;
  while (at <= value.size()) {
    const size_t comma = std::min(value.find(',', at), value.size());
    const std::string item = value.substr(at, comma - at);
    size_t used = 0;
    int64_t w = 0;
    try {
      w = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || w < 1)
      MT_THROW(ValueError, "config: model.mlp_hidden = \"", value,
               "\" is not a list of positive widths like \"64,64\"");
    widths.push_back(w);
    at = comma + 1;
  }
  return widths;
}

bool ResolvedConfig::activation_checkpointing() const {
  return std::find(checkpointed_blocks.begin(), checkpointed_blocks.end(), true) !=
         checkpointed_blocks.end();
}

namespace {

nn::MoEConfig resolve_moe(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  nn::MoEConfig moe;
  moe.every = m.moe_every;
  moe.num_experts = m.moe_num_experts;
  moe.top_k = m.moe_top_k;
  moe.expert_hidden = m.moe_expert_hidden;
  moe.capacity_factor = m.moe_capacity_factor;
  moe.eval_capacity_factor = m.moe_eval_capacity_factor;
  moe.min_capacity = m.moe_min_capacity;
  moe.drop_tokens = m.moe_drop_tokens;
  moe.aux_loss_weight = m.moe_aux_loss_weight;
  moe.z_loss_weight = m.moe_z_loss_weight;
  moe.bias_update_rate = m.moe_bias_update_rate;
  moe.grouped_experts = m.moe_grouped_experts;
  moe.jitter_eps = m.moe_jitter_eps;
  try {
    moe.router_noise = nn::parse_router_noise(m.moe_router_noise);
    moe.balance_batch = nn::parse_router_balance(m.moe_router_balance);
    moe.validate(m.n_layer);
  } catch (const ValueError& e) {
    MT_THROW(ValueError, "config: ", e.what());
  }
  return moe;
}

}  // namespace

ResolvedConfig resolve_config(const TrainConfig& c, std::optional<int> world) {
  ResolvedConfig r;
  r.config = c;
  // Single-key choices and ranges: the table in config_constraint.cpp.
  check_config_constraints(c);
  r.choice = parse_config_choices(c);
  // The hook's parameters (topk:RATIO, powersgd:RANK:WARMUP).
  try {
    r.comm_hook = parallel::parse_comm_hook_spec(c.dist.comm_hook);
  } catch (const ValueError& e) {
    MT_THROW(ValueError, "config: dist.comm_hook = \"", c.dist.comm_hook, "\": ", e.what());
  }
  if (r.choice.model == ModelKind::mlp) r.mlp_hidden = parse_mlp_hidden(c.model.mlp_hidden);
  if (c.data.dir.empty()) MT_THROW(ValueError, "config: data.dir is empty");
  resolve_device(r);
  if (c.train.out_dir.empty()) MT_THROW(ValueError, "config: train.out_dir is empty");
  if (c.ckpt.resume_from.empty())
    MT_THROW(ValueError,
             "config: ckpt.resume_from must be latest, best or a checkpoint path, not empty");
  r.memory_check = c.train.max_memory != "off";
  r.memory_limit = parse_memory_limit(c.train.max_memory);
  r.data_cache_limit = parse_memory_limit(c.data.cache_limit, "data.cache_limit");
  r.precision = precision_dtype(r.choice.precision);
  r.lr_decay = optim::parse_lr_decay(c.optim.schedule);
  r.log_format =
      r.choice.log_format == LogFormatChoice::json ? obs::LogFormat::kJson : obs::LogFormat::kText;
  r.schedule = plan::parse_schedule_kind(c.parallel.schedule);
  r.partition = models::parse_partition_cost(c.parallel.partition);
  try {
    r.checkpointed_blocks =
        nn::parse_activation_checkpointing(c.model.activation_checkpointing, c.model.n_layer);
  } catch (const ValueError& e) {
    MT_THROW(ValueError, "config: ", e.what());
  }
  r.moe = resolve_moe(c);
  check_plan(r, world);
  return r;
}

}  // namespace meshtrain::runtime
