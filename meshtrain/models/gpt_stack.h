// GPT as a ModelStack: the embedding (wte, wpe), one layer per block (h.N), and the head (ln_f,
// the language-model projection and the loss). build(begin, end) is nn::GPT over that range,
// made through the stack's layer factory (plain by default; tp::gpt_layers for this rank's
// tensor-parallel shards), so a stage holds the whole model's same-named parameters with the same
// values and computes what those layers of the whole model compute.
#pragma once

#include <memory>

#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/gpt.h"

namespace meshtrain::models {

class GPTStack : public ModelStack {
 public:
  explicit GPTStack(const nn::GPTConfig& config,
                    std::shared_ptr<const nn::GPTLayers> layers = nn::plain_gpt_layers());
  // Each layer's parameter count and its forward plus backward FLOPs per token (nn/gpt_costs.h).
  const std::vector<LayerSpec>& layers() const override { return layers_; }
  std::unique_ptr<StageModule> build(size_t begin, size_t end) const override;
  const nn::GPTConfig& config() const { return config_; }

 private:
  nn::GPTConfig config_;
  std::shared_ptr<const nn::GPTLayers> factory_;
  std::vector<LayerSpec> layers_;
};

}  // namespace meshtrain::models
