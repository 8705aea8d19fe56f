// The GPT's layer factory over the tp ranks of a mesh (Megatron-LM's layout): c_attn and c_fc
// column-parallel, both c_proj row-parallel, the token table and head vocabulary-parallel (the
// head's cross-entropy never gathers the logits), and with sequence parallelism the dropouts cut
// to this rank's time steps with the masks the whole tensor gets. A GPT built through it holds
// this rank's shards of the plain model's parameters (ParamInfo reports Shard over "tp") and
// follows the plain model's trajectory.
#pragma once

#include <memory>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"

namespace meshtrain::parallel::tp {

// ValueError naming the config keys when `config` cannot be split over `tp` ranks (width or
// heads not divisible) or sequence parallelism is asked for without tensor parallelism.
void validate_tensor_parallel(const nn::GPTConfig& config, int tp, bool sequence_parallel);

// The factory for this rank of `tp`: the plain one when tp has one rank (the same kernels and
// bits as a single process), the tensor-parallel one otherwise. Validates `config` against tp.
std::shared_ptr<const nn::GPTLayers> gpt_layers(const nn::GPTConfig& config, const TpContext& tp);

}  // namespace meshtrain::parallel::tp
