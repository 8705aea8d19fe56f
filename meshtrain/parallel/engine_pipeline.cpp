// TrainEngine's pipeline-parallel mode (the constructor from a mesh): the step runs through
// PipelineStages instead of the whole-model forward and backward; the rest of the step (the
// global loss, the skip decisions, clipping, the optimizer) is the data-parallel path's.
#include <chrono>
#include <cmath>

#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/engine.h"
// The engine's members are destroyed here too (a throwing constructor).
#include "meshtrain/parallel/zero/fsdp_units.h"
#include "meshtrain/parallel/zero/zero_shards.h"

namespace meshtrain::parallel {

TrainEngine::TrainEngine(const nn::GPTConfig& config, const DeviceMesh& mesh, EngineOptions options)
    : options_(std::move(options)), config_(config) {
  MT_CHECK(options_.zero_stage == 0, "ZeRO with pipeline parallelism is not available yet");
  MT_CHECK(options_.precision == DType::f32 && !options_.loss_scaler,
           "pipeline parallelism runs in f32 only for now");
  world_group_ = mesh.world();
  rank_ = mesh.rank();
  world_ = mesh.size();
  group_ = mesh.group("dp");
  pipe_ = std::make_unique<pipeline::PipelineStages>(config, options_.pipeline, mesh.group("pp"),
                                                     group_);
  params_ = pipe_->parameters();
  optimizer_ = make_optimizer(optim::decay_groups(params_, options_.weight_decay));
}

nn::GPT& TrainEngine::model() {
  MT_CHECK(model_, "under pipeline parallelism no rank holds the whole model until consolidate()");
  return *model_;
}

const nn::GPT& TrainEngine::model() const {
  MT_CHECK(model_, "under pipeline parallelism no rank holds the whole model until consolidate()");
  return *model_;
}

int64_t TrainEngine::num_parameters() const {
  return pipe_ ? pipe_->num_parameters() : model_->num_parameters();
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
  optimizer_->set_lr(so.lr);
  zero_grad();
  phases.end(obs::Phase::kData);
  const uint64_t seed_base = (options_.seed * 1000003ull + static_cast<uint64_t>(so.step)) * 64;
  // Forwards, backwards and their transfers interleave: the phase clock sees one backward span.
  const pipeline::PipelineStepResult r = pipe_->step(micro_batches, seed_base);
  phases.end(obs::Phase::kBackward);
  float loss_v = r.loss;  // this replica's mean loss, the same bits on each of its stages
  if (so.poison_loss) loss_v = std::nanf("");
  loss_v *= so.scale_loss;
  bool stop = so.stop_request;
  // As the data-parallel path: one all-gather of [loss, compute time, stop] over the whole job.
  // Every rank of a replica carries its replica's loss, so the mean over all ranks is the mean
  // over replicas, summed in rank order (the same bits everywhere).
  const float mine[3] = {
      loss_v,
      static_cast<float>(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()),
      stop ? 1.0f : 0.0f};
  if (world_group_) {
    std::vector<float> all(3 * static_cast<size_t>(world_));
    world_group_->all_gather(mine, all.data(), 3, DType::f32)->wait();
    double sum = 0;
    for (int rk = 0; rk < world_; ++rk) {
      sum += all[3 * static_cast<size_t>(rk)];
      out.rank_step_s.push_back(all[3 * static_cast<size_t>(rk) + 1]);
      stop = stop || all[3 * static_cast<size_t>(rk) + 2] > 0.0f;
    }
    loss_v = static_cast<float>(sum / world_);
  }
  out.stop = stop;
  phases.end(obs::Phase::kComm);
  // The norm over the whole model (stages summed, the tied weight once), after the replicas'
  // average: the same on every rank, so every rank takes the same decisions below.
  const double norm = r.grad_norm;
  out.grad_norm = norm;
  if (so.before_update) so.before_update();
  if (!std::isfinite(loss_v) || !std::isfinite(norm)) {
    out.skipped = true;
  } else if (so.skip_update && so.skip_update(loss_v, norm)) {
    out.skipped = true;
    out.spike = true;
  } else {
    // The tied copies are scaled alike and updated alike, so they stay the same bits.
    if (so.grad_clip > 0) optim::clip_grad_norm_with_total(params_, norm, so.grad_clip);
    optimizer_->step();
  }
  out.loss = loss_v;
  phases.end(obs::Phase::kOptimizer);
  return out;
}

void TrainEngine::consolidate_pipeline(int root) {
  const nn::NamedTensors whole = pipe_->gather_parameters();
  if (root >= 0 && rank_ != root) return;
  model_ = std::make_shared<nn::GPT>(config_);
  model_->load_state_dict(std::map<std::string, Tensor>(whole.begin(), whole.end()));
}

}  // namespace meshtrain::parallel
