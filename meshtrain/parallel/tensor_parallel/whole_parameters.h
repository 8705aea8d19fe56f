// The whole tensors of a tensor-parallel model's parameters, assembled from every tp rank's
// shard (one all-gather per sharded parameter over the tp group): what the final weights file
// and sampling need, with the names and shapes of the plain model. Collective over tp.
#pragma once

#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"

namespace meshtrain::parallel::tp {

nn::NamedTensors whole_parameters(const TpGPT& model);

// One parameter's whole tensor, on the host, from this rank's `local` part: gathered over tp
// where the part lives (a device's part through the device's group) when `info` says it is a
// shard (every tp rank calls it for the same parameter), else a copy. Collective over tp for
// shards.
Tensor whole_tensor(const TpContext& tp, const Tensor& local, const nn::ParamInfo& info);

}  // namespace meshtrain::parallel::tp
