// The four autograd Functions tensor parallelism is made of (Megatron-LM's "mappings"). Each
// moves an activation between the regions of a tensor-parallel layer over the tp group:
//
//   copy_to_tp_region            forward: identity        backward: all-reduce
//   reduce_from_tp_region        forward: all-reduce      backward: identity
//   gather_from_sequence_parallel   forward: all-gather      backward: reduce-scatter
//   reduce_scatter_to_sequence_parallel forward: reduce-scatter backward: all-gather
//
// The backward of each is right because of what surrounds it: a replicated tensor entering the
// TP region feeds rank-specific shards, so its gradient is the sum over ranks; the sum leaving
// it feeds replicated computation, so its gradient is already whole on every rank. The
// sequence-parallel pair splits and joins along the time dimension (dim 1 of [B, T, ...]); a
// rank's part is the contiguous range of T / tp time steps [rank * T / tp, (rank + 1) * T / tp).
//
// Collectives run blocking on the calling thread (async_op = false). f32 CPU tensors only.
#pragma once

#include "meshtrain/comm/process_group.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel::tp {

Tensor copy_to_tp_region(const Tensor& x, const comm::ProcessGroupPtr& group);
Tensor reduce_from_tp_region(const Tensor& x, const comm::ProcessGroupPtr& group);
// x[B, T / tp, ...] -> [B, T, ...]
Tensor gather_from_sequence_parallel(const Tensor& x, const comm::ProcessGroupPtr& group);
// x[B, T, ...] (partial sums) -> [B, T / tp, ...] (this rank's part of their sum)
Tensor reduce_scatter_to_sequence_parallel(const Tensor& x, const comm::ProcessGroupPtr& group);

// [B, T, ...] -> this rank's part [B, T / tp, ...], without communication (a copy); for inputs
// that every rank already holds whole, as the tests and the position embedding do.
Tensor sequence_chunk(const Tensor& x, int rank, int size);

}  // namespace meshtrain::parallel::tp
