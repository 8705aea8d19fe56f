// Megatron's two halves of a split matrix product, as nn.Linear-shaped modules whose weights are
// slices of the whole layer's ([out, in], PyTorch layout):
//
// ColumnParallelLinear holds out / tp output rows: the replicated input enters the TP region
// (copy_to_tp_region, or gather_from_sequence_parallel when the input is split along the
// sequence) and each rank computes its slice of the output features, left split.
//
// RowParallelLinear holds in / tp input columns: each rank multiplies its slice of the features
// and the partial products are summed (reduce_from_tp_region, or reduce-scattered along the
// sequence), then the replicated bias is added once.
//
// Used as a pair (column then row) a layer costs one all-reduce forward and one backward.
#pragma once

#include "meshtrain/nn/layer.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"

namespace meshtrain::parallel::tp {

class ColumnParallelLinear : public nn::Layer {
 public:
  // `blocks` stacked outputs (3: packed q, k, v) are split block by block, so each rank gets its
  // share of every block. out must divide by blocks * tp.
  ColumnParallelLinear(int64_t in, int64_t out, bool bias, const TpContext& tp,
                       double init_std = 0.02, int64_t blocks = 1);
  // [B, T, in] (or [B, T / tp, in] with sequence parallelism) -> [B, T, out / tp].
  Tensor forward(const Tensor& x) const override;

 private:
  TpContext tp_;
  Tensor weight_;
  Tensor bias_;
};

class RowParallelLinear : public nn::Layer {
 public:
  // in must divide by tp.
  RowParallelLinear(int64_t in, int64_t out, bool bias, const TpContext& tp,
                    double init_std = 0.02);
  // [B, T, in / tp] -> [B, T, out] (or this rank's [B, T / tp, out] with sequence parallelism).
  Tensor forward(const Tensor& x) const override;

 private:
  TpContext tp_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace meshtrain::parallel::tp
