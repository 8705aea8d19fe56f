// StageRunner: executes one rank's pipeline program (schedule.h) on the chunks of the model it
// holds. Forwards and backwards run the chunk modules; activations and gradients cross ranks as
// point-to-point transfers on the pp group, each batch of a program posted at once and waited
// for together (the fused send+recv the schedule relies on). Receive buffers are sized from the
// shapes fixed at set-up, never negotiated per step.
//
// Every action is a span of category "pipeline" in the trace (obs/trace.h): "forward" and
// "backward" with the micro-batch and chunk, "p2p" for a batch of transfers and the wait on it.
//
// After the program it makes the step's results global over the pp group: the two copies of a
// tied parameter (the token embedding on the first stage and the head on the last) get the sum
// of their gradients, each micro-batch's pair added and accumulated in micro-batch order as one
// rank holding the whole model does (so both copies hold that rank's bits; the cost: the last
// stage sends each micro-batch's contribution, M transfers of the table instead of one); and
// one small
// all-gather gives every rank the mean loss (computed on the last stage) and the gradient norm
// over unique parameters, the same bits everywhere.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/models/model_stack.h"
#include "meshtrain/parallel/batch.h"
#include "meshtrain/parallel/pipeline/schedule.h"

namespace meshtrain::parallel::pipeline {

using MicroBatch = parallel::Batch;

struct PipelineStepResult {
  float loss = 0.0f;       // mean over micro-batches, the same bits on every stage
  double grad_norm = 0.0;  // over every parameter of the model once, the same bits everywhere
  bool overflow = false;   // some stage reported non-finite gradients (set_overflow)
};

class StageRunner {
 public:
  // chunks[c] is virtual stage c * P + stage of `shape`; `group` is the pp group, its rank the
  // stage. Every micro-batch holds B sequences of T tokens.
  StageRunner(const PipelineShape& shape, int stage,
              std::vector<std::shared_ptr<models::StageModule>> chunks, comm::ProcessGroupPtr group,
              int64_t B, int64_t T);

  // One step: every micro-batch's forward and backward as the schedule orders them, parameter
  // gradients accumulated (each loss weighted 1/M, so they are the mean loss's), then the tied
  // gradients summed and the loss and norm shared. Gradients are not zeroed first. Collective
  // over the pp group. dropout_seeds[m] (or 0 when empty) selects micro-batch m's masks.
  PipelineStepResult run(const std::vector<MicroBatch>& micro_batches,
                         const std::vector<uint64_t>& dropout_seeds = {});
  // run() in parts, so that a caller can average the gradients over data-parallel replicas
  // after the tied sum (which needs each micro-batch's own contribution) and before the norm:
  // the program alone (gradients accumulated on each stage, the tied parameter's kept per
  // micro-batch), then finish() = the tied copies' sum, then the shared loss and norm.
  // Collective over the pp group.
  void run_program(const std::vector<MicroBatch>& micro_batches,
                   const std::vector<uint64_t>& dropout_seeds = {});
  PipelineStepResult finish();
  void sum_tied_gradients();
  // `local_sum_squares`: this stage's sum of squared gradients over the parameters it is the
  // owner of, when its gradients are not whole on this rank (ZeRO-2 shards); without it the sum
  // is taken over the chunks' gradients, the tied copy left out.
  PipelineStepResult share_results(std::optional<double> local_sum_squares = std::nullopt);
  // The last stage's mean loss over the micro-batches, on every stage (the loss of
  // share_results() alone). Collective over the pp group.
  float share_loss() const;

  const std::vector<Action>& program() const { return program_; }

  // Mixed precision: the type forwards round their matrix products to (f32: off) and the factor
  // the backward of the loss starts from (f16's loss scale; 1 otherwise).
  void set_precision(DType precision, float loss_scale) {
    precision_ = precision;
    loss_scale_ = loss_scale;
  }
  // Tensor parallelism: the chunks hold tp shards (ParamInfo's init.shard) of the parameters
  // they split; share_results() adds the shards' sums of squares over `tp` (in tp rank order,
  // the same bits on every tp rank) and counts the replicated parameters once.
  void set_tp_group(comm::ProcessGroupPtr tp) { tp_group_ = std::move(tp); }
  // This stage found non-finite gradients; share_results() tells every stage.
  void set_overflow(bool overflow) { overflow_ = overflow; }
  // Where the chunks' parameters and activations are (default: the CPU). The pp group moves host
  // memory: a device's activations and gradients cross the stages through host copies.
  void set_device(Device device) { device_ = device; }

 private:
  using Key = std::pair<int, int>;  // micro-batch, chunk
  void forward(const Action& a, const std::vector<MicroBatch>& mbs, uint64_t seed);
  void backward(const Action& a);
  void transfer(const Action& a);
  void add_tied_contribution(int micro_batch);

  PipelineShape shape_;
  int stage_;
  std::vector<std::shared_ptr<models::StageModule>> chunks_;
  comm::ProcessGroupPtr group_;
  comm::ProcessGroupPtr tp_group_;  // null: no tensor parallelism
  int64_t B_, T_;
  DType precision_ = DType::f32;
  float loss_scale_ = 1.0f;
  bool overflow_ = false;
  Device device_ = Device::cpu();
  std::vector<Action> program_;
  // Parameters tied between the first virtual stage (rank 0) and the last (rank P - 1), by name.
  std::vector<Tensor> tied_;
  bool tied_is_copy_ = false;  // this rank's tied tensors are the head's copies (norm skips them)
  int tied_chunk_ = 0;         // the chunk holding them
  // Per step. Stage 0: the tied gradients' running sums and the next micro-batch to add; the
  // last stage: its contributions on their way to stage 0.
  std::vector<Tensor> tied_sum_;
  int tied_next_ = 0;
  std::vector<std::pair<Tensor, comm::WorkPtr>> tied_sends_;

  // Step state, emptied as each micro-batch's backward ends.
  std::map<Key, Tensor> inputs_;     // received activations (leaves that collect a gradient)
  std::map<Key, Tensor> outputs_;    // forward results, graphs alive until their backward
  std::map<Key, Tensor> out_grads_;  // received gradients of outputs_
  std::map<Key, Tensor> in_grads_;   // gradients of inputs_, until sent
  std::vector<float> losses_;        // per micro-batch, last stage
};

}  // namespace meshtrain::parallel::pipeline
