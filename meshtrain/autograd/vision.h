// Differentiable layer operations of convolutional networks (ResNet): convolution, batch
// normalisation, pooling, on NCHW tensors. Like functional.h, each calls one fused kernel forward
// and one backward and checks its operands, naming what is wrong: the CPU's (oneDNN for the
// convolutions), or for tensors on a device that device's kernel table (tensor/device_kernels.h;
// on cuda, cuDNN's convolutions and kernels of meshtrain/cuda/kernels/vision.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

// PyTorch's F.conv2d arguments (the same in both spatial dimensions).
struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;  // zeros on every side
  int64_t dilation = 1;
  int64_t groups = 1;
};

// x[N, C_in, H, W] convolved with weight[C_out, C_in / groups, KH, KW] (PyTorch's layout) plus
// bias[C_out] (may be undefined) -> [N, C_out, OH, OW]. Runs on the implementation that
// cpu::conv_impl() names when called (oneDNN unless a cpu::ScopedConvImpl says otherwise); its
// backward uses the same one.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options = {});

// relu(conv2d(x, weight, bias)) (without relu: conv2d) for inference: one oneDNN convolution with
// the ReLU as a post-op (cpu::conv2d_forward_inference), equal to conv2d then relu up to the
// round-off of the convolution's sums. Records no graph, so an operand that requires a gradient
// (grad mode on) is refused.
Tensor conv2d_inference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Conv2dOptions& options, bool relu);

// How a training-mode batch_norm combines its per-channel sums with other ranks' (see
// nn/batch_norm_sync.h, which is built on this). An empty member means "this rank alone".
//   statistics: sums = [sum x (C), sum x^2 (C)] and count = values per channel of this rank, to be
//               replaced in place by the totals over the ranks.
//   gradients:  sums = [sum dy (C), sum dy * xhat (C)] of this rank, replaced by the totals. Called
//               only when the input needs a gradient (the same on every rank of a model).
struct BatchNormReduce {
  std::function<void(std::vector<double>& sums, int64_t& count)> statistics;
  std::function<void(std::vector<double>& sums)> gradients;
};

// Batch normalisation of x[N, C, ...] per channel over N and the trailing dimensions, then
// * weight[C] + bias[C] (either may be undefined: 1 and 0).
// training: normalises with the batch's mean and biased variance (through `reduce`), and, when
//   running_mean / running_var [C] are defined, moves them towards the batch's mean and unbiased
//   variance: running = (1 - momentum) * running + momentum * batch. Fewer than 2 values per
//   channel (over all ranks) is a ValueError, as in PyTorch.
// evaluation: normalises with running_mean and running_var (both required); no reduction.
// The gradients of weight and bias are this rank's own sums (data parallelism averages them); the
// input gradient uses the totals.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5, const BatchNormReduce& reduce = {});

// Max pooling of x[N, C, H, W] over kernel x kernel windows; stride 0 means stride = kernel
// (PyTorch's stride=None); padding at most kernel / 2. The gradient goes to the first maximum.
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0);

// Average pooling with the same windows; count_include_pad as in PyTorch.
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0,
                  bool count_include_pad = true);

// Global average pooling: x[N, C, H, W] -> [N, C] (PyTorch's adaptive_avg_pool2d(x, 1) + flatten).
Tensor global_avg_pool(const Tensor& x);

}  // namespace meshtrain::autograd
