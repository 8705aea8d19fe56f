// GPT as a ModelStack: the embedding (wte, wpe), one layer per block (h.N), and the head (ln_f,
// the language-model projection and the loss). A stage built from any range holds the whole
// model's same-named parameters with the same values and computes what those layers of nn::GPT
// compute (the same code: nn::gpt_parts), dropout masks and activation checkpointing included.
//
// With tied embeddings a stage holding the head but not the embedding keeps its own copy of
// wte.weight, in tie group "wte": the pipeline sums the two copies' gradients every step so they
// stay equal.
#pragma once

#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/gpt.h"

namespace meshtrain::models {

class GPTStack : public ModelStack {
 public:
  explicit GPTStack(const nn::GPTConfig& config);
  // Each layer's parameter count (the head counts its [V, C] projection even when it is the tied
  // embedding, as the last stage holds a copy of it) and its forward plus backward FLOPs per
  // token (gpt_stack.cpp says what is counted).
  const std::vector<LayerSpec>& layers() const override { return layers_; }
  std::unique_ptr<StageModule> build(size_t begin, size_t end) const override;
  const nn::GPTConfig& config() const { return config_; }

 private:
  nn::GPTConfig config_;
  std::vector<LayerSpec> layers_;
};

class GPTStage : public StageModule {
 public:
  // Layers [begin, end) of GPTStack(config).layers().
  GPTStage(const nn::GPTConfig& config, size_t begin, size_t end);
  // First stage: input is token ids [B, T] (i32). Others: the hidden state [B, T, C].
  Tensor forward(const Tensor& input, const Tensor& targets, uint64_t dropout_seed) const override;
  bool is_first() const override { return has_embedding_; }
  bool is_last() const override { return has_head_; }
  Shape input_shape(int64_t B, int64_t T) const override;
  Shape output_shape(int64_t B, int64_t T) const override;
  // As nn::GPT's: wte.weight is in tie group "wte" when the embeddings are tied.
  std::vector<nn::ParamInfo> param_infos() const override;

 private:
  nn::GPTConfig config_;
  bool has_embedding_ = false;
  bool has_head_ = false;
  Tensor wte_;  // the embedding's table, or the tied head's copy of it
  Tensor wpe_;
  Tensor lm_head_;
  size_t first_block_ = 0;  // global index of blocks_[0]
  std::vector<std::shared_ptr<nn::Block>> blocks_;
  std::vector<bool> checkpointed_;  // per global block index
  std::shared_ptr<nn::LayerNorm> ln_f_;
};

}  // namespace meshtrain::models
