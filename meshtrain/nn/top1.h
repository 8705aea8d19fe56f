// The top-1 class of classifier logits, and how many of them match the labels: what a classifier's
// predict() returns and what its evaluation counts.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {

// logits[N, K] (f32, host) -> the index of each row's largest logit (the first of equal ones).
std::vector<int32_t> top1(const Tensor& logits);
// How many rows' top-1 class equals labels[N] (i32).
int64_t count_top1(const Tensor& logits, const Tensor& labels);

}  // namespace meshtrain::nn
