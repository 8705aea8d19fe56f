// The token embedding split over tp by vocabulary rows: rank r holds rows
// [r * Vp / tp, (r + 1) * Vp / tp) of the table, Vp the vocabulary padded up to a multiple of tp
// (padding rows are zero and never looked up). A rank looks up the tokens it owns, zeros for the
// rest, and the partial embeddings are summed over tp (reduce_from_tp_region, or reduce-scattered
// along the sequence), so the result is the whole table's lookup.
//
// The same shard is the weight of the vocabulary-parallel output head (tied or not), whose
// cross-entropy never gathers the logits (vocab_parallel_cross_entropy.h).
#pragma once

#include "meshtrain/nn/vocab_table.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"

namespace meshtrain::parallel::tp {

class VocabParallelEmbedding : public nn::VocabTable {
 public:
  VocabParallelEmbedding(int64_t vocab, int64_t dim, const TpContext& tp, double init_std = 0.02);
  // idx[B, T] i32 -> [B, T, dim] (or this rank's [B, T / tp, dim] with sequence parallelism).
  Tensor forward(const Tensor& idx) const;
  // The lookup of this rank's rows alone, [..., dim], before the sum over tp.
  Tensor local_lookup(const Tensor& idx) const;

  // As a GPT's token table: the lookup plus this rank's positions of wpe (its time steps under
  // sequence parallelism), this rank's logit columns [B, T, Vp / tp] (Vp: the vocabulary padded
  // to a multiple of tp; columns past it are padding), and their cross-entropy.
  Tensor embed(const Tensor& idx, const Tensor& wpe) const override;
  Tensor logits(const Tensor& h) const override;
  Tensor loss(const Tensor& logits, const Tensor& targets) const override;

  const Tensor& weight() const override { return weight_; }
  int64_t vocab_begin() const { return begin_; }  // the first global row this rank holds
  int64_t vocab_valid() const { return valid_; }  // rows that are not padding

 private:
  TpContext tp_;
  Tensor weight_;
  int64_t begin_ = 0;
  int64_t valid_ = 0;
};

}  // namespace meshtrain::parallel::tp
