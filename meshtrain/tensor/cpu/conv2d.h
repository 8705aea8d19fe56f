// 2-D convolution over NCHW f32 arrays, PyTorch's nn.Conv2d: stride, zero padding (the same on
// both sides of a dimension), dilation, groups and an optional bias. Two implementations behind one
// set of functions: oneDNN (the library behind PyTorch's CPU convolutions; the default) and a plain
// reference (im2col + our matmul) that the tests hold oneDNN to.
//
// Dimension letters (kernels.h adds these for images):
//   N  batch    C_in / C_out  input / output channels    H, W / OH, OW  input / output height,
//   width KH, KW  kernel height, width    G  groups (C_in and C_out are multiples of G)
// inp [N, C_in, H, W], weight [C_out, C_in / G, KH, KW] (PyTorch's layout), bias [C_out],
// out [N, C_out, OH, OW] with OH = (H + 2 * pad_h - dil_h * (KH - 1) - 1) / stride_h + 1.
//
// Unlike most kernels here, the backward functions WRITE their gradients instead of adding to them:
// oneDNN writes its outputs, and adding would cost a scratch array and a pass over it. The
// autograd op hands them fresh buffers anyway. Neither implementation is bitwise independent of
// the thread count: both reduce over OpenMP threads inside a BLAS or oneDNN.
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "meshtrain/tensor/cpu/window.h"

namespace meshtrain::cpu {

struct Conv2dShape {
  int64_t N = 0, C_in = 0, H = 0, W = 0;
  int64_t C_out = 0, KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dil_h = 1, dil_w = 1;
  int64_t groups = 1;

  // 0 when the dilated kernel does not fit the padded input.
  int64_t out_h() const { return window_out_size(H, pad_h, dil_h * (KH - 1) + 1, stride_h); }
  int64_t out_w() const { return window_out_size(W, pad_w, dil_w * (KW - 1) + 1, stride_w); }
  int64_t weight_numel() const { return C_out * (C_in / groups) * KH * KW; }
  // No sample (a rank without any), no output channel or no output position: the forward writes
  // nothing and the backward writes zero gradients.
  bool empty_output() const { return N == 0 || C_out == 0 || out_h() <= 0 || out_w() <= 0; }
  // "N=2 C_in=3 H=8 W=8 C_out=4 K=3x3 stride=1x1 pad=1x1 dil=1x1 groups=1", for messages.
  std::string str() const;
  auto operator<=>(const Conv2dShape&) const = default;
};

enum class ConvImpl { onednn, reference };

// The implementation that the calling thread's convolutions use when none is named: oneDNN,
// unless a ScopedConvImpl on this thread says otherwise.
ConvImpl conv_impl();

// Selects the implementation for the calling thread while it lives (tests and benchmarks run
// whole models on the reference this way).
class ScopedConvImpl {
 public:
  explicit ScopedConvImpl(ConvImpl impl);
  ~ScopedConvImpl();
  ScopedConvImpl(const ScopedConvImpl&) = delete;
  ScopedConvImpl& operator=(const ScopedConvImpl&) = delete;

 private:
  ConvImpl saved_;
};

// out = conv(inp, weight) + bias; bias may be nullptr.
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, ConvImpl impl = conv_impl());

// Inference (nothing to differentiate): out = conv(inp, weight) + bias, then max(out, 0) where
// relu. oneDNN runs it as one convolution primitive with the ReLU as a post-op, applied while each
// output block is still in cache instead of in a second pass over out; the reference convolves,
// then clamps. A primitive with a post-op or a bias may be another kernel than conv2d_forward's
// without, so out is conv2d_forward's then relu up to round-off, not promised bitwise.
void conv2d_forward_inference(float* out, const float* inp, const float* weight, const float* bias,
                              const Conv2dShape& s, bool relu, ConvImpl impl = conv_impl());

// dinp = the gradient of the input given dout (written).
void conv2d_backward_data(float* dinp, const float* dout, const float* weight, const Conv2dShape& s,
                          ConvImpl impl = conv_impl());

// dweight and dbias (nullptr: not wanted) = the gradients of the weight and the bias given dout and
// the forward's inp (written).
void conv2d_backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                             const Conv2dShape& s, ConvImpl impl = conv_impl());

// The number of oneDNN primitives the calling thread has cached (one per shape and direction), and
// the number it has created since it started: a training step over shapes seen before creates none.
struct ConvCacheStats {
  int64_t cached = 0;
  int64_t created = 0;
};
ConvCacheStats conv_cache_stats();

// oneDNN's version and the CPU instruction set it dispatches to, e.g. "oneDNN 2.6.3 (avx2)".
std::string onednn_config();

}  // namespace meshtrain::cpu
