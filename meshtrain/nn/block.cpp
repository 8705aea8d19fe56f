#include "meshtrain/nn/block.h"

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/ops.h"

namespace meshtrain::nn {

Block::Block(const BlockOptions& opt, std::shared_ptr<const GPTLayers> layers, Generator& gen)
    : opt_(opt), layers_(std::move(layers)) {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(opt.n_embd, opt.bias));
  attn_ = register_module(
      "attn", std::make_shared<CausalSelfAttention>(opt.n_embd, opt.n_head, opt.bias, *layers_, gen,
                                                    opt.proj_init_std));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(opt.n_embd, opt.bias));
  if (opt.moe_context)
    moe_ = register_module("mlp",
                           std::make_shared<MoEMLP>(opt.n_embd, opt.bias, opt.moe, opt.moe_context,
                                                    opt.moe_layer, gen, opt.proj_init_std));
  else
    mlp_ = register_module(
        "mlp", std::make_shared<MLP>(opt.n_embd, opt.bias, *layers_, gen, opt.proj_init_std));
}

Block::Block(const BlockOptions& opt, Generator& gen) : Block(opt, plain_gpt_layers(), gen) {}

Tensor Block::forward(const Tensor& x, uint64_t dropout_seed) const {
  const bool train = is_training();
  // The MLP's masks follow the attention's in the whole [B, T, C] tensor's numbering, so a rank
  // holding a time range of it drops what a single process would.
  const auto whole = static_cast<uint64_t>(x.numel() * layers_->sequence_ranks());
  // Under autocast the layer norms hand a product that takes half inputs their output rounded.
  using autograd::output_type_for;
  const Tensor h1 = ln_1_->forward(x, output_type_for(attn_->takes_half_input()));
  // Without dropout between them, each branch's output projection adds its product to the
  // residual stream where it writes it (the same values as the addition after it).
  const bool dropping = train && opt_.dropout > 0.0f;
  const Tensor h = dropping ? autograd::add(x, layers_->dropout(attn_->forward(h1), opt_.dropout,
                                                                dropout_seed, 0, train))
                            : attn_->forward_residual(x, h1);
  const Tensor h2 = ln_2_->forward(h, output_type_for(!moe_ && mlp_->takes_half_input()));
  if (moe_ || dropping) {
    Tensor m = layers_->dropout(moe_ ? moe_->forward(h2, dropout_seed) : mlp_->forward(h2),
                                opt_.dropout, dropout_seed, whole, train);
    return autograd::add(h, m);
  }
  return mlp_->forward_residual(h, h2);
}

}  // namespace meshtrain::nn
