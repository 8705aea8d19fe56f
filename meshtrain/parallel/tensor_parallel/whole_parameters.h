// The whole tensors of a tensor-parallel model's parameters, assembled from every tp rank's
// shard (one all-gather per sharded parameter over the tp group): what the final weights file
// and sampling need, with the names and shapes of the plain model. Collective over tp.
#pragma once

#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"

namespace meshtrain::parallel::tp {

nn::NamedTensors whole_parameters(const TpGPT& model);

// One parameter's whole tensor from this rank's `local` part: gathered over tp when `info`
// says it is a shard (every tp rank calls it for the same parameter), else a copy. Collective
// over tp for shards.
Tensor whole_tensor(const TpContext& tp, const Tensor& local, const nn::ParamInfo& info);

// The sum of squares of the whole model's gradients, the same on every tp rank: the shards' sums
// are added over tp, the replicated parameters' (whole on every rank) counted once.
double grad_norm_squared(const TpGPT& model);

}  // namespace meshtrain::parallel::tp
