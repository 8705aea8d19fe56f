// ZeRO-1/2 over the dp group: the parameters live in one arena per gradient bucket, padded to a
// multiple of the group size, with the bucket's layout (Megatron's param-and-grad buffer), so
// rank r owns slice r of every bucket for parameters, gradients and optimizer state alike. The
// optimizer keeps state only for the pieces ("segments") of parameters inside this rank's
// slices; after its update each bucket's parameter arena is all-gathered in place.
//
// Why the results equal DDP's bit for bit: AdamW and SGD are elementwise, so updating a slice of
// a parameter with that parameter's step count and weight decay gives the bits a whole-tensor
// update gives; stage 2's reduce-scatter averages each element exactly as the all-reduce does
// (the shm backend reduces in rank order for both). Only the gradient norm is summed in another
// order (shard by shard, then across ranks), so clipping can differ in the last bits.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/parts/param_sync.h"
#include "meshtrain/parallel/zero/sharded_optimizer.h"

namespace meshtrain::parallel {

class ZeroShards : public ParamSync {
 public:
  // `params` in registration order (the reducer's indices); `reducer` made with pad_to =
  // pg->size(). Collective: allocates the parameter arenas.
  ZeroShards(nn::NamedTensors params, const Reducer& reducer, comm::ProcessGroupPtr pg, int stage,
             const OptimizerFactory& make_optimizer, float weight_decay);

  // The reducer options ZeroShards needs (buckets padded to the group, reduce-scattered and
  // pooled for stage 2), on top of the run's bucket sizes and hook.
  static ReducerOptions reducer_options(ReducerOptions base, int stage, int world);

  ShardedOptimizer& optimizer() { return *optimizer_; }
  const ShardedOptimizer& optimizer() const { return *optimizer_; }
  // After the update of this rank's segments: all-gathers every bucket's parameters in place.
  void after_update() override;

 private:
  nn::NamedTensors params_;
  comm::ProcessGroupPtr pg_;
  int stage_;
  std::vector<Tensor> arenas_;  // per bucket: the parameters, padded
  std::vector<int64_t> slice_;  // per bucket: elements per rank
  std::unique_ptr<ShardedOptimizer> optimizer_;
};

}  // namespace meshtrain::parallel
