#include "meshtrain/nn/block.h"

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"

namespace meshtrain::nn {

Block::Block(const BlockOptions& opt, Generator& gen) : opt_(opt) {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(opt.n_embd, opt.bias));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(
                                      opt.n_embd, opt.n_head, opt.bias, gen, opt.proj_init_std));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(opt.n_embd, opt.bias));
  mlp_ =
      register_module("mlp", std::make_shared<MLP>(opt.n_embd, opt.bias, gen, opt.proj_init_std));
}

Tensor Block::forward(const Tensor& x, uint64_t dropout_seed) const {
  const bool train = is_training();
  Tensor a =
      autograd::dropout(attn_->forward(ln_1_->forward(x)), opt_.dropout, dropout_seed, 0, train);
  Tensor h = autograd::add(x, a);
  Tensor m = autograd::dropout(mlp_->forward(ln_2_->forward(h)), opt_.dropout, dropout_seed,
                               static_cast<uint64_t>(h.numel()), train);
  return autograd::add(h, m);
}

}  // namespace meshtrain::nn
