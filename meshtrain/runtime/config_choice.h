// The choice-valued config keys as enums: parsed once, where the config is resolved
// (resolve_config, whose ResolvedConfig carries them), so that the code that acts on a choice
// compares enums instead of strings. The names stay in one place, the constraint table
// (config_constraint.cpp): a key's i-th allowed name is its enum's i-th value, which a test checks
// for every key listed here. Keys whose values carry arguments are parsed by their own parsers
// (dist.comm_hook: parallel::parse_comm_hook_spec, train.device: Device::parse,
// parallel.schedule: plan::parse_schedule_kind), all called by resolve_config only; dist.backend
// names a registered backend.
#pragma once

#include <string>
#include <string_view>

#include "meshtrain/optim/optimizer.h"
#include "meshtrain/runtime/config.h"

namespace meshtrain::runtime {

using OptimizerChoice = optim::OptimizerKind;            // optim.name
enum class LrScaleRule { none, linear, sqrt };           // optim.lr_scale_rule
enum class DeviceKind { cpu, cuda };                     // train.device (cuda:N is cuda)
enum class LogFormatChoice { text, json };               // train.log_format
enum class GemmChoice { onednn, openblas };              // train.gemm
enum class PrecisionChoice { f32, bf16, f16 };           // train.precision
enum class ElasticBatchChoice { keep, rescale_lr };      // dist.elastic_batch
enum class FsdpUnit { block, model };                    // parallel.fsdp_unit
enum class OnSaveError { stop, continue_training };      // ckpt.on_error
enum class ResumeFrom { latest, best, path };            // ckpt.resume_from (else a path)
enum class ModelKind { gpt, mlp, resnet };               // model.kind
enum class DataKind { tokens, spirals, fashion_mnist };  // data.kind

struct ConfigChoices {
  OptimizerChoice optimizer = OptimizerChoice::adamw;
  LrScaleRule lr_scale_rule = LrScaleRule::none;
  DeviceKind device = DeviceKind::cpu;
  LogFormatChoice log_format = LogFormatChoice::text;
  GemmChoice gemm = GemmChoice::onednn;
  PrecisionChoice precision = PrecisionChoice::f32;
  ElasticBatchChoice elastic_batch = ElasticBatchChoice::keep;
  FsdpUnit fsdp_unit = FsdpUnit::block;
  OnSaveError on_error = OnSaveError::stop;
  ResumeFrom resume_from = ResumeFrom::latest;
  ModelKind model = ModelKind::gpt;
  DataKind data = DataKind::tokens;
};

// Every key above, by the constraint table; a value it does not list is the table's ValueError
// ("config: optim.name = "adam" is not one of: adamw, sgd").
ConfigChoices parse_config_choices(const TrainConfig& config);

// The index of `value` among `key`'s choices in the constraint table (the part before a ':' for a
// key whose values carry arguments); ValueError as above when it is not one of them.
size_t config_choice_index(std::string_view key, const std::string& value);

}  // namespace meshtrain::runtime
