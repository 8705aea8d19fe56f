// The local runner: the whole model on this rank (or its tensor-parallel parts), one
// micro-batch after another: the GradSync's hooks around each backward overlap the gradients'
// reduction with the rest of backward; the ParamSync gathers what each forward reads.
#pragma once

#include <optional>

#include "meshtrain/parallel/parts/step_runner.h"

namespace meshtrain::parallel {

class LocalRunner : public StepRunner {
 public:
  // `replicas`: the data-parallel group (null: one replica), whose ranks start from rank 0's
  // values (collective there); the model is then moved to `device`.
  // `broadcast_buffers`: every run() starts from the first replica's buffers (EngineOptions).
  // `expert_copies` set (expert parallelism): the experts (ParamInfo::expert), which differ
  // between the ranks of `replicas`, start from the first of their own copies instead (none
  // when it is null).
  LocalRunner(std::shared_ptr<TrainModel> model, comm::ProcessGroupPtr replicas, Device device,
              bool broadcast_buffers = true,
              std::optional<comm::ProcessGroupPtr> expert_copies = std::nullopt);

  float run(const std::vector<Batch>& micro_batches, const RunOptions& options, GradSync& grads,
            ParamSync& params) override;
  void after_sync() override { model_->complete_gradients(); }
  std::vector<float> take_model_counters() override { return model_->take_step_counters(); }
  nlohmann::json model_metrics(const std::vector<float>& summed) const override {
    return model_->step_metrics(summed);
  }
  void adapt_model(const std::vector<float>& summed) override { model_->adapt_to_step(summed); }
  float evaluate(const std::vector<Batch>& batches, DType precision, ParamSync& params,
                 double* accuracy) override;
  const nn::NamedTensors& parameters() const override { return params_; }
  const std::vector<nn::ParamInfo>& param_infos() const override { return infos_; }
  int64_t num_parameters() const override;
  nn::NamedTensors buffers() const override { return model_->module().named_buffers(); }
  nn::NamedTensors whole_parameters() const override { return model_->whole_parameters(); }
  std::shared_ptr<TrainModel> whole_model() const override;
  std::string describe() const override;
  TrainModel& model() { return *model_; }

 private:
  std::shared_ptr<TrainModel> model_;
  comm::ProcessGroupPtr broadcast_group_;  // null: buffers are not broadcast
  nn::NamedTensors buffers_;
  int replica_ = 0;
  int replicas_ = 1;
  nn::NamedTensors params_;
  std::vector<nn::ParamInfo> infos_;
};

}  // namespace meshtrain::parallel
