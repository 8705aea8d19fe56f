// Comparing tensors in tests: the same bits (defined, shape, dtype and bytes), and the largest
// elementwise difference of two f32 tensors of one shape.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::testing {

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

inline float largest_difference(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  float worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  return worst;
}

}  // namespace meshtrain::testing
