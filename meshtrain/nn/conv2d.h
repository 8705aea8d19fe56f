// nn.Conv2d over NCHW tensors, weight [out, in / groups, kernel, kernel] and bias [out] as in
// PyTorch, so weights move between the two (and into torchvision) unchanged.
#pragma once

#include "meshtrain/autograd/vision.h"
#include "meshtrain/nn/layer.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::nn {

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

class Conv2d : public Layer {
 public:
  // Weight and bias ~ U(-b, b) with b = 1 / sqrt(in / groups * kernel^2): PyTorch's default
  // (Kaiming-uniform with a = sqrt(5) for the weight, the same bound for the bias), drawn from gen
  // now and from the keyed generator by init_parameters.
  Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions options, Generator& gen);
  Tensor forward(const Tensor& x) const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Conv2dOptions& options() const { return options_; }

 private:
  Conv2dOptions options_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace meshtrain::nn
