// Pooling over NCHW arrays: max pooling (ResNet's stem), average pooling and the global average
// pooling before a classifier. Windows are PyTorch's (kernel, stride, padding; floor rounding of
// the output size, i.e. ceil_mode=False; no dilation): OH = (H + 2 * pad_h - KH) / stride_h + 1.
// Planes (one image's channel) are independent, so each kernel splits planes across threads and
// results never depend on the thread count. Backward kernels ACCUMULATE into dinp (kernels.h).
#pragma once

#include <cstdint>

#include "meshtrain/tensor/cpu/window.h"

namespace meshtrain::cpu {

struct Pool2dShape {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;

  int64_t out_h() const { return window_out_size(H, pad_h, KH, stride_h); }
  int64_t out_w() const { return window_out_size(W, pad_w, KW, stride_w); }
};

// out[N, C, OH, OW] = the maximum over each window (padding never wins: it is -infinity, so a
// window must hold a real value, which pad <= K / 2 guarantees). argmax (may be nullptr) gets the
// index into the H * W plane of the first maximum in row-major window order; a window holding NaN
// yields NaN and its first NaN's index, as in PyTorch.
void max_pool2d_forward(float* out, int32_t* argmax, const float* inp, const Pool2dShape& s);

// dinp[plane][argmax] += dout for every output position.
void max_pool2d_backward(float* dinp, const float* dout, const int32_t* argmax,
                         const Pool2dShape& s);

// out = the mean over each window. count_include_pad: divide by KH * KW (PyTorch's default), else
// by the number of positions inside the image.
void avg_pool2d_forward(float* out, const float* inp, const Pool2dShape& s,
                        bool count_include_pad = true);
void avg_pool2d_backward(float* dinp, const float* dout, const Pool2dShape& s,
                         bool count_include_pad = true);

// out[N, C] = the mean of each [H, W] plane of inp[N, C, H, W] (HW = H * W values, summed in
// double); the backward spreads dout[N, C] evenly over the plane.
void global_avg_pool_forward(float* out, const float* inp, int64_t N, int64_t C, int64_t HW);
void global_avg_pool_backward(float* dinp, const float* dout, int64_t N, int64_t C, int64_t HW);

}  // namespace meshtrain::cpu
