// The one gradient norm of every layout. Each rank counts the gradient elements it is the one
// holder of (its shard under ZeRO-2/3, its tp part of a split parameter, a replicated one only
// on the first tp rank and, when the norm is shared, the first data-parallel replica; a tied copy
// never), and the sums of every rank of `group` are added up in rank order, tensor-parallel parts
// and the rest apart, so every rank gets the same bits. Without a group (every rank holds the
// same whole gradients) the norm is this rank's own.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/parallel/parts/update.h"

namespace meshtrain::parallel {

struct GlobalNorm {
  double norm = 0.0;
  bool overflow = false;       // some rank's gradients were not finite after unscaling
  std::vector<double> layers;  // per layer, squared
};

// Collective over `group` (null: none).
GlobalNorm global_grad_norm(const GradSquares& mine, bool overflow,
                            const comm::ProcessGroupPtr& group);

// Where each replica clips by its own norm (replicas that do not reduce their gradients): the
// mean of the replicas' norms, added up in rank order, and whether any overflowed, the same bits
// on every rank for what every rank must decide alike (skipping a step, a spike) and for the
// record; the per-layer norms stay this replica's. Collective over `replicas`.
GlobalNorm replicas_mean_norm(const GlobalNorm& mine, const comm::ProcessGroupPtr& replicas);

}  // namespace meshtrain::parallel
