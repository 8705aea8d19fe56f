// The token table of a language model: the embedding at its input and, with tied embeddings, the
// weight of its output head. Plain, it is the whole [V, C] table; tensor-parallel, one rank's
// vocabulary rows, whose lookup, logits and cross-entropy need the other ranks'. The GPT calls
// these and never asks which it holds.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class VocabTable : public Module {
 public:
  // The table this rank holds: [V, C], or a shard of its rows.
  virtual const Tensor& weight() const = 0;
  // Token ids idx[B, T] looked up and added to the positions wpe[T_max, C]: the hidden state
  // before dropout, [B, T, C] or this rank's time steps of it.
  virtual Tensor embed(const Tensor& idx, const Tensor& wpe) const = 0;
  // The final norm's output h [..., C] (as this rank holds it) -> the logits this rank holds.
  virtual Tensor logits(const Tensor& h) const = 0;
  // Mean cross-entropy of logits() [B, T, *] against targets[B, T] (i32; -1 ignored), the same
  // value on every rank.
  virtual Tensor loss(const Tensor& logits, const Tensor& targets) const = 0;
  // loss(logits(h), targets), for a table that can do better without handing the logits out (the
  // plain one keeps them in the half type under autocast: linear_cross_entropy.h).
  virtual Tensor loss_of_hidden(const Tensor& h, const Tensor& targets) const;
  // Whether loss_of_hidden also takes h in autocast's half type (its first op is a product that
  // would round it anyway), so that the final norm may hand it over rounded.
  virtual bool takes_half_hidden() const { return false; }
};

}  // namespace meshtrain::nn
