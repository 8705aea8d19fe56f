// See plan_check.h. An illegal combination names both keys; a strategy that does not exist yet
// is refused rather than silently ignored.
#include "meshtrain/runtime/plan_check.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/pipeline/schedule.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/plan/pipeline_split.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

void check_keys(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  if (r.choice.model == ModelKind::gpt && c.model.n_embd % c.model.n_head != 0) {
    MT_THROW(ValueError, "config: model.n_embd (", c.model.n_embd,
             ") must be divisible by model.n_head (", c.model.n_head, ")");
  }
  const bool checkpoints = c.ckpt.interval > 0 || c.ckpt.interval_minutes > 0;
  if (c.ckpt.keep_best && !checkpoints)
    MT_THROW(ValueError,
             "config: ckpt.keep_best needs checkpoints (set ckpt.interval or "
             "ckpt.interval_minutes > 0)");
  if (c.train.rollback_after > 0 && !checkpoints)
    MT_THROW(ValueError, "config: train.rollback_after needs checkpoints (set ckpt.interval > 0)");
  if (c.data.shard_block > 0 && r.choice.data != DataKind::tokens)
    MT_THROW(ValueError, "config: data.shard_block shuffles token shards in blocks; data.kind = \"",
             c.data.kind, "\" has no shards (leave data.shard_block at 0)");
  if (r.data_cache_limit && !(c.data.shard_block > 0 && ckpt::is_object_uri(c.data.dir)))
    MT_THROW(ValueError, "config: data.cache_limit bounds the cache of a dataset read shard by ",
             "shard, which needs data.dir = s3://... and data.shard_block > 0 (data.dir = \"",
             c.data.dir, "\", data.shard_block = ", c.data.shard_block, ")");
  if (c.train.spike_zscore > 0 && c.train.spike_window < 10)
    MT_THROW(ValueError,
             "config: train.spike_window must be at least 10 when train.spike_zscore "
             "is set, got ",
             c.train.spike_window);
}

// The data each model family trains on.
DataKind data_of(ModelKind model) {
  switch (model) {
    case ModelKind::mlp:
      return DataKind::spirals;
    case ModelKind::resnet:
      return DataKind::fashion_mnist;
    case ModelKind::gpt:
      break;
  }
  return DataKind::tokens;
}

// model.kind against the data and the settings only one family has.
void check_model(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  const DataKind data = data_of(r.choice.model);
  if (r.choice.data != data) {
    const char* names[] = {"tokens", "spirals", "fashion_mnist"};
    MT_THROW(ValueError, "config: model.kind = \"", c.model.kind, "\" trains on data.kind = \"",
             names[static_cast<int>(data)], "\", not \"", c.data.kind, "\"; set data.kind = \"",
             names[static_cast<int>(data)], "\" or choose the model.kind of that data");
  }
  if (c.model.sync_batch_norm && r.choice.model != ModelKind::resnet)
    MT_THROW(ValueError,
             "config: model.sync_batch_norm = true needs a model with batch norm; "
             "model.kind = \"",
             c.model.kind, "\" has none (use model.kind = \"resnet\")");
  if (c.train.label_smoothing > 0 && r.choice.model != ModelKind::resnet)
    MT_THROW(ValueError, "config: train.label_smoothing = ", c.train.label_smoothing,
             " applies to the ResNet's loss only; model.kind = \"", c.model.kind,
             "\" ignores it (use 0)");
  if (r.choice.model == ModelKind::gpt) return;
  auto refuse = [&](std::string_view key, const auto& value, std::string_view fix) {
    MT_THROW(ValueError, "config: model.kind = \"", c.model.kind, "\" and ", key, " = ", value,
             " cannot be combined: ", fix);
  };
  if (c.parallel.tp > 1)
    refuse("parallel.tp", c.parallel.tp,
           "the classifier is not split over tensor-parallel ranks; use parallel.tp = 1");
  if (c.parallel.sequence_parallel)
    refuse("parallel.sequence_parallel", "true",
           "sequence parallelism splits a language model's time steps; use false");
  if (c.model.dropout > 0)
    refuse("model.dropout", c.model.dropout, "the classifier has no dropout; use 0");
  if (r.activation_checkpointing())
    refuse("model.activation_checkpointing", c.model.activation_checkpointing,
           "the classifier keeps its activations; use \"none\"");
  if (r.choice.model != ModelKind::resnet) return;
  if (c.parallel.pp > 1)
    refuse("parallel.pp", c.parallel.pp, "a pipeline of the ResNet is not available yet; use 1");
  if (r.choice.precision != PrecisionChoice::f32)
    refuse("train.precision", "\"" + c.train.precision + "\"",
           "the convolutions run in f32 for now; use f32");
}

// The pieces a pipeline cuts the model into (plan/pipeline_split.h).
plan::PipelinePieces pipeline_pieces(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  if (r.choice.model == ModelKind::mlp) {
    const auto n = static_cast<int64_t>(r.mlp_hidden.size()) + 1;
    const std::string what =
        "Linear layers (model.mlp_hidden = \"" + c.model.mlp_hidden + "\" and the output)";
    return {n, n, what, "the model's " + std::to_string(n) + " " + what};
  }
  return plan::gpt_pipeline_pieces(c.model.n_layer);
}

// parallel.pp, schedule, micro_batches and virtual_stages.
void check_pipeline(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  const ParallelConfig& p = c.parallel;
  if (p.pp < 1) MT_THROW(ValueError, "config: parallel.pp = ", p.pp, " must be at least 1");
  if (p.micro_batches < 0)
    MT_THROW(ValueError, "config: parallel.micro_batches = ", p.micro_batches,
             " must be 0 (one per accumulation step) or positive");
  if (p.pp == 1) {
    // Without a pipeline a step has one micro-batch per accumulation step.
    if (p.micro_batches > 1)
      MT_THROW(ValueError, "config: parallel.micro_batches = ", p.micro_batches,
               " applies to a pipeline (parallel.pp > 1); without one use train.grad_accum_steps");
    if (p.virtual_stages != 1)
      MT_THROW(ValueError, "config: parallel.virtual_stages = ", p.virtual_stages,
               " applies to a pipeline (parallel.pp > 1); use 1");
    return;
  }
  plan::check_pipeline_split(p.pp, p.virtual_stages, pipeline_pieces(r));
  const int64_t batch = c.data.batch_size * c.train.grad_accum_steps;
  if (p.micro_batches > 0 && batch % p.micro_batches != 0)
    MT_THROW(ValueError, "config: parallel.micro_batches = ", p.micro_batches,
             " does not divide the batch of ", batch, " sequences per replica (data.batch_size ",
             c.data.batch_size, " x train.grad_accum_steps ", c.train.grad_accum_steps,
             "); use a divisor of it");
  const int64_t M = p.micro_batches > 0 ? p.micro_batches : c.train.grad_accum_steps;
  parallel::pipeline::PipelineShape{static_cast<int>(p.pp), static_cast<int>(M),
                                    static_cast<int>(p.virtual_stages), r.schedule}
      .validate();
  auto not_with_pp = [&](std::string_view what, std::string_view fix) {
    MT_THROW(ValueError, "config: ", what, " with parallel.pp = ", p.pp, " is not available yet; ",
             fix);
  };
  // ZeRO-3 would gather every unit's parameters over dp once per micro-batch and per forward and
  // backward, inside the pipeline's schedule (docs/pipeline.md).
  if (p.zero_stage == 3)
    not_with_pp("parallel.zero_stage = 3",
                "use parallel.zero_stage = 1 or 2 (optimizer state and gradients sharded over dp)");
}

// parallel.tp and parallel.sequence_parallel, and what tensor parallelism cannot be combined
// with yet.
void check_tensor_parallel(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  const ParallelConfig& p = c.parallel;
  if (r.choice.model != ModelKind::gpt) return;  // check_model refuses tp for the others
  try {
    nn::GPTConfig shape;
    shape.n_embd = c.model.n_embd;
    shape.n_head = c.model.n_head;
    parallel::tp::validate_tensor_parallel(shape, static_cast<int>(p.tp), p.sequence_parallel);
  } catch (const ValueError& e) {
    MT_THROW(ValueError, "config: ", e.what());
  }
  if (p.tp == 1) return;
  if (p.sequence_parallel && c.model.block_size % p.tp != 0)
    MT_THROW(ValueError, "config: model.block_size (", c.model.block_size,
             ") is not divisible by parallel.tp (", p.tp,
             "), which parallel.sequence_parallel needs: each tensor-parallel rank holds "
             "block_size / tp time steps");
  auto refuse = [&](std::string_view key, const auto& value, std::string_view fix) {
    MT_THROW(ValueError, "config: parallel.tp = ", p.tp, " and ", key, " = ", value,
             " cannot be combined yet; ", fix);
  };
  if (p.zero_stage == 3)
    refuse("parallel.zero_stage", p.zero_stage,
           "use parallel.zero_stage = 1 or 2 (optimizer state and gradients sharded over dp)");
  if (r.choice.precision != PrecisionChoice::f32)
    refuse("train.precision", c.train.precision, "use train.precision = \"f32\"");
  if (c.train.log_layer_norms)
    refuse("train.log_layer_norms", "true",
           "per-layer norms of tensor-parallel shards are not available yet");
}

void check_parallel(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  const ParallelConfig& p = c.parallel;
  check_tensor_parallel(r);
  check_pipeline(r);
  if (p.zero_stage == 0) return;
  if (p.zero_stage >= 2 && r.comm_hook.kind != parallel::CommHookKind::allreduce)
    MT_THROW(ValueError, "config: parallel.zero_stage = ", p.zero_stage, " and dist.comm_hook = \"",
             c.dist.comm_hook,
             "\" cannot be combined: ZeRO-2/3 reduce-scatter full-precision gradients into "
             "shards, which a compressing hook cannot do; use dist.comm_hook = \"allreduce\" or "
             "parallel.zero_stage = 1");
}

// The mesh is pp x dp x tp: pp x tp must divide the ranks.
void check_world(const TrainConfig& c, int world) {
  const int64_t pp = c.parallel.pp, tp = c.parallel.tp;
  if (world % (pp * tp) != 0)
    MT_THROW(ValueError, "config: parallel.pp x parallel.tp = ", pp * tp, " does not divide the ",
             world, " ranks, so no pp x dp x tp is the world size; launch a multiple of ", pp * tp,
             " ranks or change parallel.pp / parallel.tp");
}

// A training-mode BatchNorm over one image per rank normalises that image over its own pixels
// (instance normalisation) and learns running statistics of single images, which evaluation then
// applies to every image: it runs, and evaluates badly (the small ResNet's val_loss went from 2.3
// to 10.5 in 3 steps). SyncBatchNorm over 2+ data-parallel ranks sees 2+ images, so it is legal.
void check_batch_norm(const ResolvedConfig& r, std::optional<int> world) {
  const TrainConfig& c = r.config;
  if (r.choice.model != ModelKind::resnet || c.data.batch_size != 1) return;
  const int64_t model_ranks = std::max<int64_t>(1, c.parallel.pp * c.parallel.tp);
  const int64_t dp = world ? *world / model_ranks : 0;  // 0: not known
  if (c.model.sync_batch_norm && (dp == 0 || dp >= 2)) return;
  MT_THROW(ValueError, "config: data.batch_size = 1 and model.kind = \"resnet\": in training each ",
           "BatchNorm would normalise one image per rank over its own pixels and keep running ",
           "statistics of single images; use data.batch_size >= 2",
           c.model.sync_batch_norm ? " or launch 2 or more ranks"
                                   : ", or model.sync_batch_norm = true over 2 or more ranks");
}

}  // namespace

// Mixture-of-experts blocks against what they cannot be combined with yet.
void check_moe(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  if (!r.moe.enabled()) return;
  auto refuse = [&](std::string_view key, const auto& value, std::string_view fix) {
    MT_THROW(ValueError, "config: model.moe.every = ", c.model.moe_every, " and ", key, " = ",
             value, " cannot be combined: ", fix);
  };
  if (r.choice.model != ModelKind::gpt)
    refuse("model.kind", "\"" + c.model.kind + "\"",
           "mixture-of-experts blocks replace a transformer's MLPs; use model.kind = \"gpt\" or "
           "model.moe.every = 0");
  if (c.parallel.pp > 1)
    refuse("parallel.pp", c.parallel.pp,
           "the experts do not run in a pipeline stage yet; use parallel.pp = 1");
  if (c.parallel.tp > 1)
    refuse("parallel.tp", c.parallel.tp,
           "the experts are not split over tensor-parallel ranks yet; use parallel.tp = 1");
}

// parallel.ep: the experts shared out over ep data-parallel ranks. Their gradients are reduced by
// a reducer of their own over the ranks holding the same experts, so nothing else that reshapes
// the gradients' reduction goes with it yet.
void check_expert_parallel(const ResolvedConfig& r, std::optional<int> world) {
  const TrainConfig& c = r.config;
  const int64_t ep = c.parallel.ep;
  if (ep == 1) return;
  if (!r.moe.enabled())
    MT_THROW(ValueError, "config: parallel.ep = ", ep,
             " shares out mixture-of-experts blocks, and this model has none; set "
             "model.moe.every > 0 or parallel.ep = 1");
  if (c.model.moe_num_experts % ep != 0)
    MT_THROW(ValueError, "config: parallel.ep = ", ep,
             " does not divide model.moe.num_experts = ", c.model.moe_num_experts,
             "; each expert-parallel rank holds the same number of "
             "experts, so use an ep that divides it");
  auto refuse = [&](std::string_view key, const auto& value, std::string_view fix) {
    MT_THROW(ValueError, "config: parallel.ep = ", ep, " and ", key, " = ", value,
             " cannot be combined: ", fix);
  };
  if (c.parallel.zero_stage != 0)
    refuse("parallel.zero_stage", c.parallel.zero_stage,
           "the experts' gradients are reduced over their own replicas, which ZeRO does not "
           "shard yet; use parallel.zero_stage = 0");
  if (r.comm_hook.kind != parallel::CommHookKind::allreduce)
    refuse("dist.comm_hook", "\"" + c.dist.comm_hook + "\"",
           "the experts' gradients are averaged over another group than the hook's; use "
           "dist.comm_hook = \"allreduce\"");
  if (!world) return;
  const int64_t dp = *world / std::max<int64_t>(1, c.parallel.pp * c.parallel.tp);
  if (dp % ep != 0)
    MT_THROW(ValueError, "config: parallel.ep = ", ep, " does not divide the ", dp,
             " data-parallel ranks; launch a multiple of ", ep,
             " ranks or choose an ep that divides them");
}

// parallel.mode other than ddp: replicas that each hold the whole model, so nothing that splits
// the model or its state over ranks; and the keys of one mode only with it.
void check_mode(const ResolvedConfig& r) {
  const TrainConfig& c = r.config;
  const ParallelConfig& p = c.parallel;
  const bool ps = p.mode == "parameter_server", gossip = p.mode == "gossip";
  if (!ps && !gossip) return;
  auto refuse = [&](std::string_view key, const auto& value, std::string_view fix) {
    MT_THROW(ValueError, "config: parallel.mode = \"", p.mode, "\" and ", key, " = ", value,
             " cannot be combined: ", fix);
  };
  const std::string_view whole =
      ps ? "the servers hold the whole model's parameters and optimizer state"
         : "each replica averages its whole model with its neighbours";
  if (p.zero_stage != 0) refuse("parallel.zero_stage", p.zero_stage, whole);
  if (p.pp > 1) refuse("parallel.pp", p.pp, whole);
  if (p.tp > 1) refuse("parallel.tp", p.tp, whole);
  if (r.comm_hook.kind != parallel::CommHookKind::allreduce)
    refuse("dist.comm_hook", "\"" + c.dist.comm_hook + "\"",
           "gradients do not go through an all-reduce in this mode; use dist.comm_hook = "
           "\"allreduce\"");
  if (r.precision == DType::f16)
    refuse("train.precision", "\"f16\"",
           "the loss scaler's overflow decision is not shared in this mode; use f32 or bf16");
  if (r.moe.enabled())
    refuse("model.moe.every", c.model.moe_every,
           "the experts' load counters are reduced over an all-reduce group; use "
           "parallel.mode = \"ddp\"");
  // Workers not in lock step (asynchronous ones, or sync ones with backup workers, whose
  // dropped batches are trained again at steps of the worker's own) checkpoint only at steps
  // every worker reaches by its own count (the interval's and the last), not at rank 0's clock.
  if (ps && (p.ps_consistency != "sync" || p.ps_backup_workers > 0) && c.ckpt.interval_minutes > 0)
    refuse("ckpt.interval_minutes", c.ckpt.interval_minutes,
           p.ps_consistency != "sync"
               ? "asynchronous workers checkpoint at steps each reaches by its own count; use "
                 "ckpt.interval (steps) instead"
               : "with backup workers a checkpoint is a step that waits for every worker, which "
                 "only steps every worker counts to can be; use ckpt.interval (steps) instead");
  if (ps && c.ckpt.keep_best)
    refuse("ckpt.keep_best", "true",
           "the servers save at the workers' interval steps only; set ckpt.keep_best = false");
  if (ps && c.train.rollback_after > 0)
    refuse("train.rollback_after", c.train.rollback_after,
           "a rollback would need the servers to load an earlier step; set "
           "train.rollback_after = 0");
  if (ps && c.train.spike_zscore > 0)
    refuse("train.spike_zscore", c.train.spike_zscore,
           "the servers apply a step before a worker could skip it as a spike; set "
           "train.spike_zscore = 0");
  if (ps && c.train.log_layer_norms)
    refuse("train.log_layer_norms", "true",
           "the servers keep one norm per step, not one per layer; set train.log_layer_norms = "
           "false");
  if (ps && p.ps_backup_workers > 0 && p.ps_consistency != "sync")
    refuse("parallel.ps.backup_workers", p.ps_backup_workers,
           "backup workers drop the late gradients of a synchronous step; use "
           "parallel.ps.consistency = \"sync\" or backup_workers = 0");
}

void check_plan(const ResolvedConfig& r, std::optional<int> world) {
  check_keys(r);
  check_model(r);
  check_moe(r);
  check_expert_parallel(r, world);
  check_mode(r);
  check_parallel(r);
  check_batch_norm(r, world);
  if (world) check_world(r.config, *world);
}

}  // namespace meshtrain::runtime
