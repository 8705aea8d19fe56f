// GPT split over the tp ranks of a mesh (Megatron-LM's layout): the vocabulary-parallel token
// embedding, tensor-parallel blocks (tp_block.h), the final norm and a vocabulary-parallel head
// whose cross-entropy never gathers the logits. Names, shapes of the whole tensors and initial
// values are nn::GPT's: each sharded parameter holds its slice of the whole (ParamInfo reports
// Shard over "tp"), every other one the whole tensor, so training on tp ranks follows the same
// trajectory as the plain model on one.
//
// With sequence parallelism the activations between the matrices are split along the sequence:
// every rank runs the norms, dropouts and residuals on T / tp time steps. Replicated parameters
// then see only their rank's time steps, and reduce_sequence_parallel_grads sums their
// gradients over tp after backward.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/tensor_parallel/tp_block.h"
#include "meshtrain/parallel/tensor_parallel/vocab_parallel_embedding.h"

namespace meshtrain::parallel::tp {

// ValueError naming the config keys when `config` cannot be split over `tp` ranks (width or
// heads not divisible) or sequence parallelism is asked for without tensor parallelism.
void validate_tensor_parallel(const nn::GPTConfig& config, int tp, bool sequence_parallel);

// The pieces of the tensor-parallel GPT, shared by TpGPT and a pipeline stage of it
// (tp_gpt_stage.h), so both compute exactly what nn::gpt_parts computes, masks included.
namespace tp_gpt_parts {

// idx[B, T] -> the embedded and dropped-out hidden state, whole or this rank's time steps.
Tensor embed(const nn::GPTConfig& config, const TpContext& tp, const VocabParallelEmbedding& wte,
             const Tensor& wpe, const Tensor& idx, uint64_t dropout_seed, bool training);
// Block `index` of the model (its dropout seed and activation checkpointing as nn::gpt_parts'),
// on x[B, T, C] or this rank's [B, T / tp, C]; T the whole sequence length.
Tensor block(const std::shared_ptr<TpBlock>& block, size_t index, const Tensor& x,
             bool checkpointed, uint64_t dropout_seed, int64_t T);
// This rank's logit columns [B, T, Vp / tp] of the final norm's output h.
Tensor local_logits(const TpContext& tp, const Tensor& h, const VocabParallelEmbedding& head);
// Mean cross-entropy of the final norm's output h against targets[B, T], the same on every rank.
Tensor loss(const TpContext& tp, const Tensor& h, const VocabParallelEmbedding& head,
            const Tensor& targets);
// After backward, with sequence parallelism: sums over tp the gradients of the parameters
// replicated over tp (each rank's cover its time steps only), in one all-reduce; a no-op
// otherwise. `params` and `infos` pair up; every tp rank passes the same names in the same order.
void reduce_sequence_parallel_grads(const TpContext& tp, const nn::NamedTensors& params,
                                    const std::vector<nn::ParamInfo>& infos);

}  // namespace tp_gpt_parts

class TpGPT : public nn::Module {
 public:
  TpGPT(const nn::GPTConfig& config, const TpContext& tp);

  // Mean cross-entropy of idx[B, T] against targets[B, T] (i32; -1 ignored), the same value on
  // every tp rank. With sequence parallelism T must divide by tp.
  Tensor loss(const Tensor& idx, const Tensor& targets, uint64_t dropout_seed = 0) const;
  // This rank's columns of the logits, [B, T, Vp / tp] (Vp: vocabulary padded to a multiple of
  // tp; columns past the vocabulary are padding).
  Tensor local_logits(const Tensor& idx, uint64_t dropout_seed = 0) const;

  // After backward: with sequence parallelism, sums the gradients of the replicated parameters
  // over tp (each rank's covers its time steps); without it, they are whole already.
  void reduce_sequence_parallel_grads() const;

  std::vector<nn::ParamInfo> param_infos() const override;
  const nn::GPTConfig& config() const { return config_; }
  const TpContext& tp() const { return tp_; }
  const VocabParallelEmbedding& token_embedding() const { return *wte_; }

 private:
  Tensor hidden(const Tensor& idx, uint64_t dropout_seed) const;

  nn::GPTConfig config_;
  TpContext tp_;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  Tensor wpe_;
  std::vector<std::shared_ptr<TpBlock>> blocks_;
  std::vector<bool> checkpointed_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<VocabParallelEmbedding> lm_head_;  // only when embeddings are not tied
};

}  // namespace meshtrain::parallel::tp
