// The data the engine tests train on: batch k of step s is the same random tokens in every test
// and every layout, so a parallel run and the one rank it is compared with see the same data,
// and every step sees different data.
#pragma once

#include <cstdint>

#include "meshtrain/parallel/batch.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::testing {

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
