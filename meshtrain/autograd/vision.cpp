// The vision ops: operand checks, then one kernel forward and one backward each, the CPU's or, for
// tensors on a device, the device kernel table's. Batch norm keeps its per-channel sums in double
// end to end (statistics, running averages, backward reduction), so a batch split over ranks whose
// sums are exact gives the whole batch's bits; on a device the sums come back to the host, which
// combines them over ranks and forms the per-channel moments, as on the CPU.
#include "meshtrain/autograd/vision.h"

#include <cmath>

#include "meshtrain/autograd/node.h"
#include "meshtrain/autograd/op_checks.h"
#include "meshtrain/tensor/cpu/batch_norm.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/cpu/pool2d.h"
#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::autograd {
namespace {

using detail::check_f32;
using detail::kernels_for;
using detail::ptr_or_null;
using detail::wants;

// A per-channel vector on the host (a device tensor is copied; a host one is used as it is).
Tensor on_host(const Tensor& t) {
  return !t.defined() || t.device().is_cpu() ? t : t.to(Device::cpu());
}

void check_image(const Tensor& x, const char* op) {
  check_f32(x, op, "input");
  MT_CHECK(x.dim() == 4, op, ": input must be [N, C, H, W], got ", shape_str(x.shape()));
}

// A [C] parameter or statistic of a per-channel op (undefined allowed when optional).
void check_channel_vector(const Tensor& t, int64_t C, const char* op, const char* what) {
  check_f32(t, op, what);
  MT_CHECK(t.dim() == 1 && t.size(0) == C, op, ": ", what, " must be [", C, "] for ", C,
           " channels, got ", shape_str(t.shape()));
}

cpu::Pool2dShape pool_shape(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding,
                            const char* op) {
  check_image(x, op);
  if (stride == 0) stride = kernel;
  MT_CHECK(kernel >= 1 && stride >= 1 && padding >= 0, op, ": kernel ", kernel, ", stride ", stride,
           " and padding ", padding, " must be positive (padding non-negative)");
  MT_CHECK(2 * padding <= kernel, op, ": padding ", padding,
           " must be at most half the kernel size ", kernel);
  cpu::Pool2dShape s;
  s.N = x.size(0);
  s.C = x.size(1);
  s.H = x.size(2);
  s.W = x.size(3);
  s.KH = s.KW = kernel;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = padding;
  MT_CHECK(s.H + 2 * padding >= kernel && s.W + 2 * padding >= kernel, op, ": input ",
           shape_str(x.shape()), " padded by ", padding, " is smaller than the ", kernel, "x",
           kernel, " window");
  return s;
}

// The checks of conv2d's operands, shared by its inference form; the shape they describe.
cpu::Conv2dShape conv_shape(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Conv2dOptions& options) {
  check_image(x, "conv2d");
  check_f32(weight, "conv2d", "weight");
  const auto& o = options;
  MT_CHECK(o.stride >= 1 && o.padding >= 0 && o.dilation >= 1 && o.groups >= 1, "conv2d: stride ",
           o.stride, ", padding ", o.padding, ", dilation ", o.dilation, " and groups ", o.groups,
           " must be positive (padding non-negative)");
  MT_CHECK(weight.dim() == 4, "conv2d: weight must be [C_out, C_in / groups, KH, KW], got ",
           shape_str(weight.shape()));
  cpu::Conv2dShape s;
  s.N = x.size(0);
  s.C_in = x.size(1);
  s.H = x.size(2);
  s.W = x.size(3);
  s.C_out = weight.size(0);
  s.KH = weight.size(2);
  s.KW = weight.size(3);
  s.stride_h = s.stride_w = o.stride;
  s.pad_h = s.pad_w = o.padding;
  s.dil_h = s.dil_w = o.dilation;
  s.groups = o.groups;
  MT_CHECK(s.C_in % o.groups == 0 && s.C_out % o.groups == 0, "conv2d: groups ", o.groups,
           " must divide the input channels ", s.C_in, " and the output channels ", s.C_out);
  MT_CHECK(weight.size(1) * o.groups == s.C_in, "conv2d: input ", shape_str(x.shape()), " has ",
           s.C_in, " channels but weight ", shape_str(weight.shape()), " with groups ", o.groups,
           " expects ", weight.size(1) * o.groups);
  MT_CHECK(s.KH >= 1 && s.KW >= 1 && s.C_out >= 1, "conv2d: empty weight ",
           shape_str(weight.shape()));
  MT_CHECK(s.out_h() >= 1 && s.out_w() >= 1, "conv2d: input ", shape_str(x.shape()), " padded by ",
           o.padding, " is smaller than the ", s.KH, "x", s.KW, " kernel dilated by ", o.dilation);
  if (bias.defined()) {
    check_channel_vector(bias, s.C_out, "conv2d", "bias");
  }
  return s;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  const cpu::Conv2dShape s = conv_shape(x, weight, bias, options);
  DeviceKernels* k = kernels_for("conv2d", {&x, &weight, &bias});
  const Device dev = x.device();
  const cpu::ConvImpl impl = cpu::conv_impl();
  Tensor out = Tensor::empty({s.N, s.C_out, s.out_h(), s.out_w()}, DType::f32, dev);
  if (k != nullptr)
    k->conv2d_forward(dev, out.data<float>(), x.data<float>(), weight.data<float>(),
                      ptr_or_null(bias), s);
  else
    cpu::conv2d_forward(out.data<float>(), x.data<float>(), weight.data<float>(), ptr_or_null(bias),
                        s, impl);
  record("conv2d", {x, weight, bias}, out,
         [x = x.detach(), w = weight.detach(), bs = bias.defined() ? bias.shape() : Shape(),
          gx = wants(x), gw = wants(weight), gb = wants(bias), s, impl, k,
          dev](std::vector<Tensor>&& g) {
           Tensor dx = gx ? Tensor::empty(x.shape(), DType::f32, dev) : Tensor();
           Tensor dw = gw ? Tensor::empty(w.shape(), DType::f32, dev) : Tensor();
           Tensor db = gb ? Tensor::empty(bs, DType::f32, dev) : Tensor();
           const float* dout = g[0].data<float>();
           if (dx.defined()) {
             if (k != nullptr)
               k->conv2d_backward_data(dev, dx.data<float>(), dout, w.data<float>(), s);
             else
               cpu::conv2d_backward_data(dx.data<float>(), dout, w.data<float>(), s, impl);
           }
           if (dw.defined() || db.defined()) {
             if (k != nullptr)
               k->conv2d_backward_weights(dev, ptr_or_null(dw), ptr_or_null(db), dout,
                                          x.data<float>(), s);
             else
               cpu::conv2d_backward_weights(ptr_or_null(dw), ptr_or_null(db), dout, x.data<float>(),
                                            s, impl);
           }
           return std::vector<Tensor>{dx, dw, db};
         });
  return out;
}

Tensor conv2d_inference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Conv2dOptions& options, bool relu) {
  const cpu::Conv2dShape s = conv_shape(x, weight, bias, options);
  MT_CHECK(!any_requires_grad({&x, &weight, &bias}),
           "conv2d_inference: records no graph, but an operand requires a gradient (use conv2d, or "
           "turn gradients off)");
  DeviceKernels* k = kernels_for("conv2d_inference", {&x, &weight, &bias});
  const Device dev = x.device();
  Tensor out = Tensor::empty({s.N, s.C_out, s.out_h(), s.out_w()}, DType::f32, dev);
  if (k != nullptr) {
    // No fused form on a device: the convolution, then the ReLU in place.
    k->conv2d_forward(dev, out.data<float>(), x.data<float>(), weight.data<float>(),
                      ptr_or_null(bias), s);
    if (relu) k->relu_forward(dev, out.data<float>(), out.data<float>(), out.numel());
    return out;
  }
  cpu::conv2d_forward_inference(out.data<float>(), x.data<float>(), weight.data<float>(),
                                ptr_or_null(bias), s, relu);
  return out;
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps, const BatchNormReduce& reduce) {
  check_f32(x, "batch_norm", "input");
  MT_CHECK(x.dim() >= 2, "batch_norm: input must be [N, C, ...], got ", shape_str(x.shape()));
  const int64_t N = x.size(0), C = x.size(1);
  int64_t hw = 1;
  for (int64_t d = 2; d < x.dim(); ++d) hw *= x.size(d);
  MT_CHECK(C >= 1, "batch_norm: input ", shape_str(x.shape()), " has no channels");
  if (weight.defined()) check_channel_vector(weight, C, "batch_norm", "weight");
  if (bias.defined()) check_channel_vector(bias, C, "batch_norm", "bias");
  MT_CHECK(running_mean.defined() == running_var.defined(),
           "batch_norm: running_mean and running_var must both be given or both be absent");
  if (running_mean.defined()) {
    check_channel_vector(running_mean, C, "batch_norm", "running_mean");
    check_channel_vector(running_var, C, "batch_norm", "running_var");
  }
  MT_CHECK(training || running_mean.defined(),
           "batch_norm: evaluation needs running_mean and running_var");
  MT_CHECK(eps > 0.0 && momentum >= 0.0 && momentum <= 1.0, "batch_norm: eps ", eps,
           " must be positive and momentum ", momentum, " in [0, 1]");

  DeviceKernels* k = kernels_for("batch_norm", {&x, &weight, &bias, &running_mean, &running_var});
  const Device dev = x.device();
  // Per-channel values live on the host (they are few, and cross ranks there); a device's
  // running statistics are read and written back around the update.
  Tensor mean = Tensor::empty({C}), invstd = Tensor::empty({C});
  int64_t count = N * hw;
  if (training) {
    std::vector<double> sums(static_cast<size_t>(2 * C));
    if (k != nullptr)
      k->batch_norm_statistics(dev, sums.data(), x.data<float>(), N, C, hw);
    else
      cpu::batch_norm_statistics(sums.data(), x.data<float>(), N, C, hw);
    if (reduce.statistics) {
      reduce.statistics(sums, count);
      MT_CHECK(sums.size() == static_cast<size_t>(2 * C), "batch_norm: the statistics reduction ",
               "returned ", sums.size(), " sums for ", C, " channels");
    }
    if (count <= 1)
      MT_THROW(ValueError, "Expected more than 1 value per channel when training, got input size ",
               shape_str(x.shape()), (reduce.statistics ? " (all ranks together: " : " ("), count,
               " value", count == 1 ? "" : "s", " per channel)");
    std::vector<double> var(static_cast<size_t>(C));
    cpu::batch_norm_moments(mean.data<float>(), invstd.data<float>(), var.data(), sums.data(),
                            count, C, eps);
    if (running_mean.defined()) {
      const Tensor rm_host = on_host(running_mean), rv_host = on_host(running_var);
      const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      const double m = momentum;
      float* rm = rm_host.data<float>();
      float* rv = rv_host.data<float>();
      for (int64_t c = 0; c < C; ++c) {
        rm[c] = static_cast<float>((1.0 - m) * rm[c] + m * (sums[c] / static_cast<double>(count)));
        rv[c] = static_cast<float>((1.0 - m) * rv[c] + m * var[c] * unbias);
      }
      if (!running_mean.device().is_cpu()) {
        Tensor(running_mean).copy_(rm_host);
        Tensor(running_var).copy_(rv_host);
      }
    }
  } else {
    const Tensor rm_host = on_host(running_mean), rv_host = on_host(running_var);
    const float* rm = rm_host.data<float>();
    const float* rv = rv_host.data<float>();
    for (int64_t c = 0; c < C; ++c) {
      mean.data<float>()[c] = rm[c];
      invstd.data<float>()[c] =
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(rv[c]) + eps));
    }
  }

  Tensor out = Tensor::empty(x.shape(), DType::f32, dev);
  if (k != nullptr)
    k->batch_norm_apply(dev, out.data<float>(), x.data<float>(), mean.data<float>(),
                        invstd.data<float>(), ptr_or_null(weight), ptr_or_null(bias), N, C, hw);
  else
    cpu::batch_norm_apply(out.data<float>(), x.data<float>(), mean.data<float>(),
                          invstd.data<float>(), ptr_or_null(weight), ptr_or_null(bias), N, C, hw);
  record(
      "batch_norm", {x, weight, bias}, out,
      [x = x.detach(), w = weight.detach(), mean, invstd, count, training,
       gradients = reduce.gradients, gx = wants(x), gw = wants(weight), gb = wants(bias), N, C, hw,
       k, dev](std::vector<Tensor>&& g) {
        const float* dout = g[0].data<float>();
        // Evaluation's input gradient needs no sums: the statistics were constants.
        std::vector<double> sums(static_cast<size_t>(2 * C));
        if (gw || gb || (gx && training)) {
          if (k != nullptr)
            k->batch_norm_backward_reduce(dev, sums.data(), dout, x.data<float>(),
                                          mean.data<float>(), invstd.data<float>(), N, C, hw);
          else
            cpu::batch_norm_backward_reduce(sums.data(), dout, x.data<float>(), mean.data<float>(),
                                            invstd.data<float>(), N, C, hw);
        }
        // The parameters' gradients are this rank's own sums, taken before the reduction.
        Tensor dw = gw ? Tensor::empty({C}) : Tensor();
        Tensor db = gb ? Tensor::empty({C}) : Tensor();
        for (int64_t c = 0; c < C; ++c) {
          if (gw) dw.data<float>()[c] = static_cast<float>(sums[static_cast<size_t>(C + c)]);
          if (gb) db.data<float>()[c] = static_cast<float>(sums[static_cast<size_t>(c)]);
        }
        if (!dev.is_cpu()) {
          if (gw) dw = dw.to(dev);
          if (gb) db = db.to(dev);
        }
        Tensor dx;
        if (gx) {
          if (training && gradients) {
            gradients(sums);
            MT_CHECK(sums.size() == static_cast<size_t>(2 * C), "batch_norm: the gradient ",
                     "reduction returned ", sums.size(), " sums for ", C, " channels");
          }
          dx = Tensor::empty(x.shape(), DType::f32, dev);
          if (k != nullptr)
            k->batch_norm_backward_apply(dev, dx.data<float>(), dout, x.data<float>(),
                                         mean.data<float>(), invstd.data<float>(), ptr_or_null(w),
                                         training ? sums.data() : nullptr, count, N, C, hw);
          else
            cpu::batch_norm_backward_apply(dx.data<float>(), dout, x.data<float>(),
                                           mean.data<float>(), invstd.data<float>(), ptr_or_null(w),
                                           training ? sums.data() : nullptr, count, N, C, hw);
        }
        return std::vector<Tensor>{dx, dw, db};
      });
  return out;
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  const cpu::Pool2dShape s = pool_shape(x, kernel, stride, padding, "max_pool2d");
  DeviceKernels* k = kernels_for("max_pool2d", {&x});
  const Device dev = x.device();
  Tensor out = Tensor::empty({s.N, s.C, s.out_h(), s.out_w()}, DType::f32, dev);
  const bool grad = any_requires_grad({&x});
  Tensor argmax = grad ? Tensor::empty(out.shape(), DType::i32, dev) : Tensor();
  int32_t* at = grad ? argmax.data<int32_t>() : nullptr;
  if (k != nullptr)
    k->max_pool2d_forward(dev, out.data<float>(), at, x.data<float>(), s);
  else
    cpu::max_pool2d_forward(out.data<float>(), at, x.data<float>(), s);
  record("max_pool2d", {x}, out, [argmax, xs = x.shape(), s, k, dev](std::vector<Tensor>&& g) {
    Tensor dx = Tensor::zeros(xs, DType::f32, dev);
    if (k != nullptr)
      k->max_pool2d_backward(dev, dx.data<float>(), g[0].data<float>(), argmax.data<int32_t>(), s);
    else
      cpu::max_pool2d_backward(dx.data<float>(), g[0].data<float>(), argmax.data<int32_t>(), s);
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding,
                  bool count_include_pad) {
  const cpu::Pool2dShape s = pool_shape(x, kernel, stride, padding, "avg_pool2d");
  DeviceKernels* k = kernels_for("avg_pool2d", {&x});
  const Device dev = x.device();
  Tensor out = Tensor::empty({s.N, s.C, s.out_h(), s.out_w()}, DType::f32, dev);
  if (k != nullptr)
    k->avg_pool2d_forward(dev, out.data<float>(), x.data<float>(), s, count_include_pad);
  else
    cpu::avg_pool2d_forward(out.data<float>(), x.data<float>(), s, count_include_pad);
  record("avg_pool2d", {x}, out,
         [xs = x.shape(), s, count_include_pad, k, dev](std::vector<Tensor>&& g) {
           Tensor dx = Tensor::zeros(xs, DType::f32, dev);
           if (k != nullptr)
             k->avg_pool2d_backward(dev, dx.data<float>(), g[0].data<float>(), s,
                                    count_include_pad);
           else
             cpu::avg_pool2d_backward(dx.data<float>(), g[0].data<float>(), s, count_include_pad);
           return std::vector<Tensor>{dx};
         });
  return out;
}

Tensor global_avg_pool(const Tensor& x) {
  check_image(x, "global_avg_pool");
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  MT_CHECK(HW >= 1, "global_avg_pool: input ", shape_str(x.shape()), " has no pixels");
  DeviceKernels* k = kernels_for("global_avg_pool", {&x});
  const Device dev = x.device();
  Tensor out = Tensor::empty({N, C}, DType::f32, dev);
  if (k != nullptr)
    k->global_avg_pool_forward(dev, out.data<float>(), x.data<float>(), N, C, HW);
  else
    cpu::global_avg_pool_forward(out.data<float>(), x.data<float>(), N, C, HW);
  record("global_avg_pool", {x}, out, [xs = x.shape(), N, C, HW, k, dev](std::vector<Tensor>&& g) {
    Tensor dx = Tensor::zeros(xs, DType::f32, dev);
    if (k != nullptr)
      k->global_avg_pool_backward(dev, dx.data<float>(), g[0].data<float>(), N, C, HW);
    else
      cpu::global_avg_pool_backward(dx.data<float>(), g[0].data<float>(), N, C, HW);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace meshtrain::autograd
