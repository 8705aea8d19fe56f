// The tensor-parallel GPT-2 block: the same pre-norm layer as nn::Block, with attention's heads
// split over tp (c_attn column-parallel in q/k/v blocks, c_proj row-parallel) and the MLP split
// the same way (c_fc column-parallel, c_proj row-parallel). Parameter names and values are
// nn::Block's (the sharded ones are slices of them), so a TP block is the plain block computed
// on tp ranks.
//
// With sequence parallelism the block's input and output are this rank's time range
// [B, T / tp, C]; the norms, dropouts and residual additions run on it alone, and the matrices'
// entry (all-gather) and exit (reduce-scatter) replace the all-reduces.
#pragma once

#include <memory>

#include "meshtrain/nn/block.h"
#include "meshtrain/nn/layer_norm.h"
#include "meshtrain/parallel/tensor_parallel/parallel_linear.h"

namespace meshtrain::parallel::tp {

class TpAttention : public nn::Module {
 public:
  TpAttention(int64_t n_embd, int64_t n_head, bool bias, const TpContext& tp, double proj_init_std);
  // [B, T, C] whole (or [B, T / tp, C]) -> the same layout.
  Tensor forward(const Tensor& x) const;

 private:
  int64_t local_heads_;
  std::shared_ptr<ColumnParallelLinear> c_attn_;
  std::shared_ptr<RowParallelLinear> c_proj_;
};

class TpMlp : public nn::Module {
 public:
  TpMlp(int64_t n_embd, bool bias, const TpContext& tp, double proj_init_std);
  Tensor forward(const Tensor& x) const;

 private:
  std::shared_ptr<ColumnParallelLinear> c_fc_;
  std::shared_ptr<RowParallelLinear> c_proj_;
};

class TpBlock : public nn::Module {
 public:
  TpBlock(const nn::BlockOptions& opt, const TpContext& tp);
  // x: [B, T, C], or this rank's [B, T / tp, C] with sequence parallelism (T the whole length).
  Tensor forward(const Tensor& x, uint64_t dropout_seed, int64_t T) const;

 private:
  nn::BlockOptions opt_;
  TpContext tp_;
  std::shared_ptr<nn::LayerNorm> ln_1_;
  std::shared_ptr<TpAttention> attn_;
  std::shared_ptr<nn::LayerNorm> ln_2_;
  std::shared_ptr<TpMlp> mlp_;
};

}  // namespace meshtrain::parallel::tp
