// Convolution, batch norm and (optionally) ReLU, the unit a ResNet is built of, as one call that
// picks how to run it. In evaluation without gradients the batch norm is a fixed affine map per
// channel: it is folded into the convolution's weight and bias (cpu/batch_norm_fold.h) and the
// three run as one oneDNN convolution with a ReLU post-op, one pass over the output instead of
// three. Anything else (training mode, grad mode on, a tensor off the CPU or not f32) runs the
// layers one after the other as before, so training is bitwise what it was.
#pragma once

#include "meshtrain/nn/batch_norm.h"
#include "meshtrain/nn/conv2d.h"

namespace meshtrain::nn {

enum class ConvBnFusion {
  automatic,  // fused where it applies (the default)
  off,        // always layer by layer: the reference that tests and benchmarks compare with
};

// The calling thread's choice: automatic unless a ScopedConvBnFusion on this thread says otherwise.
ConvBnFusion conv_bn_fusion();

class ScopedConvBnFusion {
 public:
  explicit ScopedConvBnFusion(ConvBnFusion fusion);
  ~ScopedConvBnFusion();
  ScopedConvBnFusion(const ScopedConvBnFusion&) = delete;
  ScopedConvBnFusion& operator=(const ScopedConvBnFusion&) = delete;

 private:
  ConvBnFusion saved_;
};

// Whether conv_bn_relu would fuse conv and bn on x now (the thread's choice, both modules in
// evaluation, grad mode off, every tensor f32 on the CPU).
bool conv_bn_fusable(const Conv2d& conv, const BatchNorm2d& bn, const Tensor& x);

// bn(conv(x)), then relu when `relu`.
Tensor conv_bn_relu(const Conv2d& conv, const BatchNorm2d& bn, const Tensor& x, bool relu);

}  // namespace meshtrain::nn
