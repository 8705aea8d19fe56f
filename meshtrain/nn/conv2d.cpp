#include "meshtrain/nn/conv2d.h"

#include <cmath>

namespace meshtrain::nn {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions options, Generator& gen)
    : options_(options) {
  MT_CHECK(in >= 1 && out >= 1 && kernel >= 1, "Conv2d: channels ", in, " -> ", out, " and kernel ",
           kernel, " must be positive");
  MT_CHECK(options.groups >= 1 && in % options.groups == 0 && out % options.groups == 0,
           "Conv2d: groups ", options.groups, " must divide the input channels ", in,
           " and the output channels ", out);
  const int64_t fan_in = in / options.groups * kernel * kernel;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  Tensor w = Tensor::empty({out, in / options.groups, kernel, kernel});
  uniform_(w, gen, -bound, bound);
  weight_ = register_parameter("weight", w, ParamInit::uniform(bound));
  if (options.bias) {
    Tensor b = Tensor::empty({out});
    uniform_(b, gen, -bound, bound);
    bias_ = register_parameter("bias", b, ParamInit::uniform(bound));
  }
}

Tensor Conv2d::forward(const Tensor& x) const {
  return autograd::conv2d(x, weight_, bias_,
                          {options_.stride, options_.padding, options_.dilation, options_.groups});
}

}  // namespace meshtrain::nn
