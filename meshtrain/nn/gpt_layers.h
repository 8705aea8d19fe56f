// The layer factory the one GPT (gpt.h) is built through. It makes the layers whose form depends
// on how the model is split: the projections into and out of the heads and the MLP (plain
// linears, or Megatron's column- and row-parallel halves), the token table (whole, or
// vocabulary-parallel with its cross-entropy), and the dropout of activations that may be split
// along the sequence. The model's structure, names, initial values and dropout seeds live once,
// in the GPT; a factory only says how each piece is held.
//
// plain_gpt_layers() is the unsplit model: exactly the kernels of a single process. The
// tensor-parallel factory is parallel/tensor_parallel/tp_gpt_layers.h.
#pragma once

#include <memory>

#include "meshtrain/nn/layer.h"
#include "meshtrain/nn/vocab_table.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::nn {

struct GPTConfig;

class GPTLayers {
 public:
  virtual ~GPTLayers() = default;

  // ValueError naming the config keys when the model cannot be held this way.
  virtual void validate(const GPTConfig& config) const = 0;
  // How many ranks share each matrix: heads and vocabulary rows are split this many ways.
  virtual int ranks() const = 0;
  // How many ranks share the time steps of the activations between the matrices (1: each rank
  // holds the whole sequence).
  virtual int sequence_ranks() const = 0;

  // A projection whose output features are split (attention's c_attn, whose `blocks` = 3 packed
  // q, k, v split block by block; the MLP's c_fc). `gen` feeds a plain layer's first draw only:
  // the GPT draws every value again by name.
  virtual std::shared_ptr<Layer> column(int64_t in, int64_t out, bool bias, double init_std,
                                        int64_t blocks, Generator& gen) const = 0;
  // A projection whose input features are split and whose output is whole (both c_proj's).
  virtual std::shared_ptr<Layer> row(int64_t in, int64_t out, bool bias, double init_std,
                                     Generator& gen) const = 0;
  // The token table: the embedding, the untied head, or the tied head's copy of the embedding.
  virtual std::shared_ptr<VocabTable> vocab(int64_t vocab, int64_t dim, Generator& gen) const = 0;

  // Dropout of x[B, Tl, C], this rank's time steps of a whole [B, Tl * sequence_ranks(), C]
  // tensor, with the masks the whole tensor gets from (seed, offset).
  virtual Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset,
                         bool training) const = 0;
};

// The unsplit model's factory (nn::Linear, the whole table, cross_entropy).
std::shared_ptr<const GPTLayers> plain_gpt_layers();

}  // namespace meshtrain::nn
