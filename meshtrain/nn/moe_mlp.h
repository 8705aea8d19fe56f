// A mixture-of-experts feed-forward block (Switch Transformer / GShard): a router (a bias-free
// linear C -> E, kept in f32) picks top_k of E experts per token, each expert a GPT-2 MLP of its
// own, and a token's output is its experts' outputs weighted by their gates. Tokens past an
// expert's capacity are dropped (their residual carries on), or none are (dropless).
//
// In training, the load-balancing and z losses (weighted by model.moe.*_weight) join the
// objective through attach_loss at the model's backward scale, and each forward's routing is
// counted in the model's MoEContext. Parameter names: router.weight, experts.<e>.c_fc.*,
// experts.<e>.c_proj.* (ParamInfo.expert set on the experts'), and with model.moe.bias_update_rate
// the buffer expert_bias.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/autograd/moe_ops.h"
#include "meshtrain/nn/mlp.h"
#include "meshtrain/nn/moe_config.h"
#include "meshtrain/nn/moe_context.h"

namespace meshtrain::nn {

// An expert MLP's weights as the grouped operation takes them (the same tensors).
autograd::ExpertMlp expert_mlp_weights(const MLP& mlp);

class MoEMLP : public Module {
 public:
  // `layer` is this block's index in `context`.
  MoEMLP(int64_t n_embd, bool bias, const MoEConfig& config, std::shared_ptr<MoEContext> context,
         size_t layer, Generator& gen, double proj_init_std);
  // x[..., C] -> [..., C]; `seed` draws the router noise of this forward.
  Tensor forward(const Tensor& x, uint64_t seed) const;

 private:
  MoEConfig config_;
  std::shared_ptr<MoEContext> context_;
  size_t layer_;
  std::shared_ptr<Layer> router_;
  // This rank's experts on their rows, in the experts' order.
  std::vector<Tensor> run_experts(const std::vector<Tensor>& rows) const;

  std::vector<std::shared_ptr<MLP>> experts_;
  std::vector<autograd::ExpertMlp> expert_weights_;  // the same tensors, for the grouped op
  Tensor expert_bias_;                               // [E]; undefined without balancing
};

}  // namespace meshtrain::nn
