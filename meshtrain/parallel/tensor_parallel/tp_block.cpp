#include "meshtrain/parallel/tensor_parallel/tp_block.h"

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/parallel/tensor_parallel/sequence_dropout.h"

namespace meshtrain::parallel::tp {

TpAttention::TpAttention(int64_t n_embd, int64_t n_head, bool bias, const TpContext& tp,
                         double proj_init_std)
    : local_heads_(n_head / tp.size()) {
  MT_CHECK(n_head % tp.size() == 0, "attention: ", n_head, " heads do not split over ", tp.size(),
           " tensor-parallel ranks");
  c_attn_ = register_module(
      "c_attn", std::make_shared<ColumnParallelLinear>(n_embd, 3 * n_embd, bias, tp, 0.02, 3));
  c_proj_ = register_module(
      "c_proj", std::make_shared<RowParallelLinear>(n_embd, n_embd, bias, tp, proj_init_std));
}

Tensor TpAttention::forward(const Tensor& x) const {
  // This rank's heads: q, k and v of heads [r * NH / tp, (r + 1) * NH / tp), packed as c_attn's.
  const Tensor qkv = c_attn_->forward(x);
  return c_proj_->forward(autograd::causal_attention(qkv, local_heads_));
}

TpMlp::TpMlp(int64_t n_embd, bool bias, const TpContext& tp, double proj_init_std) {
  c_fc_ =
      register_module("c_fc", std::make_shared<ColumnParallelLinear>(n_embd, 4 * n_embd, bias, tp));
  c_proj_ = register_module(
      "c_proj", std::make_shared<RowParallelLinear>(4 * n_embd, n_embd, bias, tp, proj_init_std));
}

Tensor TpMlp::forward(const Tensor& x) const {
  return c_proj_->forward(autograd::gelu(c_fc_->forward(x)));
}

TpBlock::TpBlock(const nn::BlockOptions& opt, const TpContext& tp) : opt_(opt), tp_(tp) {
  ln_1_ = register_module("ln_1", std::make_shared<nn::LayerNorm>(opt.n_embd, opt.bias));
  attn_ = register_module("attn", std::make_shared<TpAttention>(opt.n_embd, opt.n_head, opt.bias,
                                                                tp, opt.proj_init_std));
  ln_2_ = register_module("ln_2", std::make_shared<nn::LayerNorm>(opt.n_embd, opt.bias));
  mlp_ =
      register_module("mlp", std::make_shared<TpMlp>(opt.n_embd, opt.bias, tp, opt.proj_init_std));
}

Tensor TpBlock::forward(const Tensor& x, uint64_t dropout_seed, int64_t T) const {
  const bool train = is_training();
  // The masks of nn::Block (offset 0 for attention, the activation's size for the MLP), cut to
  // this rank's time range when the sequence is split.
  const int64_t t0 = tp_.sequence_parallel ? tp_.rank() * x.size(1) : 0;
  const auto whole = static_cast<uint64_t>(x.size(0) * T * x.size(2));
  Tensor a = sequence_dropout(attn_->forward(ln_1_->forward(x)), opt_.dropout, dropout_seed, 0,
                              train, t0, T);
  Tensor h = autograd::add(x, a);
  Tensor m = sequence_dropout(mlp_->forward(ln_2_->forward(h)), opt_.dropout, dropout_seed, whole,
                              train, t0, T);
  return autograd::add(h, m);
}

}  // namespace meshtrain::parallel::tp
