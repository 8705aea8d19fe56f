// What the pipeline engine tests train: one tiny GPT (four layers, dropout, a checkpointed block,
// so every stage must draw the single model's masks and recompute), and the data, batch k of
// step s the same random tokens in every test and every layout, so a parallel run and the one
// rank it is compared with see the same data, and every step sees different data.
#pragma once

#include <cstdint>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/batch.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::testing {

inline nn::GPTConfig tiny_pipeline_gpt(int64_t vocab, int64_t block, bool tied) {
  nn::GPTConfig c;
  c.vocab_size = vocab;
  c.block_size = block;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 11;
  c.dropout = 0.1f;
  c.checkpointed_blocks = nn::parse_activation_checkpointing("2", c.n_layer);
  c.tie_embeddings = tied;
  return c;
}

inline parallel::Batch step_batch(int step, int k, int64_t rows, int64_t cols, int64_t vocab) {
  Generator gen(1000 * static_cast<uint64_t>(step) + static_cast<uint64_t>(k));
  Tensor x = Tensor::empty({rows, cols}, DType::i32), y = Tensor::empty({rows, cols}, DType::i32);
  for (int64_t i = 0; i < rows * cols; ++i) {
    x.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % static_cast<uint64_t>(vocab));
    y.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % static_cast<uint64_t>(vocab));
  }
  return {x, y};
}

}  // namespace meshtrain::testing
