#include "meshtrain/models/gpt_stack.h"

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/embedding.h"
#include "meshtrain/util/error.h"

namespace meshtrain::models {

GPTStack::GPTStack(const nn::GPTConfig& config) : config_(config) {
  config.validate();
  const int64_t C = config.n_embd, V = config.vocab_size;
  const int64_t bias = config.bias ? 1 : 0;
  // ln_1, ln_2: C (+ C); c_attn 3C^2 (+ 3C); attn c_proj C^2 (+ C); c_fc 4C^2 (+ 4C); mlp
  // c_proj 4C^2 (+ C).
  const int64_t block = 12 * C * C + 2 * C + bias * (2 * C + 9 * C);
  // FLOPs per token of the forward (a multiply-add counts 2): the embedding gathers and adds two
  // rows (C); a block's matrix products 2 x 12C^2, and attention's scores and weighted sum
  // 2 x 2TC against the T = block_size positions of a sequence; the head's projection 2VC and
  // the loss, a softmax over V (about 5V with its gradient). The backward costs twice the
  // forward (gradients of the inputs and of the weights); a checkpointed block runs its forward
  // once more. Norms, GELU and residual adds (tens of C) are left out.
  const int64_t T = config.block_size;
  const int64_t block_forward = 24 * C * C + 4 * T * C;
  const std::vector<bool> checkpointed = config.checkpointed_per_block();
  layers_.push_back({"embedding", V * C + T * C, 3 * C});
  for (int64_t i = 0; i < config.n_layer; ++i)
    layers_.push_back({"h." + std::to_string(i), block,
                       (checkpointed[static_cast<size_t>(i)] ? 4 : 3) * block_forward});
  layers_.push_back({"head", C + bias * C + V * C, 3 * 2 * V * C + 5 * V});
}

std::unique_ptr<StageModule> GPTStack::build(size_t begin, size_t end) const {
  return std::make_unique<GPTStage>(config_, begin, end);
}

GPTStage::GPTStage(const nn::GPTConfig& config, size_t begin, size_t end) : config_(config) {
  config.validate();
  const size_t n_layers = static_cast<size_t>(config.n_layer) + 2;
  MT_CHECK(begin < end && end <= n_layers, "GPT stage [", begin, ", ", end,
           ") is not a non-empty range of the model's ", n_layers, " layers");
  has_embedding_ = begin == 0;
  has_head_ = end == n_layers;
  // The draws from `gen` are replaced below by init_parameters' keyed ones; it only feeds the
  // layers' constructors.
  Generator gen(config.seed);
  if (has_embedding_ || (has_head_ && config.tie_embeddings))
    wte_ = register_module("wte",
                           std::make_shared<nn::Embedding>(config.vocab_size, config.n_embd, gen))
               ->weight();
  if (has_embedding_)
    wpe_ = register_module("wpe",
                           std::make_shared<nn::Embedding>(config.block_size, config.n_embd, gen))
               ->weight();
  const nn::BlockOptions bo = nn::gpt_parts::block_options(config);
  first_block_ = has_embedding_ ? 0 : begin - 1;
  const size_t last_block = has_head_ ? n_layers - 2 : end - 1;  // one past
  for (size_t i = first_block_; i < last_block; ++i)
    blocks_.push_back(
        register_module("h." + std::to_string(i), std::make_shared<nn::Block>(bo, gen)));
  checkpointed_ = config.checkpointed_per_block();
  if (has_head_) {
    ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(config.n_embd, config.bias));
    if (!config.tie_embeddings)
      lm_head_ = register_module("lm_head", std::make_shared<nn::Embedding>(config.vocab_size,
                                                                            config.n_embd, gen))
                     ->weight();
  }
  init_parameters(config.seed);
}

Tensor GPTStage::forward(const Tensor& input, const Tensor& targets, uint64_t dropout_seed) const {
  Tensor x = has_embedding_
                 ? nn::gpt_parts::embed(config_, input, wte_, wpe_, dropout_seed, is_training())
                 : input;
  for (size_t k = 0; k < blocks_.size(); ++k) {
    const size_t i = first_block_ + k;
    x = nn::gpt_parts::block(blocks_[k], i, x, checkpointed_[i], dropout_seed);
  }
  if (!has_head_) return x;
  Tensor logits =
      autograd::linear(ln_f_->forward(x), config_.tie_embeddings ? wte_ : lm_head_, Tensor());
  return nn::gpt_parts::loss(logits, targets);
}

Shape GPTStage::input_shape(int64_t B, int64_t T) const {
  if (has_embedding_) return {B, T};
  return {B, T, config_.n_embd};
}

Shape GPTStage::output_shape(int64_t B, int64_t T) const {
  if (has_head_) return {};
  return {B, T, config_.n_embd};
}

std::vector<nn::ParamInfo> GPTStage::param_infos() const {
  std::vector<nn::ParamInfo> infos = Module::param_infos();
  if (config_.tie_embeddings)
    for (nn::ParamInfo& info : infos)
      if (info.name == "wte.weight") info.tie_group = "wte";
  return infos;
}

}  // namespace meshtrain::models
