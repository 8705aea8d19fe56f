// The pipeline runner: this rank's stages (pipeline::PipelineStages) run through the schedule.
// Their backward passes interleave with other micro-batches' forwards, and a stage's gradients
// are final only after its last micro-batch and the tied copies' sum, so the engine's GradSync
// reduces them after run() (held), not from backward's hooks.
#pragma once

#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/parallel/parts/step_runner.h"
#include "meshtrain/parallel/pipeline/pipeline_stages.h"

namespace meshtrain::parallel {

class PipelineRunner : public StepRunner {
 public:
  // This rank's stages of `source`, placed by the mesh's pp coordinate, split over its tp group
  // when that has more than one rank, on `device`; `device_tp`: the tp group a device's
  // activations go through (the device group's, null on the CPU).
  PipelineRunner(const ModelSource& source, const pipeline::PipelineOptions& options,
                 const DeviceMesh& mesh, bool sequence_parallel, Device device = Device::cpu(),
                 comm::ProcessGroupPtr device_tp = nullptr);

  float run(const std::vector<Batch>& micro_batches, const RunOptions& options, GradSync& grads,
            ParamSync& params) override;
  float evaluate(const std::vector<Batch>& batches, DType precision, ParamSync& params,
                 double* accuracy) override;
  const nn::NamedTensors& parameters() const override { return stages_.parameters(); }
  const std::vector<nn::ParamInfo>& param_infos() const override { return stages_.param_infos(); }
  std::set<std::string> copy_names() const override { return stages_.copy_names(); }
  int64_t num_parameters() const override { return stages_.num_parameters(); }
  void check_in_sync(int64_t step, const comm::ProcessGroupPtr& dp) const override;
  nn::NamedTensors whole_parameters() const override { return stages_.gather_parameters(); }
  nlohmann::json merge_scalars(nlohmann::json scalars) const override;
  std::string describe() const override { return stages_.describe(); }

 private:
  pipeline::PipelineStages stages_;
};

}  // namespace meshtrain::parallel
