// The tiny GPT the device tests train, and its random batches: small enough for the fake
// device's CPU kernels, with several heads, two blocks and an odd vocabulary.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::test {

inline constexpr int64_t kTinyT = 16;
inline constexpr int64_t kTinyVocab = 37;

inline nn::GPTConfig tiny_gpt_config(int64_t n_layer = 2) {
  nn::GPTConfig gc;
  gc.n_layer = n_layer;
  gc.n_embd = 32;
  gc.n_head = 4;
  gc.block_size = kTinyT;
  gc.vocab_size = kTinyVocab;
  return gc;
}

// `rows` sequences of `T` inputs and targets below `vocab` drawn from `gen`, on `device`.
inline std::pair<Tensor, Tensor> random_tokens(Generator& gen, int64_t rows, Device device,
                                               int64_t T = kTinyT, int64_t vocab = kTinyVocab) {
  std::vector<int32_t> x, y;
  for (int64_t i = 0; i < rows * T; ++i) {
    x.push_back(static_cast<int32_t>(gen.below(static_cast<uint64_t>(vocab))));
    y.push_back(static_cast<int32_t>(gen.below(static_cast<uint64_t>(vocab))));
  }
  return {Tensor::from_vector(x, {rows, T}).to(device),
          Tensor::from_vector(y, {rows, T}).to(device)};
}

}  // namespace meshtrain::test
