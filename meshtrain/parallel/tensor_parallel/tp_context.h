// What a layer split over the mesh needs to know about its place: the tp group (its rank picks the
// shard), whether the regions outside the matrices are split along the sequence, and the
// expert-parallel exchange that shares out mixture-of-experts blocks (null: every expert here).
#pragma once

#include <memory>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/expert_exchange.h"
#include "meshtrain/nn/tensor_shard.h"

namespace meshtrain::parallel::tp {

struct TpContext {
  comm::ProcessGroupPtr group;
  bool sequence_parallel = false;
  std::shared_ptr<nn::ExpertExchange> experts = nullptr;

  int rank() const { return group ? group->rank() : 0; }
  int size() const { return group ? group->size() : 1; }
  // This rank's part of a whole tensor of shape `full` split along `dim` over tp.
  nn::TensorShard shard(const Shape& full, int64_t dim, int64_t blocks = 1) const {
    return nn::TensorShard{"tp", full, dim, blocks, rank(), size()};
  }
};

}  // namespace meshtrain::parallel::tp
