// The folded weight and bias are made afresh on every call rather than cached: they depend on
// parameters and running statistics that training or a loaded checkpoint may change between
// calls, and folding costs a pass over the weight, small against the convolution it feeds.
#include "meshtrain/nn/conv_bn_relu.h"

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/vision.h"
#include "meshtrain/tensor/cpu/batch_norm_fold.h"

namespace meshtrain::nn {
namespace {

thread_local ConvBnFusion t_fusion = ConvBnFusion::automatic;

bool plain_cpu(const Tensor& t) {
  return !t.defined() || (t.dtype() == DType::f32 && t.device().is_cpu());
}

const float* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

}  // namespace

ConvBnFusion conv_bn_fusion() {
  return t_fusion;
}

ScopedConvBnFusion::ScopedConvBnFusion(ConvBnFusion fusion) : saved_(t_fusion) {
  t_fusion = fusion;
}

ScopedConvBnFusion::~ScopedConvBnFusion() {
  t_fusion = saved_;
}

bool conv_bn_fusable(const Conv2d& conv, const BatchNorm2d& bn, const Tensor& x) {
  return t_fusion == ConvBnFusion::automatic && !conv.is_training() && !bn.is_training() &&
         !autograd::grad_enabled() && plain_cpu(x) && plain_cpu(conv.weight()) &&
         plain_cpu(conv.bias()) && plain_cpu(bn.weight()) && plain_cpu(bn.bias()) &&
         plain_cpu(bn.running_mean()) && plain_cpu(bn.running_var());
}

Tensor conv_bn_relu(const Conv2d& conv, const BatchNorm2d& bn, const Tensor& x, bool relu) {
  if (!conv_bn_fusable(conv, bn, x)) {
    Tensor h = bn.forward(conv.forward(x));
    return relu ? autograd::relu(h) : h;
  }
  const Tensor& w = conv.weight();
  const int64_t C_out = w.size(0);
  MT_CHECK(bn.running_mean().numel() == C_out, "conv_bn_relu: the convolution has ", C_out,
           " output channels, the batch norm ", bn.running_mean().numel());
  Tensor folded_w = Tensor::empty(w.shape());
  Tensor folded_b = Tensor::empty({C_out});
  cpu::fold_batch_norm(folded_w.data<float>(), folded_b.data<float>(), w.data<float>(),
                       ptr_or_null(conv.bias()), ptr_or_null(bn.weight()), ptr_or_null(bn.bias()),
                       bn.running_mean().data<float>(), bn.running_var().data<float>(),
                       bn.options().eps, C_out, w.numel() / C_out);
  const Conv2dOptions& o = conv.options();
  return autograd::conv2d_inference(x, folded_w, folded_b,
                                    {o.stride, o.padding, o.dilation, o.groups}, relu);
}

}  // namespace meshtrain::nn
