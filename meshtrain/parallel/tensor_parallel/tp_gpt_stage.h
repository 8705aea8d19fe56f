// One pipeline stage of the tensor-parallel GPT (the 3D mesh: pp x dp x tp): layers
// [begin, end) of models::GPTStack's list (the embedding, the blocks h.N, the head) built of
// TpGPT's layers, so that a rank holds only its stage's tp shards. Names, whole shapes,
// placements (Shard over "tp" for the split matrices and vocabulary rows) and keyed initial
// values are TpGPT's, and the computation is tp_gpt_parts', dropout masks included: a stage
// computes exactly what those layers of TpGPT compute.
//
// Between stages the hidden state travels as each tp rank holds it: whole [B, T, C] (the same on
// every tp rank), or with sequence parallelism this rank's time steps [B, T / tp, C]. The
// pipeline pairs tp rank t of one stage with tp rank t of the next (the mesh's pp group).
//
// With tied embeddings the last stage keeps its own copy of its vocabulary shard of wte.weight,
// in tie group "wte", as models::GPTStage does; the pipeline sums the two copies' gradients.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/tensor_parallel/tp_block.h"
#include "meshtrain/parallel/tensor_parallel/vocab_parallel_embedding.h"

namespace meshtrain::parallel::tp {

class TpGPTStage : public models::StageModule {
 public:
  // Layers [begin, end) of models::GPTStack(config).layers(). ValueError naming the config keys
  // when the model does not split over tp.
  TpGPTStage(const nn::GPTConfig& config, const TpContext& tp, size_t begin, size_t end);

  // First stage: token ids [B, T] (i32). Others: the hidden state as this rank holds it. The last
  // stage returns the mean loss, the same on every tp rank. `targets` [B, T] on every stage (its
  // length is the whole sequence's under sequence parallelism).
  Tensor forward(const Tensor& input, const Tensor& targets, uint64_t dropout_seed) const override;
  bool is_first() const override { return has_embedding_; }
  bool is_last() const override { return has_head_; }
  Shape input_shape(int64_t B, int64_t T) const override;
  Shape output_shape(int64_t B, int64_t T) const override;
  // As TpGPT's: wte.weight (a vocabulary shard) is in tie group "wte" when embeddings are tied.
  std::vector<nn::ParamInfo> param_infos() const override;
  const TpContext& tp() const { return tp_; }

 private:
  // The hidden state between stages: [B, T, C], or [B, T / tp, C] with sequence parallelism.
  Shape hidden_shape(int64_t B, int64_t T) const;

  nn::GPTConfig config_;
  TpContext tp_;
  bool has_embedding_ = false;
  bool has_head_ = false;
  std::shared_ptr<VocabParallelEmbedding> wte_;  // the embedding's shard, or the tied head's copy
  Tensor wpe_;
  std::shared_ptr<VocabParallelEmbedding> lm_head_;  // untied head
  size_t first_block_ = 0;                           // global index of blocks_[0]
  std::vector<std::shared_ptr<TpBlock>> blocks_;
  std::vector<bool> checkpointed_;  // per global block index
  std::shared_ptr<nn::LayerNorm> ln_f_;
};

}  // namespace meshtrain::parallel::tp
