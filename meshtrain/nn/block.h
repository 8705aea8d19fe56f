// A pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
#pragma once

#include <memory>

#include "meshtrain/nn/causal_self_attention.h"
#include "meshtrain/nn/layer_norm.h"
#include "meshtrain/nn/mlp.h"

namespace meshtrain::nn {

struct BlockOptions {
  int64_t n_embd = 128;
  int64_t n_head = 4;
  bool bias = true;
  float dropout = 0.0f;
  double proj_init_std = 0.02;
};

class Block : public Module {
 public:
  Block(const BlockOptions& opt, Generator& gen);
  // dropout_seed selects this step's masks (residual dropout, as in GPT-2).
  Tensor forward(const Tensor& x, uint64_t dropout_seed = 0) const;

 private:
  BlockOptions opt_;
  std::shared_ptr<LayerNorm> ln_1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<LayerNorm> ln_2_;
  std::shared_ptr<MLP> mlp_;
};

}  // namespace meshtrain::nn
