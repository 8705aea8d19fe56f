// ZeRO-3 (FSDP) over the dp group: parameters, gradients and optimizer state are all sharded at
// rest. The model is cut into units: unit 0 holds the parameters outside the transformer blocks
// (embeddings, final norm, head), units 1..L one block each (parallel.fsdp_unit = block), or
// unit 0 holds everything (fsdp_unit = model). Each unit's parameters are laid out flat, padded
// to a multiple of the group size, and rank r keeps slice r of them.
//
// A unit's parameters are views of one borrowed Storage that is pointed at a gathered buffer
// only while the unit is needed: before its forward (the next block's all-gather is issued while
// the current one computes), freed after it, gathered again when backward reaches it (an
// identity Function after the block's output does that, and prefetches the block before it),
// and freed once its last gradient is final, right after its gradients are reduce-scattered
// into this rank's shard. Because autograd's saved tensors share that Storage, they follow it
// (PyTorch FSDP's storage resize, here a rebind; Storage::rebind). Activation checkpointing's
// recomputation runs after the identity's gather, so it finds the block's parameters in place.
//
// Gathered units live in two alternating shared buffers for blocks (one computing, one in
// flight) and one for unit 0; gradients go through two alternating shared buffers, so the
// memory in flight is two blocks' parameters and gradients plus unit 0 (Storage::rebind).
//
// Numerics equal DDP's: each element's gradient is averaged in the all-reduce's rank order by
// the reduce-scatter and the update is elementwise, so the parameters are bitwise DDP's without
// clipping; with clipping the norm is summed per shard (see ZeroShards).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/parts/grad_sync.h"
#include "meshtrain/parallel/parts/param_sync.h"
#include "meshtrain/parallel/train_model.h"
#include "meshtrain/parallel/zero/sharded_optimizer.h"

namespace meshtrain::parallel {

class FsdpUnits : public GradSync, public ParamSync {
 public:
  // Collective over `pg`: allocates the shared buffers. The model's current values (the same on
  // every rank) become the shards; from then on its parameters hold no memory between uses.
  // `unit_per_layer`: one unit per layer of the model (TrainModel::num_layers), the rest in unit
  // 0; otherwise the whole model is unit 0.
  FsdpUnits(TrainModel& model, comm::ProcessGroupPtr pg, bool unit_per_layer,
            const OptimizerFactory& make_optimizer, float weight_decay);
  ~FsdpUnits();
  FsdpUnits(const FsdpUnits&) = delete;
  FsdpUnits& operator=(const FsdpUnits&) = delete;

  // Around every forward (training or evaluation): gathers unit 0 (and with it everything when
  // there is only one unit), and at the end frees what is still gathered.
  void begin_forward();
  void end_forward_and_backward();
  // Gradient accumulation: while false, gradients accumulate whole in the parameters' .grad and
  // nothing is reduce-scattered.
  void set_require_sync(bool on) { require_sync_ = on; }
  void prepare_for_backward();
  // Waits for every reduce-scatter of the step; Error naming parameters that got no gradient.
  void finalize_backward();

  // As the engine's GradSync: per-unit reduce-scatter, the accumulating micro-batches' included.
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish() override { finalize_backward(); }
  size_t in_flight_bytes() const override { return buffer_bytes(); }
  // As the engine's ParamSync: each unit gathered around its forward and backward.
  void gather() override { begin_forward(); }
  void release() override { end_forward_and_backward(); }
  bool whole_at_rest() const override { return false; }
  std::optional<nn::NamedTensors> whole_parameters() const override { return gather_parameters(); }
  bool gather_into_model(int root) override {
    consolidate(root);
    return true;
  }

  // Over this rank's shards; the update needs no communication (the next forward gathers).
  ShardedOptimizer& optimizer() { return *optimizer_; }
  const ShardedOptimizer& optimizer() const { return *optimizer_; }

  // Gives every parameter its whole value in memory of its own on `root` (-1: every rank) and
  // removes the hooks: there the model is an ordinary model again (for the final weights and
  // sampling); elsewhere it holds nothing. Collective.
  void consolidate(int root = -1);
  // Every parameter's whole value, gathered into tensors of their own (collective); the units
  // stay sharded.
  nn::NamedTensors gather_parameters() const;

  // Units gathered right now (for tests: at most unit 0 and two blocks).
  int gathered_units() const;
  int num_units() const { return static_cast<int>(units_.size()); }
  // Bytes of the buffers that gathered units and their gradients pass through.
  size_t buffer_bytes() const;

 private:
  struct Unit;
  class GatherForBackward;
  void gather_unit(size_t u);  // issues the all-gather (no-op when gathered)
  void wait(size_t u);
  void release_unit(size_t u);
  void on_grad_ready(size_t u);
  void reduce(size_t u);
  void before_block(size_t block);
  Tensor after_block(size_t block, const Tensor& x);
  void pre_backward(size_t u);

  TrainModel& model_;
  comm::ProcessGroupPtr pg_;  // on a device: the device group
  nn::NamedTensors params_;
  Device device_ = Device::cpu();  // the parameters', the shards' and the buffers'
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Tensor> param_slots_;  // [0]: unit 0; [1], [2]: blocks by parity
  std::vector<int> slot_owner_;      // unit gathered in each slot, -1: free
  std::vector<Tensor> grad_slots_;   // two, alternating
  std::vector<comm::WorkPtr> grad_work_;
  size_t next_grad_slot_ = 0;
  bool require_sync_ = true;
  bool in_backward_ = false;
  bool consolidated_ = false;
  std::unique_ptr<ShardedOptimizer> optimizer_;
};

}  // namespace meshtrain::parallel
