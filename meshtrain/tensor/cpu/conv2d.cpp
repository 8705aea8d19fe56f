// Chooses the implementation of each convolution call and handles the empty cases (a rank with no
// samples) once, so that neither implementation sees a zero-sized array.
#include "meshtrain/tensor/cpu/conv2d.h"

#include <algorithm>
#include <sstream>

#include "meshtrain/tensor/cpu/conv2d_impl.h"
#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/relu.h"

namespace meshtrain::cpu {
namespace {

thread_local ConvImpl t_impl = ConvImpl::onednn;

}  // namespace

std::string Conv2dShape::str() const {
  std::ostringstream os;
  os << "N=" << N << " C_in=" << C_in << " H=" << H << " W=" << W << " C_out=" << C_out
     << " K=" << KH << "x" << KW << " stride=" << stride_h << "x" << stride_w << " pad=" << pad_h
     << "x" << pad_w << " dil=" << dil_h << "x" << dil_w << " groups=" << groups;
  return os.str();
}

ConvImpl conv_impl() {
  return t_impl;
}

ScopedConvImpl::ScopedConvImpl(ConvImpl impl) : saved_(t_impl) {
  t_impl = impl;
}

ScopedConvImpl::~ScopedConvImpl() {
  t_impl = saved_;
}

void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, ConvImpl impl) {
  KernelTimer timer(KernelKind::gemm);
  if (s.empty_output()) return;
  if (impl == ConvImpl::onednn) {
    conv2d_onednn::forward(out, inp, weight, bias, s);
  } else {
    conv2d_reference::forward(out, inp, weight, bias, s);
  }
}

void conv2d_forward_inference(float* out, const float* inp, const float* weight, const float* bias,
                              const Conv2dShape& s, bool relu, ConvImpl impl) {
  KernelTimer timer(KernelKind::gemm);
  if (s.empty_output()) return;
  if (impl == ConvImpl::onednn) {
    conv2d_onednn::forward_inference(out, inp, weight, bias, s, relu);
    return;
  }
  conv2d_reference::forward(out, inp, weight, bias, s);
  if (relu) relu_forward(out, out, s.N * s.C_out * s.out_h() * s.out_w());
}

void conv2d_backward_data(float* dinp, const float* dout, const float* weight, const Conv2dShape& s,
                          ConvImpl impl) {
  KernelTimer timer(KernelKind::gemm);
  if (s.empty_output()) {
    std::fill_n(dinp, s.N * s.C_in * s.H * s.W, 0.0f);
    return;
  }
  if (impl == ConvImpl::onednn) {
    conv2d_onednn::backward_data(dinp, dout, weight, s);
  } else {
    conv2d_reference::backward_data(dinp, dout, weight, s);
  }
}

void conv2d_backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                             const Conv2dShape& s, ConvImpl impl) {
  KernelTimer timer(KernelKind::gemm);
  if (s.empty_output()) {
    if (dweight != nullptr) std::fill_n(dweight, s.weight_numel(), 0.0f);
    if (dbias != nullptr) std::fill_n(dbias, s.C_out, 0.0f);
    return;
  }
  if (impl == ConvImpl::onednn) {
    conv2d_onednn::backward_weights(dweight, dbias, dout, inp, s);
  } else {
    conv2d_reference::backward_weights(dweight, dbias, dout, inp, s);
  }
}

ConvCacheStats conv_cache_stats() {
  return conv2d_onednn::cache_stats();
}

std::string onednn_config() {
  return conv2d_onednn::config();
}

}  // namespace meshtrain::cpu
