#include "meshtrain/parallel/parts/pipeline_runner.h"

#include <algorithm>

#include "meshtrain/parallel/gathered_json.h"

namespace meshtrain::parallel {

namespace {

tp::TpContext tp_context(const DeviceMesh& mesh, bool sequence_parallel,
                         comm::ProcessGroupPtr device_tp) {
  if (!mesh.has("tp") || mesh.size("tp") == 1) return {};
  return tp::TpContext{device_tp ? std::move(device_tp) : mesh.group("tp"), sequence_parallel};
}

}  // namespace

PipelineRunner::PipelineRunner(const ModelSource& source, const pipeline::PipelineOptions& options,
                               const DeviceMesh& mesh, bool sequence_parallel, Device device,
                               comm::ProcessGroupPtr device_tp)
    : stages_(source, options, mesh.group("pp"), mesh.group("dp"),
              tp_context(mesh, sequence_parallel, std::move(device_tp)), device) {}

float PipelineRunner::run(const std::vector<Batch>& micro_batches, const RunOptions& o,
                          GradSync& /*grads*/, ParamSync& /*params*/) {
  obs::PhaseClock local_phases;
  obs::PhaseClock& phases = o.phases ? *o.phases : local_phases;
  phases.end(obs::Phase::kData);
  const float loss = stages_.step(micro_batches, o.seed_base, o.precision, o.loss_scale);
  // Forwards, backwards and their transfers interleave: the phase clock sees one backward span.
  phases.end(obs::Phase::kBackward);
  return loss;
}

float PipelineRunner::evaluate(const std::vector<Batch>& batches, DType precision,
                               ParamSync& /*params*/, double* accuracy) {
  // The last stage holds the logits; classifiers' accuracy under a pipeline is not reported yet.
  if (accuracy) *accuracy = -1;
  return stages_.evaluate(batches, precision);
}

void PipelineRunner::check_in_sync(int64_t step, const comm::ProcessGroupPtr& /*dp*/) const {
  // The stage's replicas and the tied copies, in one check.
  stages_.check_in_sync(step);
}

// Each stage holds its own parameters' step counts: they are gathered over the stages so that
// rank 0's train state holds every parameter's. Padded to the longest text, one equal-count
// all-gather.
nlohmann::json PipelineRunner::merge_scalars(nlohmann::json scalars) const {
  return merge_json_objects(stages_.pp_group(), std::move(scalars));
}

}  // namespace meshtrain::parallel
