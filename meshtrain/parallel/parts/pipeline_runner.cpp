#include "meshtrain/parallel/parts/pipeline_runner.h"

#include <algorithm>

namespace meshtrain::parallel {

namespace {

tp::TpContext tp_context(const DeviceMesh& mesh, bool sequence_parallel) {
  if (!mesh.has("tp") || mesh.size("tp") == 1) return {};
  return tp::TpContext{mesh.group("tp"), sequence_parallel};
}

}  // namespace

PipelineRunner::PipelineRunner(const ModelSource& source, const pipeline::PipelineOptions& options,
                               const DeviceMesh& mesh, bool sequence_parallel)
    : stages_(source, options, mesh.group("pp"), mesh.group("dp"),
              tp_context(mesh, sequence_parallel)) {}

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
  const comm::ProcessGroupPtr& pp = stages_.pp_group();
  if (!pp) return scalars;
  std::string mine = scalars.dump();
  const int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(static_cast<size_t>(pp->size()));
  pp->all_gather(&n, sizes.data(), 1, DType::i64)->wait();
  const size_t width = static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()));
  mine.resize(width, ' ');
  std::string all(width * sizes.size(), ' ');
  pp->all_gather(mine.data(), all.data(), width, DType::u8)->wait();
  for (size_t r = 0; r < sizes.size(); ++r) {
    const nlohmann::json theirs = nlohmann::json::parse(all.substr(r * width, width));
    for (const auto& [k, v] : theirs.items()) scalars[k] = v;
  }
  return scalars;
}

}  // namespace meshtrain::parallel
