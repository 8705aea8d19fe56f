#include "meshtrain/parallel/tensor_parallel/tp_gpt_stage.h"

#include "meshtrain/nn/embedding.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel::tp {

TpGPTStage::TpGPTStage(const nn::GPTConfig& config, const TpContext& tp, size_t begin, size_t end)
    : config_(config), tp_(tp) {
  config.validate();
  validate_tensor_parallel(config, tp.size(), tp.sequence_parallel);
  const size_t n_layers = static_cast<size_t>(config.n_layer) + 2;
  MT_CHECK(begin < end && end <= n_layers, "GPT stage [", begin, ", ", end,
           ") is not a non-empty range of the model's ", n_layers, " layers");
  has_embedding_ = begin == 0;
  has_head_ = end == n_layers;
  Generator unused(0);  // every value is drawn again, by name, in init_parameters
  // Registered in nn::GPT's order, so that the stages' parameters follow the whole model's.
  if (has_embedding_ || (has_head_ && config.tie_embeddings))
    wte_ = register_module(
        "wte", std::make_shared<VocabParallelEmbedding>(config.vocab_size, config.n_embd, tp));
  if (has_embedding_)
    wpe_ = register_module(
               "wpe", std::make_shared<nn::Embedding>(config.block_size, config.n_embd, unused))
               ->weight();
  const nn::BlockOptions bo = nn::gpt_parts::block_options(config);
  first_block_ = has_embedding_ ? 0 : begin - 1;
  const size_t last_block = has_head_ ? n_layers - 2 : end - 1;  // one past
  for (size_t i = first_block_; i < last_block; ++i)
    blocks_.push_back(register_module("h." + std::to_string(i), std::make_shared<TpBlock>(bo, tp)));
  checkpointed_ = config.checkpointed_per_block();
  if (has_head_) {
    ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(config.n_embd, config.bias));
    if (!config.tie_embeddings)
      lm_head_ = register_module("lm_head", std::make_shared<VocabParallelEmbedding>(
                                                config.vocab_size, config.n_embd, tp));
  }
  init_parameters(config.seed);
}

Tensor TpGPTStage::forward(const Tensor& input, const Tensor& targets,
                           uint64_t dropout_seed) const {
  MT_CHECK(targets.dim() == 2, "a GPT stage needs the micro-batch's targets [B, T], got ",
           shape_str(targets.shape()));
  const int64_t T = targets.size(1);
  Tensor x = has_embedding_ ? tp_gpt_parts::embed(config_, tp_, *wte_, wpe_, input, dropout_seed,
                                                  is_training())
                            : input;
  for (size_t k = 0; k < blocks_.size(); ++k) {
    const size_t i = first_block_ + k;
    x = tp_gpt_parts::block(blocks_[k], i, x, checkpointed_[i], dropout_seed, T);
  }
  if (!has_head_) return x;
  return tp_gpt_parts::loss(tp_, ln_f_->forward(x), config_.tie_embeddings ? *wte_ : *lm_head_,
                            targets);
}

Shape TpGPTStage::hidden_shape(int64_t B, int64_t T) const {
  if (!tp_.sequence_parallel) return {B, T, config_.n_embd};
  if (T % tp_.size() != 0)
    MT_THROW(ValueError, "sequence length ", T, " is not divisible by parallel.tp (", tp_.size(),
             "), which parallel.sequence_parallel needs");
  return {B, T / tp_.size(), config_.n_embd};
}

Shape TpGPTStage::input_shape(int64_t B, int64_t T) const {
  if (has_embedding_) return {B, T};
  return hidden_shape(B, T);
}

Shape TpGPTStage::output_shape(int64_t B, int64_t T) const {
  if (has_head_) return {};
  return hidden_shape(B, T);
}

std::vector<nn::ParamInfo> TpGPTStage::param_infos() const {
  std::vector<nn::ParamInfo> infos = Module::param_infos();
  if (config_.tie_embeddings)
    for (nn::ParamInfo& info : infos)
      if (info.name == "wte.weight") info.tie_group = "wte";
  return infos;
}

}  // namespace meshtrain::parallel::tp
