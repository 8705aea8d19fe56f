#include "meshtrain/autograd/linear_cross_entropy.h"

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/node.h"
#include "meshtrain/autograd/op_checks.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/cpu/cross_entropy.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::autograd {
namespace {

using detail::check_f32;
using detail::kernels_for;
using detail::wants;

// Under bf16 both paths take the gradient of the mean loss while the logits are at hand, in the
// forward: (softmax - onehot) / count, rounded once to bf16, written over the logits (which
// nothing else reads), so the logits are read once for loss and gradient. The incoming gradient
// of the loss is then the alpha of the backward's two products (exact for a power of two, such as
// a loss scale over a power-of-two number of micro-batches: the bits of scaling before rounding).
// f16 cannot round first: its range ends at 6e-8, and a GPT row's probabilities over a batch's
// count (2e-5 / 8192 at GPT-2's) are 2e-9, which round to zero before the loss scale that exists
// to keep them could reach them. Under f16 the backward writes (softmax - onehot) * dloss / count
// and rounds that, as PyTorch's autocast rounds the f32 cross-entropy's gradient: the logits are
// read a second time.
bool scales_before_rounding(DType half) {
  return half == DType::f16;
}

// The CPU's emulation: the products of linear_half (rounded operands, f32 GEMM), the logits
// rounded and kept packed; the cross-entropy on their widened values.
Tensor half_on_cpu(const Tensor& h, const Tensor& weight, const Tensor& targets,
                   int32_t ignore_index, DType half) {
  const int64_t C = weight.size(1), V = weight.size(0), N = rows_of(h.shape());
  const Tensor xh = h.dtype() == half ? h.detach() : pack_half(h, half);
  const Tensor wh = half_weight(weight, half);
  Tensor logits = Tensor::empty({N, V});
  cpu::linear_forward(logits.data<float>(), unpack_half(xh).data<float>(),
                      unpack_half(wh).data<float>(), nullptr, N, C, V);
  logits = unpack_half(pack_half(logits, half));  // the rounded values, the f32 product freed
  Tensor lse = Tensor::empty({N}), losses = Tensor::empty({N});
  const float mean =
      cpu::cross_entropy_forward(losses.data<float>(), lse.data<float>(), logits.data<float>(),
                                 targets.data<int32_t>(), N, V, ignore_index, 0.0f);
  const bool gx = wants(h), gw = wants(weight), later = scales_before_rounding(half);
  // The gradient rounded to the half type (bf16), or the rounded logits to take it from (f16).
  Tensor dh;
  if ((gx || gw) && !later) {
    cpu::cross_entropy_backward(logits.data<float>(), logits.data<float>(), lse.data<float>(),
                                targets.data<int32_t>(), 1.0f, N, V, ignore_index, 0.0f);
  }
  if (gx || gw) dh = pack_half(logits, half);
  logits = Tensor();
  Tensor out = Tensor::scalar(mean);
  record(
      "linear_cross_entropy", {h, weight}, out,
      [xh = gw ? xh : Tensor(), wh = gx ? wh : Tensor(), dh, lse = later ? lse : Tensor(),
       targets = later ? targets : Tensor(), hs = h.shape(), hdt = h.dtype(), ws = weight.shape(),
       gx, gw, N, V, C, later, ignore_index, half](std::vector<Tensor>&& g) {
        float alpha = scalar_gradient_value(g[0]);
        Tensor dout = unpack_half(dh);
        if (later) {
          cpu::cross_entropy_backward(dout.data<float>(), dout.data<float>(), lse.data<float>(),
                                      targets.data<int32_t>(), alpha, N, V, ignore_index, 0.0f);
          dout = unpack_half(pack_half(dout, half));
          alpha = 1.0f;
        }
        Tensor dx = gx ? Tensor::empty(hs) : Tensor();
        Tensor dw = gw ? Tensor::empty(ws) : Tensor();
        if (dx.defined())
          cpu::matmul(dx.data<float>(), dout.data<float>(), unpack_half(wh).data<float>(), N, C, V,
                      false, false, alpha, 0.0f);
        if (dw.defined())
          cpu::matmul(dw.data<float>(), dout.data<float>(), unpack_half(xh).data<float>(), V, C, N,
                      true, false, alpha, 0.0f);
        // A hidden state given in half gets its gradient in half.
        if (dx.defined() && hdt != DType::f32) dx = pack_half(dx, hdt);
        return std::vector<Tensor>{dx, dw};
      });
  return out;
}

// On a device: the half GEMM rounds the logits on the way out, and the cross-entropy reads them
// and writes their gradient over them (under f16 in the backward); nothing of the logits' size is
// ever f32.
Tensor half_on_device(DeviceKernels& k, const Tensor& h, const Tensor& weight,
                      const Tensor& targets, int32_t ignore_index, DType half) {
  const Device dev = h.device();
  const int64_t C = weight.size(1), V = weight.size(0), N = rows_of(h.shape());
  const Tensor xh = h.detach().to(half), wh = half_weight(weight, half);
  Tensor lh = Tensor::empty({N, V}, half, dev);
  k.matmul_half(dev, lh.data_ptr(), half, xh.data_ptr(), wh.data_ptr(), half, nullptr, 1, N, V, C,
                false, true, 0, 0, nullptr, 1.0f);
  Tensor losses = Tensor::empty({N}, DType::f32, dev);
  Tensor lse = Tensor::empty({N}, DType::f32, dev);
  Tensor out = Tensor::empty({}, DType::f32, dev);
  const bool gx = wants(h), gw = wants(weight), later = scales_before_rounding(half);
  k.cross_entropy_forward(dev, losses.data<float>(), lse.data<float>(), out.data<float>(),
                          lh.data_ptr(), half, targets.data<int32_t>(), N, V, ignore_index,
                          (gx || gw) && !later ? lh.data_ptr() : nullptr, 0.0f);
  record(
      "linear_cross_entropy", {h, weight}, out,
      [xh = gw ? xh : Tensor(), wh = gx ? wh : Tensor(), lh, lse = later ? lse : Tensor(),
       targets = later ? targets : Tensor(), hs = h.shape(), hdt = h.dtype(), ws = weight.shape(),
       gx, gw, N, V, C, half, later, ignore_index, &k, dev](std::vector<Tensor>&& g) {
        Tensor dh = lh;
        float dloss = 1.0f;
        if (later) {
          // The incoming gradient is read where it lies: no wait for the device.
          const Tensor seed = g[0].device() == dev ? g[0] : g[0].to(dev);
          if (!may_overwrite_saved(lh)) dh = Tensor::empty({N, V}, half, dev);
          k.cross_entropy_backward(dev, dh.data_ptr(), lh.data_ptr(), half, lse.data<float>(),
                                   targets.data<int32_t>(), seed.data<float>(), N, V, ignore_index,
                                   0.0f);
        } else {
          dloss = scalar_gradient_value(g[0]);
        }
        // A hidden state given in half gets its gradient in half.
        Tensor dx = gx ? Tensor::empty(hs, hdt, dev) : Tensor();
        Tensor dw = gw ? Tensor::empty(ws, DType::f32, dev) : Tensor();
        if (dx.defined())
          k.matmul_half(dev, dx.data_ptr(), hdt, dh.data_ptr(), wh.data_ptr(), half, nullptr, 1, N,
                        C, V, false, false, 0, 0, nullptr, dloss);
        if (dw.defined())
          k.matmul_half(dev, dw.data<float>(), DType::f32, dh.data_ptr(), xh.data_ptr(), half,
                        nullptr, 1, V, C, N, true, false, 0, 0, nullptr, dloss);
        return std::vector<Tensor>{dx, dw};
      });
  return out;
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& h, const Tensor& weight, const Tensor& targets,
                            int32_t ignore_index) {
  // Under autocast h may come rounded to its type already (the final norm's out_type).
  if (!is_autocast_half(h)) check_f32(h, "linear_cross_entropy", "hidden state");
  check_f32(weight, "linear_cross_entropy", "weight");
  MT_CHECK(targets.defined() && targets.dtype() == DType::i32,
           "linear_cross_entropy: targets must be an i32 tensor, got ", targets.str());
  MT_CHECK(weight.dim() == 2 && h.dim() >= 1 && h.size(-1) == weight.size(1),
           "linear_cross_entropy: hidden state ", shape_str(h.shape()), " does not match weight ",
           shape_str(weight.shape()));
  const int64_t N = rows_of(h.shape());
  MT_CHECK(targets.numel() == N, "linear_cross_entropy: ", targets.numel(), " targets for ", N,
           " rows of hidden state ", shape_str(h.shape()));
  const Tensor t = targets.view({N});
  if (!autocast_enabled())
    return cross_entropy(reshape(linear(h, weight, Tensor()), {N, weight.size(0)}), t,
                         ignore_index);
  DeviceKernels* k = kernels_for("linear_cross_entropy", {&h, &weight, &targets});
  return k == nullptr ? half_on_cpu(h, weight, t, ignore_index, autocast_dtype())
                      : half_on_device(*k, h, weight, t, ignore_index, autocast_dtype());
}

}  // namespace meshtrain::autograd
