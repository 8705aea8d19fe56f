// GPT split over the tp ranks of a mesh: nn::GPT built through the tensor-parallel layer factory
// (tp_gpt_layers.h), whole or over a range of its layers (a pipeline stage of the 3D mesh,
// pp x dp x tp). Names, shapes of the whole tensors and initial values are the plain model's:
// each sharded parameter holds its slice of the whole (ParamInfo reports Shard over "tp"), every
// other one the whole tensor, so training on tp ranks follows the same trajectory as the plain
// model on one.
//
// With sequence parallelism the activations between the matrices are split along the sequence:
// every rank runs the norms, dropouts and residuals on T / tp time steps, and the hidden state
// between pipeline stages is this rank's [B, T / tp, C] (the pipeline pairs tp rank t of one
// stage with tp rank t of the next). Replicated parameters then see only their rank's time steps,
// and reduce_sequence_parallel_grads sums their gradients over tp after backward.
#pragma once

#include <vector>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt_layers.h"

namespace meshtrain::parallel::tp {

// After backward, with sequence parallelism: sums over tp the gradients of the parameters
// replicated over tp (each rank's cover its time steps only), in one all-reduce; a no-op
// otherwise. `params` and `infos` pair up; every tp rank passes the same names in the same order.
void reduce_sequence_parallel_grads(const TpContext& tp, const nn::NamedTensors& params,
                                    const std::vector<nn::ParamInfo>& infos);
namespace tp_gpt_parts {
using tp::reduce_sequence_parallel_grads;
}  // namespace tp_gpt_parts

class TpGPT : public nn::GPT {
 public:
  // The whole model's shards on this rank. ValueError naming the config keys when the model does
  // not split over tp.
  TpGPT(const nn::GPTConfig& config, const TpContext& tp);
  // Layers [begin, end) of models::GPTStack(config).layers(): a pipeline stage's shards.
  TpGPT(const nn::GPTConfig& config, const TpContext& tp, size_t begin, size_t end);

  // This rank's columns of the logits, [B, T, Vp / tp] (Vp: vocabulary padded to a multiple of
  // tp; columns past the vocabulary are padding).
  Tensor local_logits(const Tensor& idx, uint64_t dropout_seed = 0) const {
    return forward(idx, dropout_seed);
  }
  // After backward: with sequence parallelism, sums the gradients of the replicated parameters
  // over tp (each rank's covers its time steps); without it, they are whole already.
  void reduce_sequence_parallel_grads() const;

  const TpContext& tp() const { return tp_; }
  // The token table this rank holds (its vocabulary rows of wte).
  const nn::VocabTable& token_embedding() const { return token_table(); }

 private:
  TpContext tp_;
};

}  // namespace meshtrain::parallel::tp
