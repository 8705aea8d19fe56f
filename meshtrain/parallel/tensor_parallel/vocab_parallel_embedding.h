// The token embedding split over tp by vocabulary rows: rank r holds rows
// [r * Vp / tp, (r + 1) * Vp / tp) of the table, Vp the vocabulary padded up to a multiple of tp
// (padding rows are zero and never looked up). A rank looks up the tokens it owns, zeros for the
// rest, and the partial embeddings are summed over tp (reduce_from_tp_region, or reduce-scattered
// along the sequence), so the result is the whole table's lookup.
//
// The same shard is the weight of the vocabulary-parallel output head when embeddings are tied
// (vocab_parallel_cross_entropy.h).
#pragma once

#include "meshtrain/nn/module.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"

namespace meshtrain::parallel::tp {

class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(int64_t vocab, int64_t dim, const TpContext& tp, double init_std = 0.02);
  // idx[B, T] i32 -> [B, T, dim] (or this rank's [B, T / tp, dim] with sequence parallelism).
  Tensor forward(const Tensor& idx) const;
  // The lookup of this rank's rows alone, [..., dim], before the sum over tp.
  Tensor local_lookup(const Tensor& idx) const;

  const Tensor& weight() const { return weight_; }
  int64_t vocab_begin() const { return begin_; }  // the first global row this rank holds
  int64_t vocab_valid() const { return valid_; }  // rows that are not padding

 private:
  TpContext tp_;
  Tensor weight_;
  int64_t begin_ = 0;
  int64_t valid_ = 0;
};

}  // namespace meshtrain::parallel::tp
