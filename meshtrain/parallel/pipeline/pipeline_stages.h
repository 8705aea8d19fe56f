// PipelineStages: the engine's pipeline stage runner. It builds only this rank's chunks of the
// model (the ModelSource's stack, cut by partition()), runs a step's micro-batches through the
// StageRunner, sums the tied copies' gradients and shares the loss over the stages, and gives the
// engine what it needs of the whole model without any rank holding it: the validation loss, the
// replica and tie checks, and the whole parameters when they are asked for. The gradients'
// reduction over the data-parallel replicas is the engine's GradSync, as without a pipeline.
//
// Ranks are placed by the engine's DeviceMesh {pp, dp, tp}: `pp_group` holds one rank per stage
// of this replica, `dp_group` the ranks holding this stage in the other replicas (null: one).
// With tensor parallelism (`tp` of more than one rank) the chunks are this rank's tp parts;
// `pp_group` then pairs tp rank t of every stage, so activations and gradients travel between
// equal tp ranks, and everything below is per tp rank except where it says otherwise.
//
// Tied parameters (a ParamInfo tie group, as GPT's embedding and head) belong to the first
// stage; the last stage holds a copy whose gradient the StageRunner adds to the owner's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/models/model_stack.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/batch.h"
#include "meshtrain/parallel/model_source.h"
#include "meshtrain/parallel/pipeline/schedule.h"
#include "meshtrain/parallel/pipeline/stage_runner.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"

namespace meshtrain::parallel::pipeline {

struct PipelineOptions {
  int stages = 1;  // parallel.pp
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  // parallel.micro_batches: the step's batches are joined and cut into this many equal
  // micro-batches; 0: one micro-batch per batch handed over (train.grad_accum_steps).
  int micro_batches = 0;
  int virtual_stages = 1;                                          // parallel.virtual_stages
  models::PartitionCost partition = models::PartitionCost::flops;  // parallel.partition
};

class PipelineStages {
 public:
  // Collective over neither group (every rank builds its chunks from the same keyed
  // initialisation, so the replicas agree without a broadcast). The chunks are built on the host
  // and moved to `device`; on a device the stages' transfers go through host memory.
  PipelineStages(const ModelSource& source, const PipelineOptions& options,
                 comm::ProcessGroupPtr pp_group, comm::ProcessGroupPtr dp_group,
                 tp::TpContext tp = {}, Device device = Device::cpu());

  // This rank's parameters, chunk after chunk; the last stage's copy of a tied embedding too.
  const nn::NamedTensors& parameters() const { return params_; }
  // ParamInfo of parameters(), in the same order (whole names and shapes, tp placements).
  const std::vector<nn::ParamInfo>& param_infos() const { return infos_; }
  // The parameters whose value this rank is the owner of for the whole model: all of them,
  // less the tied copy the last stage holds.
  nn::NamedTensors owned_parameters() const;
  // The names of the parameters this rank holds a copy of, whose owner is another stage (the
  // last stage's copy of a tied embedding): their gradient and state count once, at the owner.
  std::set<std::string> copy_names() const;
  int stage() const { return stage_; }
  const comm::ProcessGroupPtr& pp_group() const { return pp_group_; }
  int stages() const { return options_.stages; }

  // Forward and backward of every micro-batch (gradients accumulated, each loss weighted 1/M and
  // by `loss_scale`), the tied copies' gradients summed and, with sequence parallelism, the
  // replicated parameters' parts summed over tp. Returns this replica's mean loss, the same bits
  // on each of its stages. Collective over pp. `seed_base` selects the dropout masks;
  // `precision`: autocast's type for the forwards.
  float step(const std::vector<Batch>& batches, uint64_t seed_base, DType precision,
             float loss_scale);
  // Mean loss over the batches through every stage, no gradients; the same on every rank of
  // the pp group. Collective over pp.
  float evaluate(const std::vector<Batch>& batches, DType precision = DType::f32);
  // Error naming the ranks and the tensor when the replicas of this stage differ, or when the
  // tied copies on the first and last stage do. Collective over pp and dp.
  void check_in_sync(int64_t step) const;
  // The whole model's parameters, in the whole model's names and whole shapes (tp shards
  // gathered), on every rank. Collective.
  nn::NamedTensors gather_parameters() const;
  // Parameters of the whole model (the tied weight once).
  int64_t num_parameters() const;
  void train(bool on);
  std::string describe() const;

 private:
  // The micro-batches of a step: the batches as they are, or joined and cut into M.
  std::vector<Batch> micro_batches(const std::vector<Batch>& batches) const;

  const ModelSource& source_;
  PipelineOptions options_;
  comm::ProcessGroupPtr pp_group_;
  comm::ProcessGroupPtr dp_group_;
  int stage_ = 0;
  std::vector<models::LayerRange> ranges_;  // per virtual stage
  std::vector<std::shared_ptr<models::StageModule>> chunks_;
  nn::NamedTensors params_;
  std::vector<nn::ParamInfo> infos_;  // of params_, in the same order
  tp::TpContext tp_;
  Device device_;
  std::string tied_name_;  // the whole model's tied parameter (empty: none), the same everywhere
  bool holds_tied_copy_ = false;  // last stage, pp > 1, its last chunk holds a tied parameter
  // Built at the first step, when the micro-batch size is known; rebuilt if it changes.
  std::unique_ptr<StageRunner> runner_;
  int64_t runner_B_ = 0, runner_T_ = 0;
  int runner_M_ = 0;
};

}  // namespace meshtrain::parallel::pipeline
