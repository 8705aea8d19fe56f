// StepRunner: the forward and backward of a step's micro-batches over what this rank holds of
// the model. The local runner runs the whole model (or its tensor-parallel parts) micro-batch
// after micro-batch (local_runner.h); the pipeline runner runs this rank's stages through a
// schedule (pipeline_runner.h). Both accumulate the step's gradients in the parameters' .grad,
// each micro-batch's loss weighted 1/M, and call the GradSync and ParamSync as they go.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/param_info.h"
#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/parallel/batch.h"
#include "meshtrain/parallel/parts/grad_sync.h"
#include "meshtrain/parallel/parts/param_sync.h"
#include "meshtrain/parallel/train_model.h"

namespace meshtrain::parallel {

struct RunOptions {
  uint64_t seed_base = 0;        // the step's dropout masks
  DType precision = DType::f32;  // autocast's type for the forwards
  float loss_scale = 1.0f;       // f16: what the backwards start from (loss_scaler.h)
  obs::PhaseClock* phases = nullptr;
  // Where set, a runner whose losses are on a device may leave them there unread ([M] f32, one
  // per micro-batch, here) and return 0: the step's gate reads them (optim/step_gate.h).
  Tensor* device_losses = nullptr;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Forward and backward of every micro-batch; returns this data-parallel replica's mean loss
  // (the same bits on each of its ranks).
  virtual float run(const std::vector<Batch>& micro_batches, const RunOptions& options,
                    GradSync& grads, ParamSync& params) = 0;
  // After the gradient sync has finished: what the model completes itself (sequence
  // parallelism's parts).
  virtual void after_sync() {}
  // The model's step counters (TrainModel::take_step_counters) and the metrics of their sum over
  // the replicas.
  virtual std::vector<float> take_model_counters() { return {}; }
  virtual nlohmann::json model_metrics(const std::vector<float>& /*summed*/) const { return {}; }
  // TrainModel::adapt_to_step with the same sums.
  virtual void adapt_model(const std::vector<float>& /*summed*/) {}
  // Mean loss over the batches, no gradients, evaluation mode; `accuracy` (when not null) gets
  // the fraction of samples a classifier labels right, or -1.
  virtual float evaluate(const std::vector<Batch>& batches, DType precision, ParamSync& params,
                         double* accuracy) = 0;

  // This rank's parameters (a pipeline's stages, a tied copy included) and their ParamInfo.
  virtual const nn::NamedTensors& parameters() const = 0;
  virtual const std::vector<nn::ParamInfo>& param_infos() const = 0;
  // Parameters this rank holds a copy of whose owner is another rank (a tied copy): their
  // gradient and state count once, at the owner.
  virtual std::set<std::string> copy_names() const { return {}; }
  // The whole model's parameter count.
  virtual int64_t num_parameters() const = 0;
  // This rank's buffers (BatchNorm's running statistics), in the whole model's names: state a
  // checkpoint keeps beside the parameters, the same on every replica.
  virtual nn::NamedTensors buffers() const { return {}; }
  // Error when copies that must be the same bits differ (the replicas over `dp`, a pipeline's
  // tied copies). Collective.
  virtual void check_in_sync(int64_t step, const comm::ProcessGroupPtr& dp) const;
  // Every parameter's whole value, in the whole model's names. Collective.
  virtual nn::NamedTensors whole_parameters() const = 0;
  // The model this rank holds whole (null when it holds only a part of it).
  virtual std::shared_ptr<TrainModel> whole_model() const { return nullptr; }
  // The optimizer scalars of the whole model from this rank's (a pipeline's stages hold
  // different parameters' step counts). Collective.
  virtual nlohmann::json merge_scalars(nlohmann::json scalars) const { return scalars; }
  // The start-up line's part for this runner's split of the model ("" when it is not split).
  virtual std::string describe() const = 0;
};

}  // namespace meshtrain::parallel
