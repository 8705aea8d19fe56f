// PsClient: a worker's side of a parameter-server job, as the engine's parts. As the GradSync
// it keeps the gradients in one flat buffer (the parameters' gradients are views of it, so
// backward accumulates straight into what is pushed) and, at the end of the step, pushes each
// server its key range with the step's record, then waits for the replies: the servers' updated
// parameters and, in sync, the records of the workers whose gradients the step applied, from
// which the mean loss is the all-reduce job's bits. The record travels with the gradients, so
// the workers never wait for each other. As the Update it reports the gradient norm the servers
// used and takes their parameters at step(): the optimizer ran on the servers. As the ParamSync
// it says whether the replicas are the same at rest (sync without backup workers).
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/parallel/param_server/parameter_server.h"
#include "meshtrain/parallel/param_server/ps_layout.h"
#include "meshtrain/parallel/parts/grad_sync.h"
#include "meshtrain/parallel/parts/param_sync.h"
#include "meshtrain/parallel/parts/update.h"

namespace meshtrain::parallel {

struct PsClientOptions {
  PsConsistency consistency = PsConsistency::sync;
  int backup_workers = 0;
  int staleness = 3;
};

class PsClient final : public GradSync, public ParamSync, public Update {
 public:
  PsClient(nn::NamedTensors params, PsLayout layout, int worker, comm::ProcessGroupPtr job,
           PsClientOptions options);
  // Tells every server this worker is done (errors are dropped: a failed job ends anyway).
  ~PsClient() override;

  // GradSync
  void zero_grad(const nn::NamedTensors& params) override;
  bool carries_records() const override { return true; }
  float finish_with_record(const StepRecord& mine, StepOutcome& out) override;
  size_t in_flight_bytes() const override;
  bool lockstep() const override { return whole_at_rest(); }
  std::string describe() const override;

  // ParamSync
  bool whole_at_rest() const override;

  // Update
  void set_lr(float lr) override { lr_ = lr; }
  bool unscale(const optim::LossScaler& scaler) override;
  GradSquares grad_squares(const NormShare& share) const override;
  void clip(double /*total_norm*/, double /*max_norm*/) override {}
  void step() override;
  bool sharded() const override { return false; }
  nlohmann::json add_to_checkpoint(ckpt::RankShards& shards,
                                   const StatePlace& place) const override;
  void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
               const StatePlace& place) override;

 private:
  nn::NamedTensors params_;
  PsLayout layout_;
  int worker_;
  comm::ProcessGroupPtr job_;
  PsClientOptions options_;
  Tensor grad_;                // flat, every parameter's gradient in the model's order
  std::vector<float> pulled_;  // flat, the servers' parameters from the last replies
  float lr_ = 0.0f;
  int64_t step_ = 0;
  int64_t resumed_ = 0;  // the checkpoint's step this worker resumed from
  double grad_squares_ = 0.0;
  bool pulled_fresh_ = false;
};

}  // namespace meshtrain::parallel
