#include "meshtrain/autograd/functional.h"

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/node.h"
#include "meshtrain/autograd/op_checks.h"
#include "meshtrain/tensor/cpu/attention.h"
#include "meshtrain/tensor/cpu/cross_entropy.h"
#include "meshtrain/tensor/cpu/dropout.h"
#include "meshtrain/tensor/cpu/elementwise.h"
#include "meshtrain/tensor/cpu/embedding.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/layer_norm.h"
#include "meshtrain/tensor/cpu/reduce.h"
#include "meshtrain/tensor/cpu/relu.h"
#include "meshtrain/tensor/cpu/softmax.h"
#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::autograd {
namespace {

using detail::check_cpu_only;
using detail::check_f32;
using detail::kernels_for;
using detail::ptr_or_null;
using detail::wants;
using detail::with_residual;

void check_i32(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.defined() && t.dtype() == DType::i32, op, ": ", what, " must be an i32 tensor, got ",
           t.str());
}

// The output type an op with an out_type takes: f32, or autocast's (output_type_for).
void check_out_type(DType out_type, const char* op) {
  MT_CHECK(out_type == DType::f32 || out_type == autocast_dtype(), op,
           ": the output is f32, or under autocast its type; got ", dtype_name(out_type),
           " with autocast ", dtype_name(autocast_dtype()));
}

// An f32 view of a value that may be in autocast's half type (a half activation, its gradient).
Tensor widened(const Tensor& t) {
  return t.dtype() == DType::f32 ? t : t.to(DType::f32);
}

// `v` (f32) as a tensor of type `dtype`: the gradient of a half activation is half.
Tensor narrowed(Tensor v, DType dtype) {
  return dtype == DType::f32 ? v : v.to(dtype);
}

// linear() under autocast: see autocast.h. The operands backward needs are kept in the half
// type; the bias gradient is the f32 column sum of the gradient the products take (rounded to
// the half type, as PyTorch's autocast hands its linear a half gradient), not a product. An
// output of out_type half is the f32 one rounded once; an input given in half gets its gradient
// in half.
Tensor linear_half(const Tensor& x, const Tensor& weight, const Tensor& bias, DType half,
                   DType out_type, const Tensor& residual) {
  const int64_t cin = weight.size(1), cout = weight.size(0), bt = rows_of(x.shape());
  Shape out_shape = x.shape();
  out_shape.back() = cout;
  Tensor out = Tensor::empty(out_shape);
  Tensor xh = x.dtype() == half ? x.detach() : pack_half(x, half), wh = half_weight(weight, half);
  cpu::linear_forward(out.data<float>(), unpack_half(xh).data<float>(),
                      unpack_half(wh).data<float>(), ptr_or_null(bias), bt, cin, cout);
  if (residual.defined())
    cpu::add(out.data<float>(), residual.data<float>(), out.data<float>(), out.numel());
  if (out_type != DType::f32) out = pack_half(out, out_type);
  const bool gx = wants(x), gw = wants(weight), gb = wants(bias);
  record(residual.defined() ? "linear_residual" : "linear",
         with_residual({x, weight, bias}, residual), out,
         [xh = gw ? xh : Tensor(), wh = gx ? wh : Tensor(), xs = x.shape(), xdt = x.dtype(),
          ws = weight.shape(), bs = bias.defined() ? bias.shape() : Shape(), gx, gw, gb, bt, cin,
          cout, half, with = residual.defined()](std::vector<Tensor>&& g) {
           const Tensor dout = g[0].dtype() == half ? unpack_half(g[0]) : round_to(g[0], half);
           // The residual's gradient is the output's, as it came. Otherwise the f32 gradient goes
           // once its rounded copy exists; not rounded in place: another node may hold the same
           // gradient (an addition's two operands).
           const Tensor dres = with ? g[0] : Tensor();
           g[0] = Tensor();
           Tensor dx = gx ? Tensor::empty(xs) : Tensor();
           Tensor dw = gw ? Tensor::empty(ws) : Tensor();
           Tensor db = gb ? Tensor::empty(bs) : Tensor();
           if (dx.defined())
             cpu::matmul(dx.data<float>(), dout.data<float>(), unpack_half(wh).data<float>(), bt,
                         cin, cout, false, false, 1.0f, 0.0f);
           if (dw.defined())
             cpu::matmul(dw.data<float>(), dout.data<float>(), unpack_half(xh).data<float>(), cout,
                         cin, bt, true, false, 1.0f, 0.0f);
           if (db.defined())
             cpu::sum_first_dim(db.data<float>(), dout.data<float>(), bt, cout, false);
           if (dx.defined() && xdt != DType::f32) dx = pack_half(dx, xdt);
           return with_residual({dx, dw, db}, dres, with);
         });
  return out;
}

// linear() under autocast on a device: the operands are cast to the half type on the device and
// multiplied by a half-precision GEMM with f32 accumulation and output, which is what the CPU
// path emulates (same roundings, same kept operands). A half output and a half input's gradient
// are written by their products directly.
Tensor linear_half_device(DeviceKernels& k, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, DType half, DType out_type, const Tensor& residual) {
  const Device dev = x.device();
  const int64_t cin = weight.size(1), cout = weight.size(0), bt = rows_of(x.shape());
  Shape out_shape = x.shape();
  out_shape.back() = cout;
  Tensor out = Tensor::empty(out_shape, out_type, dev);
  const Tensor xh = x.dtype() == half ? x.detach() : x.to(half), wh = half_weight(weight, half);
  k.matmul_half(dev, out.data_ptr(), out_type, xh.data_ptr(), wh.data_ptr(), half,
                ptr_or_null(bias), 1, bt, cout, cin, false, true, 0, 0, ptr_or_null(residual),
                1.0f);
  const bool gx = wants(x), gw = wants(weight), gb = wants(bias);
  record(residual.defined() ? "linear_residual" : "linear",
         with_residual({x, weight, bias}, residual), out,
         [xh = gw ? xh : Tensor(), wh = gx ? wh : Tensor(), xs = x.shape(), xdt = x.dtype(),
          ws = weight.shape(), bs = bias.defined() ? bias.shape() : Shape(), gx, gw, gb, bt, cin,
          cout, half, &k, dev, with = residual.defined()](std::vector<Tensor>&& g) {
           // The half copy the gradient's last summand rounded where it wrote it, or a cast.
           const Tensor given = incoming_half_gradient(0, half);
           const Tensor dout = given.defined() ? given : g[0].to(half);
           // The residual's gradient is the output's, as it came; otherwise an f32 gradient goes
           // once its half copy exists.
           const Tensor dres = with ? g[0] : Tensor();
           g[0] = Tensor();
           Tensor dx = gx ? Tensor::empty(xs, xdt, dev) : Tensor();
           Tensor dw = gw ? Tensor::empty(ws, DType::f32, dev) : Tensor();
           Tensor db = gb ? Tensor::empty(bs, DType::f32, dev) : Tensor();
           if (dx.defined())
             k.matmul_half(dev, dx.data_ptr(), xdt, dout.data_ptr(), wh.data_ptr(), half, nullptr,
                           1, bt, cin, cout, false, false, 0, 0, nullptr, 1.0f);
           if (dw.defined() || db.defined())
             k.weight_grad_half(dev, ptr_or_null(dw), ptr_or_null(db), dout.data_ptr(),
                                gw ? xh.data_ptr() : nullptr, half, bt, cin, cout, 1.0f);
           return with_residual({dx, dw, db}, dres, with);
         });
  return out;
}

// linear(), and residual + linear() where residual is defined (f32, the output's shape).
Tensor linear_into(const Tensor& x, const Tensor& weight, const Tensor& bias, DType out_type,
                   const Tensor& residual) {
  // Under autocast the input may come rounded already (gelu's out_type).
  if (!is_autocast_half(x)) check_f32(x, "linear", "input");
  check_out_type(out_type, "linear");
  check_f32(weight, "linear", "weight");
  MT_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ",
           shape_str(x.shape()), " does not match weight ", shape_str(weight.shape()));
  if (bias.defined()) {
    check_f32(bias, "linear", "bias");
    MT_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias ",
             shape_str(bias.shape()), " does not match weight ", shape_str(weight.shape()));
  }
  DeviceKernels* k = kernels_for("linear", {&x, &weight, &bias, &residual});
  if (autocast_enabled()) {
    const DType half = autocast_dtype();
    return k == nullptr ? linear_half(x, weight, bias, half, out_type, residual)
                        : linear_half_device(*k, x, weight, bias, half, out_type, residual);
  }
  const Device dev = x.device();
  const int64_t cin = weight.size(1), cout = weight.size(0), bt = rows_of(x.shape());
  Shape out_shape = x.shape();
  out_shape.back() = cout;
  Tensor out = Tensor::empty(out_shape, DType::f32, dev);
  if (k != nullptr) {
    k->linear_forward(dev, out.data<float>(), x.data<float>(), weight.data<float>(),
                      ptr_or_null(bias), bt, cin, cout, ptr_or_null(residual));
  } else {
    cpu::linear_forward(out.data<float>(), x.data<float>(), weight.data<float>(), ptr_or_null(bias),
                        bt, cin, cout);
    if (residual.defined())
      cpu::add(out.data<float>(), residual.data<float>(), out.data<float>(), out.numel());
  }
  record(residual.defined() ? "linear_residual" : "linear",
         with_residual({x, weight, bias}, residual), out,
         [x = x.detach(), w = weight.detach(), b = bias, gx = wants(x), gw = wants(weight),
          gb = wants(bias), bt, cin, cout, k, dev,
          with = residual.defined()](std::vector<Tensor>&& g) {
           // Fresh gradient buffers are written with beta = 0 GEMMs instead of being zero-filled
           // and accumulated into: the memsets cost a few percent of a small model's step.
           const float* dout = g[0].data<float>();
           Tensor dx = gx ? Tensor::empty(x.shape(), DType::f32, dev) : Tensor();
           Tensor dw = gw ? Tensor::empty(w.shape(), DType::f32, dev) : Tensor();
           Tensor db = gb && b.defined() ? Tensor::empty(b.shape(), DType::f32, dev) : Tensor();
           if (k != nullptr) {
             k->linear_backward(dev, ptr_or_null(dx), ptr_or_null(dw), ptr_or_null(db), dout,
                                x.data<float>(), w.data<float>(), bt, cin, cout);
             return with_residual({dx, dw, db}, g[0], with);
           }
           if (dx.defined())
             cpu::matmul(dx.data<float>(), dout, w.data<float>(), bt, cin, cout, false, false, 1.0f,
                         0.0f);
           if (dw.defined())
             cpu::matmul(dw.data<float>(), dout, x.data<float>(), cout, cin, bt, true, false, 1.0f,
                         0.0f);
           if (db.defined()) cpu::sum_first_dim(db.data<float>(), dout, bt, cout, false);
           return with_residual({dx, dw, db}, g[0], with);
         });
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType out_type) {
  return linear_into(x, weight, bias, out_type, Tensor());
}

Tensor linear_residual(const Tensor& residual, const Tensor& x, const Tensor& weight,
                       const Tensor& bias) {
  check_f32(residual, "linear_residual", "residual");
  MT_CHECK(weight.dim() == 2 && x.dim() >= 1, "linear_residual: input ", shape_str(x.shape()),
           ", weight ", shape_str(weight.shape()));
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  MT_CHECK(residual.shape() == out_shape, "linear_residual: residual ", shape_str(residual.shape()),
           " is not the output's shape ", shape_str(out_shape));
  return linear_into(x, weight, bias, DType::f32, residual);
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  DType out_type) {
  check_f32(x, "layer_norm", "input");
  check_out_type(out_type, "layer_norm");
  const int64_t C = x.size(-1), N = rows_of(x.shape());
  if (weight.defined()) {
    check_f32(weight, "layer_norm", "weight");
    MT_CHECK(weight.numel() == C, "layer_norm: weight ", shape_str(weight.shape()),
             " does not match input ", shape_str(x.shape()));
  }
  if (bias.defined()) {
    check_f32(bias, "layer_norm", "bias");
    MT_CHECK(bias.numel() == C, "layer_norm: bias ", shape_str(bias.shape()),
             " does not match input ", shape_str(x.shape()));
  }
  DeviceKernels* k = kernels_for("layer_norm", {&x, &weight, &bias});
  const Device dev = x.device();
  // The CPU computes in f32 and packs a half output afterwards.
  Tensor out = Tensor::empty(x.shape(), k != nullptr ? out_type : DType::f32, dev);
  const bool grad = any_requires_grad({&x, &weight, &bias});
  Tensor mean = grad ? Tensor::empty({N}, DType::f32, dev) : Tensor();
  Tensor rstd = grad ? Tensor::empty({N}, DType::f32, dev) : Tensor();
  if (k != nullptr) {
    k->layer_norm_forward(dev, out.data_ptr(), out_type, ptr_or_null(mean), ptr_or_null(rstd),
                          x.data<float>(), ptr_or_null(weight), ptr_or_null(bias), N, C, eps);
  } else {
    cpu::layer_norm_forward(out.data<float>(), ptr_or_null(mean), ptr_or_null(rstd),
                            x.data<float>(), ptr_or_null(weight), ptr_or_null(bias), N, C, eps);
    if (out_type != DType::f32) out = pack_half(out, out_type);
  }
  record(
      "layer_norm", {x, weight, bias}, out,
      [x = x.detach(), w = weight.detach(), b = bias.detach(), mean, rstd, gx = wants(x),
       gw = wants(weight), gb = wants(bias), N, C, k, dev,
       half = autocast_dtype()](std::vector<Tensor>&& g) {
        // The input's gradient is added to the one summed for it already where there is one
        // (a residual stream's: the norm's input is also the stream), else written afresh.
        Tensor into = gx ? pending_input_gradient(0, x.shape(), dev) : Tensor();
        const bool accumulate = into.defined();
        Tensor dx = accumulate ? into : gx ? Tensor::empty(x.shape(), DType::f32, dev) : Tensor();
        // The device writes the parameter gradients; the CPU's kernel adds to zeros.
        auto param_grad = [&](const Tensor& t, bool needed) {
          if (!needed || !t.defined()) return Tensor();
          return k != nullptr ? Tensor::empty(t.shape(), DType::f32, dev)
                              : Tensor::zeros(t.shape(), DType::f32, dev);
        };
        Tensor dw = param_grad(w, gw), db = param_grad(b, gb);
        if (k != nullptr) {
          // Under autocast the input's gradient (a residual stream's, summed) goes next to the
          // product that wrote the input (an output projection), which rounds it for its own
          // products: it is rounded here, where it is written, instead of cast there.
          Tensor dx_half =
              gx && half != DType::f32 ? Tensor::empty(x.shape(), half, dev) : Tensor();
          k->layer_norm_backward(dev, ptr_or_null(dx), ptr_or_null(dw), ptr_or_null(db),
                                 g[0].data_ptr(), g[0].dtype(), x.data<float>(), ptr_or_null(w),
                                 mean.data<float>(), rstd.data<float>(), N, C, accumulate,
                                 dx_half.defined() ? dx_half.data_ptr() : nullptr, half);
          if (dx_half.defined()) offer_half_gradient(0, dx, std::move(dx_half));
        } else {
          cpu::layer_norm_backward(ptr_or_null(dx), ptr_or_null(dw), ptr_or_null(db),
                                   widened(g[0]).data<float>(), x.data<float>(), ptr_or_null(w),
                                   mean.data<float>(), rstd.data<float>(), N, C, accumulate);
        }
        return std::vector<Tensor>{accumulate ? Tensor() : dx, dw, db};
      });
  return out;
}

Tensor gelu(const Tensor& x, DType out_type) {
  const bool half_in = is_autocast_half(x);
  if (!half_in) check_f32(x, "gelu", "input");
  check_out_type(out_type, "gelu");
  DeviceKernels* k = kernels_for("gelu", {&x});
  const Device dev = x.device();
  const int64_t n = x.numel();
  // The CPU computes in f32 and packs a half output afterwards.
  Tensor out = Tensor::empty(x.shape(), k != nullptr ? out_type : DType::f32, dev);
  // Under autocast GELU reads its input rounded to the half type (what it gets from a half
  // product under PyTorch's autocast) and keeps it so: half the bytes of the MLP's widest
  // activation until backward. An input handed over in that type is that copy already.
  Tensor saved;
  if (autocast_enabled() && !half_in) {
    const DType half = autocast_dtype();
    if (k != nullptr) {
      saved = Tensor::empty(x.shape(), half, dev);
      k->gelu_forward_half(dev, out.data_ptr(), out_type, saved.data_ptr(), x.data<float>(), half,
                           n);
    } else {
      saved = pack_half(x, half);
      cpu::gelu_forward(out.data<float>(), unpack_half(saved).data<float>(), n);
    }
  } else {
    saved = x.detach();
    if (k != nullptr) {
      k->gelu_forward(dev, out.data_ptr(), out_type, x.data_ptr(), x.dtype(), n);
    } else {
      cpu::gelu_forward(out.data<float>(), widened(x).data<float>(), n);
    }
  }
  if (k == nullptr && out_type != DType::f32) out = pack_half(out, out_type);
  record("gelu", {x}, out, [saved, xdt = x.dtype(), k, dev, n](std::vector<Tensor>&& g) {
    // The gradient has the input's type (f32, or half for an input handed over in half).
    if (k != nullptr) {
      Tensor dx = Tensor::empty(saved.shape(), xdt, dev);
      k->gelu_backward(dev, dx.data_ptr(), xdt, saved.data_ptr(), saved.dtype(), g[0].data_ptr(),
                       g[0].dtype(), n);
      return std::vector<Tensor>{dx};
    }
    Tensor dx = Tensor::empty(saved.shape());
    cpu::gelu_backward(dx.data<float>(), widened(saved).data<float>(), widened(g[0]).data<float>(),
                       n);
    return std::vector<Tensor>{narrowed(dx, xdt)};
  });
  return out;
}

Tensor relu(const Tensor& x) {
  check_f32(x, "relu", "input");
  DeviceKernels* k = kernels_for("relu", {&x});
  const Device dev = x.device();
  Tensor out = Tensor::empty(x.shape(), DType::f32, dev);
  if (k != nullptr)
    k->relu_forward(dev, out.data<float>(), x.data<float>(), x.numel());
  else
    cpu::relu_forward(out.data<float>(), x.data<float>(), x.numel());
  record("relu", {x}, out, [o = out.detach(), k, dev](std::vector<Tensor>&& g) {
    Tensor dx = Tensor::empty(o.shape(), DType::f32, dev);
    if (k != nullptr)
      k->relu_backward(dev, dx.data<float>(), g[0].data<float>(), o.data<float>(), o.numel());
    else
      cpu::relu_backward(dx.data<float>(), g[0].data<float>(), o.data<float>(), o.numel());
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor softmax(const Tensor& x) {
  check_f32(x, "softmax", "input");
  check_cpu_only(x, "softmax");
  const int64_t C = x.size(-1), N = rows_of(x.shape());
  Tensor out = Tensor::empty(x.shape());
  cpu::softmax_forward(out.data<float>(), x.data<float>(), N, C);
  record("softmax", {x}, out, [o = out.detach(), N, C](std::vector<Tensor>&& g) {
    Tensor dx = Tensor::zeros(o.shape());
    cpu::softmax_backward(dx.data<float>(), g[0].data<float>(), o.data<float>(), N, C);
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor causal_attention(const Tensor& qkv, int64_t n_head, DType out_type) {
  // Under autocast q, k, v may come in its type already (a half product's output).
  if (!is_autocast_half(qkv)) check_f32(qkv, "causal_attention", "qkv");
  MT_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "causal_attention: qkv must be [B, T, 3C], got ",
           shape_str(qkv.shape()));
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  MT_CHECK(n_head > 0 && C % n_head == 0, "causal_attention: width ", C,
           " is not divisible by n_head ", n_head);
  check_out_type(out_type, "causal_attention");
  DeviceKernels* k = kernels_for("causal_attention", {&qkv});
  const Device dev = qkv.device();
  const DType half = autocast_dtype(), qdt = qkv.dtype();
  if (k != nullptr && half != DType::f32 && k->flash_attention_supported(dev, C / n_head)) {
    // O(T) memory: the logsumexp of each row is kept instead of the probabilities, and q, k, v
    // are rounded to the half type once (or come so) and kept so, half the bytes of an f32
    // product until backward. A half output is also the copy the backward reads, shared with the
    // product it feeds; its gradient comes in that type too, and q, k, v's goes out in theirs.
    const Tensor qh = qkv.detach().to(half);
    Tensor out = Tensor::empty({B, T, C}, out_type, dev);
    Tensor lse = Tensor::empty({B, n_head, T}, DType::f32, dev);
    k->flash_attention_forward(dev, out.data_ptr(), out_type, lse.data<float>(), qh.data_ptr(),
                               half, B, T, C, n_head);
    record(
        "causal_attention", {qkv}, out,
        [qh, o = out.detach(), lse, qdt, half, B, T, C, n_head, k, dev](std::vector<Tensor>&& g) {
          const Tensor dout = g[0].to(o.dtype());
          g[0] = Tensor();
          Tensor dqkv = Tensor::empty(qh.shape(), qdt, dev);
          Tensor scratch = Tensor::empty({B, n_head, T}, DType::f32, dev);
          k->flash_attention_backward(dev, dqkv.data_ptr(), qdt, scratch.data<float>(),
                                      dout.data_ptr(), qh.data_ptr(), half, o.data_ptr(), o.dtype(),
                                      lse.data<float>(), B, T, C, n_head);
          return std::vector<Tensor>{dqkv};
        });
    return out;
  }
  // Under autocast attention reads q, k, v rounded to the half type, as the half-precision
  // kernels do (flash attention above; PyTorch's on its autocast's half outputs): the CPU's
  // emulation and the device's other kernels give flash attention's inputs.
  const Tensor x =
      half == DType::f32 || qdt != DType::f32 ? widened(qkv.detach()) : round_to(qkv, half);
  Tensor out = Tensor::empty({B, T, C}, DType::f32, dev);
  Tensor att = Tensor::empty({B, n_head, T, T}, DType::f32, dev);
  if (k != nullptr) {
    k->attention_forward(dev, out.data<float>(), att.data<float>(), x.data<float>(), B, T, C,
                         n_head);
  } else {
    cpu::attention_forward(out.data<float>(), att.data<float>(), x.data<float>(), B, T, C, n_head);
  }
  if (out_type != DType::f32) out = k != nullptr ? out.to(out_type) : pack_half(out, out_type);
  record("causal_attention", {qkv}, out,
         [x, att, qdt, B, T, C, n_head, k, dev](std::vector<Tensor>&& g) {
           const Tensor dout = widened(g[0]);
           g[0] = Tensor();
           Tensor dqkv = Tensor::empty(x.shape(), DType::f32, dev);
           Tensor scratch = Tensor::empty({B, n_head, T, T}, DType::f32, dev);
           if (k != nullptr) {
             k->attention_backward(dev, dqkv.data<float>(), scratch.data<float>(),
                                   dout.data<float>(), x.data<float>(), att.data<float>(), B, T, C,
                                   n_head);
           } else {
             cpu::attention_backward(dqkv.data<float>(), scratch.data<float>(), dout.data<float>(),
                                     x.data<float>(), att.data<float>(), B, T, C, n_head);
           }
           return std::vector<Tensor>{narrowed(dqkv, qdt)};
         });
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index,
                     float label_smoothing) {
  check_f32(logits, "cross_entropy", "logits");
  check_i32(targets, "cross_entropy", "targets");
  MT_CHECK(logits.dim() == 2 && targets.numel() == logits.size(0),
           "cross_entropy: logits must be [N, V] and targets [N], got ", shape_str(logits.shape()),
           " and ", shape_str(targets.shape()));
  const int64_t N = logits.size(0), V = logits.size(1);
  if (DeviceKernels* k = kernels_for("cross_entropy", {&logits, &targets})) {
    // The mean stays on the device, and the backward takes the incoming gradient and the count
    // of non-ignored targets there too: no host wait on either side.
    const Device dev = logits.device();
    Tensor losses = Tensor::empty({N}, DType::f32, dev);
    Tensor lse = Tensor::empty({N}, DType::f32, dev);
    Tensor out = Tensor::empty({}, DType::f32, dev);
    k->cross_entropy_forward(dev, losses.data<float>(), lse.data<float>(), out.data<float>(),
                             logits.data<float>(), DType::f32, targets.data<int32_t>(), N, V,
                             ignore_index, nullptr, label_smoothing);
    record("cross_entropy", {logits}, out,
           [logits = logits.detach(), targets, lse, N, V, ignore_index, label_smoothing, k,
            dev](std::vector<Tensor>&& g) {
             // A seed given on the host (backward(loss, host scalar)) moves to the device first.
             const Tensor dloss = g[0].to(dev);
             // Each element's gradient needs only its own logit: written over the logits when
             // nothing else sees them.
             Tensor d = may_overwrite_saved(logits)
                            ? logits
                            : Tensor::empty(logits.shape(), DType::f32, dev);
             k->cross_entropy_backward(dev, d.data<float>(), logits.data<float>(), DType::f32,
                                       lse.data<float>(), targets.data<int32_t>(),
                                       dloss.data<float>(), N, V, ignore_index, label_smoothing);
             return std::vector<Tensor>{d};
           });
    return out;
  }
  Tensor losses = Tensor::empty({N});
  Tensor lse = Tensor::empty({N});
  const float mean =
      cpu::cross_entropy_forward(losses.data<float>(), lse.data<float>(), logits.data<float>(),
                                 targets.data<int32_t>(), N, V, ignore_index, label_smoothing);
  Tensor out = Tensor::scalar(mean);
  record("cross_entropy", {logits}, out,
         [logits = logits.detach(), targets, lse, N, V, ignore_index,
          label_smoothing](std::vector<Tensor>&& g) {
           Tensor d = may_overwrite_saved(logits) ? logits : Tensor::empty(logits.shape());
           cpu::cross_entropy_backward(d.data<float>(), logits.data<float>(), lse.data<float>(),
                                       targets.data<int32_t>(), g[0].item(), N, V, ignore_index,
                                       label_smoothing);
           return std::vector<Tensor>{d};
         });
  return out;
}

Tensor gpt_embedding(const Tensor& idx, const Tensor& wte, const Tensor& wpe) {
  check_i32(idx, "gpt_embedding", "token ids");
  check_f32(wte, "gpt_embedding", "wte");
  check_f32(wpe, "gpt_embedding", "wpe");
  MT_CHECK(idx.dim() == 2, "gpt_embedding: token ids must be [B, T], got ", shape_str(idx.shape()));
  const int64_t B = idx.size(0), T = idx.size(1), V = wte.size(0), C = wte.size(1);
  MT_CHECK(wpe.dim() == 2 && wpe.size(1) == C && wpe.size(0) >= T, "gpt_embedding: sequence of ", T,
           " tokens exceeds the position table ", shape_str(wpe.shape()));
  DeviceKernels* k = kernels_for("gpt_embedding", {&idx, &wte, &wpe});
  const Device dev = idx.device();
  Tensor out = Tensor::empty({B, T, C}, DType::f32, dev);
  if (k != nullptr) {
    k->gpt_embedding_forward(dev, out.data<float>(), idx.data<int32_t>(), wte.data<float>(),
                             wpe.data<float>(), B, T, C, V);
  } else {
    cpu::gpt_embedding_forward(out.data<float>(), idx.data<int32_t>(), wte.data<float>(),
                               wpe.data<float>(), B, T, C, V);
  }
  record("gpt_embedding", {wte, wpe}, out,
         [idx, wte_shape = wte.shape(), wpe_shape = wpe.shape(), gte = wants(wte), gpe = wants(wpe),
          B, T, C, V, k, dev](std::vector<Tensor>&& g) {
           // On a device the token table's sums are added to its pending gradient where there is
           // one (the tied LM head's, which arrives first): the bits of a separate addition,
           // without the zero-filled table and the sum.
           Tensor into = gte && k != nullptr ? pending_input_gradient(0, wte_shape, dev) : Tensor();
           const bool accumulate = into.defined();
           Tensor dwte = accumulate ? into
                         : gte      ? Tensor::zeros(wte_shape, DType::f32, dev)
                                    : Tensor();
           Tensor dwpe = gpe ? Tensor::zeros(wpe_shape, DType::f32, dev) : Tensor();
           if (k != nullptr) {
             k->gpt_embedding_backward(dev, ptr_or_null(dwte), ptr_or_null(dwpe),
                                       g[0].data<float>(), idx.data<int32_t>(), B, T, C, V);
           } else {
             cpu::gpt_embedding_backward(ptr_or_null(dwte), ptr_or_null(dwpe), g[0].data<float>(),
                                         idx.data<int32_t>(), B, T, C, V);
           }
           return std::vector<Tensor>{accumulate ? Tensor() : dwte, dwpe};
         });
  return out;
}

Tensor embedding(const Tensor& idx, const Tensor& table) {
  check_i32(idx, "embedding", "ids");
  check_f32(table, "embedding", "table");
  check_cpu_only(table, "embedding");
  MT_CHECK(table.dim() == 2, "embedding: table must be 2-D, got ", shape_str(table.shape()));
  const int64_t N = idx.numel(), V = table.size(0), C = table.size(1);
  Shape out_shape = idx.shape();
  out_shape.push_back(C);
  Tensor out = Tensor::empty(out_shape);
  cpu::embedding_forward(out.data<float>(), idx.data<int32_t>(), table.data<float>(), N, C, V);
  record("embedding", {table}, out, [idx, ts = table.shape(), N, C, V](std::vector<Tensor>&& g) {
    Tensor d = Tensor::zeros(ts);
    cpu::embedding_backward(d.data<float>(), g[0].data<float>(), idx.data<int32_t>(), N, C, V);
    return std::vector<Tensor>{d};
  });
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  Tensor out = x.to(device);
  record("to_device", {x}, out, [from = x.device()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{g[0].to(from)};
  });
  return out;
}

Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset, bool training) {
  if (!training || p == 0.0f) return x;
  check_f32(x, "dropout", "input");
  MT_CHECK(p >= 0.0f && p < 1.0f, "dropout probability must be in [0, 1), got ", p);
  DeviceKernels* k = kernels_for("dropout", {&x});
  const Device dev = x.device();
  // The backward is the forward's mask over the gradient, written (a -0 gradient stays -0, as
  // PyTorch's grad * mask * scale), so the CPU and the device share one kernel each way.
  auto apply = [k, dev, p, seed, offset](Tensor& out, const Tensor& in) {
    if (k != nullptr)
      k->dropout(dev, out.data<float>(), in.data<float>(), in.numel(), p, seed, offset);
    else
      cpu::dropout_forward(out.data<float>(), in.data<float>(), in.numel(), p, seed, offset);
  };
  Tensor out = Tensor::empty(x.shape(), DType::f32, dev);
  apply(out, x);
  record("dropout", {x}, out, [apply, s = x.shape(), dev](std::vector<Tensor>&& g) {
    Tensor dx = Tensor::empty(s, DType::f32, dev);
    apply(dx, g[0]);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace meshtrain::autograd
