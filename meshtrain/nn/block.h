// A pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)), with residual dropout
// as in GPT-2; the mlp may be a mixture of experts (BlockOptions::moe_context). Its matrices come
// from a layer factory (gpt_layers.h): plain, or split over tensor-parallel ranks, whose block is
// the plain block computed on tp ranks (parameter names and values are the plain block's; the split
// ones are slices of them).
//
// With sequence parallelism the block's input and output are this rank's time steps
// [B, T / tp, C]; the norms, dropouts and residual additions run on them alone, and the
// matrices' entry (all-gather) and exit (reduce-scatter) replace the all-reduces.
#pragma once

#include <memory>

#include "meshtrain/nn/causal_self_attention.h"
#include "meshtrain/nn/layer_norm.h"
#include "meshtrain/nn/mlp.h"
#include "meshtrain/nn/moe_mlp.h"

namespace meshtrain::nn {

struct BlockOptions {
  int64_t n_embd = 128;
  int64_t n_head = 4;
  bool bias = true;
  float dropout = 0.0f;
  double proj_init_std = 0.02;
  // Set: the MLP is a mixture of experts (moe_mlp.h), layer `moe_layer` of the context.
  std::shared_ptr<MoEContext> moe_context;
  MoEConfig moe;
  size_t moe_layer = 0;
};

class Block : public Module {
 public:
  Block(const BlockOptions& opt, std::shared_ptr<const GPTLayers> layers, Generator& gen);
  // The plain block.
  Block(const BlockOptions& opt, Generator& gen);
  // dropout_seed selects this step's masks.
  Tensor forward(const Tensor& x, uint64_t dropout_seed = 0) const;

 private:
  BlockOptions opt_;
  std::shared_ptr<const GPTLayers> layers_;
  std::shared_ptr<LayerNorm> ln_1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln_2_;
  std::shared_ptr<MLP> mlp_;
  std::shared_ptr<MoEMLP> moe_;  // instead of mlp_
};

}  // namespace meshtrain::nn
