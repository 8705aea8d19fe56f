#include "meshtrain/nn/layer.h"

#include "meshtrain/autograd/ops.h"

namespace meshtrain::nn {

Tensor Layer::forward_as(const Tensor& x, DType out_type) const {
  MT_CHECK(out_type == DType::f32, "this layer gives its output in f32 only, asked for ",
           dtype_name(out_type), " (check gives_half_output() first)");
  return forward(x);
}

Tensor Layer::forward_residual(const Tensor& residual, const Tensor& x) const {
  return autograd::add(residual, forward(x));
}

}  // namespace meshtrain::nn
