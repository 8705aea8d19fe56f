#include "meshtrain/models/gpt_stack.h"

#include "meshtrain/nn/gpt_costs.h"

namespace meshtrain::models {

GPTStack::GPTStack(const nn::GPTConfig& config, std::shared_ptr<const nn::GPTLayers> layers)
    : config_(config), factory_(std::move(layers)) {
  config.validate();
  const std::vector<bool> checkpointed = config.checkpointed_per_block();
  layers_.push_back(
      {"embedding", nn::gpt_embedding_layer_params(config), nn::gpt_embedding_layer_flops(config)});
  for (int64_t i = 0; i < config.n_layer; ++i)
    layers_.push_back({"h." + std::to_string(i), nn::gpt_block_params(config, 1, i),
                       nn::gpt_block_flops(config, checkpointed[static_cast<size_t>(i)], i)});
  layers_.push_back({"head", nn::gpt_head_layer_params(config), nn::gpt_head_layer_flops(config)});
}

std::unique_ptr<StageModule> GPTStack::build(size_t begin, size_t end) const {
  return std::make_unique<nn::GPT>(config_, factory_, begin, end);
}

}  // namespace meshtrain::models
