// TrainEngine's pipeline-parallel mode (the constructor from a mesh): the step runs through
// PipelineStages instead of the whole-model forward and backward; the rest of the step (the
// global loss, the skip decisions, clipping, the optimizer) is the data-parallel path's.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/step_record.h"
// The engine's members are destroyed here too (a throwing constructor).
#include "meshtrain/parallel/zero/fsdp_units.h"
#include "meshtrain/parallel/zero/zero_shards.h"

namespace meshtrain::parallel {

TrainEngine::TrainEngine(const nn::GPTConfig& config, const DeviceMesh& mesh, EngineOptions options)
    : options_(std::move(options)), config_(config) {
  MT_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 2,
           "ZeRO-3 with pipeline or tensor parallelism is not available (parallel.zero_stage = ",
           options_.zero_stage, "); use parallel.zero_stage = 0, 1 or 2");
  world_group_ = mesh.world();
  rank_ = mesh.rank();
  world_ = mesh.size();
  group_ = mesh.group("dp");
  tp::TpContext tp;
  if (mesh.has("tp") && mesh.size("tp") > 1) {
    MT_CHECK(options_.precision == DType::f32 && !options_.loss_scaler,
             "pipeline and tensor parallelism together run in f32 for now");
    tp_group_ = mesh.group("tp");
    tp = tp::TpContext{tp_group_, options_.sequence_parallel};
  } else {
    MT_CHECK(!options_.sequence_parallel,
             "sequence parallelism needs a tp dimension of more than one rank");
  }
  pipe_ = std::make_unique<pipeline::PipelineStages>(config, options_.pipeline, mesh.group("pp"),
                                                     group_, std::move(tp));
  params_ = pipe_->parameters();
  if (options_.zero_stage > 0 && group_) {
    // ZeRO over the stage's replicas, on whatever parameters this rank's stage holds: the
    // reducer's hooks stay idle through the pipeline's backward passes (its gradients are final
    // only after the last micro-batch and the tied copies' sum), and the step reduces them at
    // once (reduce_held_gradients).
    reducer_ = std::make_unique<Reducer>(
        params_, group_,
        ZeroShards::reducer_options(options_.reducer, options_.zero_stage, group_->size()));
    reducer_->set_require_sync(false);
    zero_ = std::make_unique<ZeroShards>(
        params_, *reducer_, group_, options_.zero_stage,
        [this](std::vector<optim::ParamGroup> g) { return make_optimizer(std::move(g)); },
        options_.weight_decay);
  } else {
    optimizer_ = make_optimizer(optim::decay_groups(params_, options_.weight_decay));
  }
  if (options_.loss_scaler) scaler_ = std::make_unique<optim::LossScaler>(*options_.loss_scaler);
}

std::optional<pipeline::ShardedGradients> TrainEngine::pipeline_zero_sync(
    optim::LossScaler* scaler) {
  reducer_->reduce_held_gradients();
  if (options_.zero_stage < 2) return std::nullopt;  // whole averaged gradients (bucket views)
  // Each replica holds a flat shard of the stage's gradients: its sums of squares (the tied copy
  // left out) and overflow flag travel in one all-gather over the replicas, added in rank order,
  // so every replica of the stage holds the same sums. With tensor parallelism the parameters
  // are this tp rank's: the squares of its tp parts are then added over the tp ranks too (in tp
  // rank order), those of the replicated ones, the same on every tp rank, once.
  const ShardedOptimizer& opt = zero_->optimizer();
  const std::set<std::string> skip = pipe_->copy_names();
  std::set<std::string> tp_parts;
  if (tp_group_)
    for (const nn::ParamInfo& info : pipe_->param_infos())
      if (info.init.shard.defined()) tp_parts.insert(info.name);
  // {replicated squares, tp parts' squares, overflow}
  double local[3] = {0.0, 0.0, scaler && opt.unscale(*scaler) ? 1.0 : 0.0};
  for (const auto& [name, sq] : opt.local_grad_squares_by_param())
    if (!skip.count(name)) local[tp_parts.count(name) ? 1 : 0] += sq;
  const int n = group_->size();
  std::vector<double> each(3 * static_cast<size_t>(n));
  group_->all_gather(local, each.data(), 3, DType::i64)->wait();
  pipeline::ShardedGradients out;
  double parts = 0.0;
  for (int r = 0; r < n; ++r) {
    out.sum_squares += each[3 * static_cast<size_t>(r)];
    parts += each[3 * static_cast<size_t>(r) + 1];
    out.overflow = out.overflow || each[3 * static_cast<size_t>(r) + 2] > 0;
  }
  if (tp_group_) {
    std::vector<double> over_tp(static_cast<size_t>(tp_group_->size()));
    tp_group_->all_gather(&parts, over_tp.data(), 1, DType::i64)->wait();
    parts = 0.0;
    for (double v : over_tp) parts += v;
  }
  out.sum_squares += parts;
  return out;
}

int TrainEngine::data_parallel_rank() const {
  if (!pipe_) return rank_;
  return group_ ? group_->rank() : 0;
}

int TrainEngine::data_parallel_size() const {
  if (!pipe_) return world_;
  return group_ ? group_->size() : 1;
}

StepOutcome TrainEngine::pipeline_step(const std::vector<Batch>& micro_batches,
                                       const StepOptions& so) {
  const auto t0 = std::chrono::steady_clock::now();
  obs::PhaseClock local_phases;
  obs::PhaseClock& phases = so.phases ? *so.phases : local_phases;
  StepOutcome out;
  if (zero_)
    zero_->optimizer().set_lr(so.lr);
  else
    optimizer_->set_lr(so.lr);
  if (zero_ && options_.zero_stage == 1) {
    // From the second step on the gradients are views of the reducer's buckets: zeroed in place,
    // the program's backwards accumulate straight into the buckets, with no second copy of the
    // stage's gradients held until the reduction.
    for (auto& [name, p] : params_)
      if (p.grad().defined()) {
        Tensor g = p.grad();
        g.zero_();
      }
  } else {
    zero_grad();
  }
  phases.end(obs::Phase::kData);
  const uint64_t seed_base = (options_.seed * 1000003ull + static_cast<uint64_t>(so.step)) * 64;
  // Forwards, backwards and their transfers interleave: the phase clock sees one backward span.
  out.loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  pipeline::GradientSync sync;
  if (zero_) sync = [this](optim::LossScaler* scaler) { return pipeline_zero_sync(scaler); };
  const pipeline::PipelineStepResult r =
      pipe_->step(micro_batches, seed_base, options_.precision, scaler_.get(), sync);
  out.overflow = r.overflow;
  phases.end(obs::Phase::kBackward);
  float loss_v = r.loss;  // this replica's mean loss, the same bits on each of its stages
  if (so.poison_loss) loss_v = std::nanf("");
  loss_v *= so.scale_loss;
  // As the data-parallel path (step_record.h), over the whole job. Every rank of a replica
  // carries its replica's loss, so the mean over all ranks is the mean over replicas.
  out.stop = so.stop_request;
  out.save = so.save_request;
  if (world_group_) {
    const StepRecord record(
        loss_v, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
        so.stop_request, so.save_request);
    std::vector<float> all(StepRecord::kFloats * static_cast<size_t>(world_));
    world_group_->all_gather(record.mine.data(), all.data(), StepRecord::kFloats, DType::f32)
        ->wait();
    loss_v = StepRecord::combine(all, world_, out);
  }
  phases.end(obs::Phase::kComm);
  // The norm over the whole model (stages summed, the tied weight once), after the replicas'
  // average: the same on every rank, so every rank takes the same decisions below.
  return finish_step(std::move(out), loss_v, r.grad_norm, so, phases);
}

void TrainEngine::consolidate_pipeline(int root) {
  const nn::NamedTensors whole = pipe_->gather_parameters();
  if (root >= 0 && rank_ != root) return;
  model_ = std::make_shared<nn::GPT>(config_);
  model_->load_state_dict(std::map<std::string, Tensor>(whole.begin(), whole.end()));
}

}  // namespace meshtrain::parallel
