#include "meshtrain/autograd/gelu_mlp.h"

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/node.h"
#include "meshtrain/autograd/op_checks.h"
#include "meshtrain/tensor/cpu/elementwise.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/reduce.h"
#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::autograd {
namespace {

using detail::check_f32;
using detail::kernels_for;
using detail::ptr_or_null;
using detail::wants;
using detail::with_residual;

struct Dims {
  int64_t bt, cin, hidden, cout;
};

// The tensors the backward reads (undefined where no gradient needs them) and which gradients
// it makes.
struct Saved {
  Tensor xh, w_fc_h, pre, hh, w_proj_h;
  Shape x_shape, w_fc_shape, b_fc_shape, w_proj_shape, b_proj_shape;
  DType x_type;
  bool gx, gw_fc, gb_fc, gw_proj, gb_proj, has_residual;
  bool needs_dpre() const { return gx || gw_fc || gb_fc; }
  // Keeps what the wanted gradients read: half operands, GELU's input and output.
  void keep(const Tensor& x_half, const Tensor& w_fc_half, const Tensor& gelu_in,
            const Tensor& gelu_out, const Tensor& w_proj_half) {
    if (gw_fc) xh = x_half;
    if (gx) w_fc_h = w_fc_half;
    if (needs_dpre()) {
      pre = gelu_in;
      w_proj_h = w_proj_half;
    }
    if (gw_proj) hh = gelu_out;
  }
};

Tensor on_cpu(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
              const Tensor& b_proj, const Tensor& residual, DType half, const Dims& d, Saved s) {
  Shape out_shape = x.shape();
  out_shape.back() = d.cout;
  const Tensor xh = x.dtype() == half ? x.detach() : pack_half(x, half);
  const Tensor w_fc_h = half_weight(w_fc, half), w_proj_h = half_weight(w_proj, half);
  Tensor sum = Tensor::empty({d.bt, d.hidden});
  cpu::linear_forward(sum.data<float>(), unpack_half(xh).data<float>(),
                      unpack_half(w_fc_h).data<float>(), ptr_or_null(b_fc), d.bt, d.cin, d.hidden);
  const Tensor pre = pack_half(sum, half);
  Tensor g = Tensor::empty({d.bt, d.hidden});
  cpu::gelu_forward(g.data<float>(), sum.data<float>(), g.numel());
  sum = Tensor();
  const Tensor hh = pack_half(g, half);
  g = Tensor();
  Tensor out = Tensor::empty(out_shape);
  cpu::linear_forward(out.data<float>(), unpack_half(hh).data<float>(),
                      unpack_half(w_proj_h).data<float>(), ptr_or_null(b_proj), d.bt, d.hidden,
                      d.cout);
  if (residual.defined())
    cpu::add(out.data<float>(), residual.data<float>(), out.data<float>(), out.numel());
  s.keep(xh, w_fc_h, pre, hh, w_proj_h);
  record(
      "gelu_mlp", with_residual({x, w_fc, b_fc, w_proj, b_proj}, residual), out,
      [s = std::move(s), d, half](std::vector<Tensor>&& gr) mutable {
        const Tensor dout = gr[0].dtype() == half ? unpack_half(gr[0]) : round_to(gr[0], half);
        const Tensor dres = s.has_residual ? gr[0] : Tensor();
        gr[0] = Tensor();
        Tensor dw_proj, db_proj, dx, dw_fc, db_fc;
        if (s.gw_proj) {
          dw_proj = Tensor::empty(s.w_proj_shape);
          cpu::matmul(dw_proj.data<float>(), dout.data<float>(), unpack_half(s.hh).data<float>(),
                      d.cout, d.hidden, d.bt, true, false, 1.0f, 0.0f);
        }
        if (s.gb_proj) {
          db_proj = Tensor::empty(s.b_proj_shape);
          cpu::sum_first_dim(db_proj.data<float>(), dout.data<float>(), d.bt, d.cout, false);
        }
        if (s.needs_dpre()) {
          Tensor dh = Tensor::empty({d.bt, d.hidden});
          cpu::matmul(dh.data<float>(), dout.data<float>(), unpack_half(s.w_proj_h).data<float>(),
                      d.bt, d.hidden, d.cout, false, false, 1.0f, 0.0f);
          Tensor dp = Tensor::empty({d.bt, d.hidden});
          cpu::gelu_backward(dp.data<float>(), unpack_half(s.pre).data<float>(), dh.data<float>(),
                             dp.numel());
          dh = Tensor();
          const Tensor dpre = round_to(dp, half);
          dp = Tensor();
          if (s.gb_fc) {
            db_fc = Tensor::empty(s.b_fc_shape);
            cpu::sum_first_dim(db_fc.data<float>(), dpre.data<float>(), d.bt, d.hidden, false);
          }
          if (s.gw_fc) {
            dw_fc = Tensor::empty(s.w_fc_shape);
            cpu::matmul(dw_fc.data<float>(), dpre.data<float>(), unpack_half(s.xh).data<float>(),
                        d.hidden, d.cin, d.bt, true, false, 1.0f, 0.0f);
          }
          if (s.gx) {
            dx = Tensor::empty(s.x_shape);
            cpu::matmul(dx.data<float>(), dpre.data<float>(), unpack_half(s.w_fc_h).data<float>(),
                        d.bt, d.cin, d.hidden, false, false, 1.0f, 0.0f);
            if (s.x_type != DType::f32) dx = pack_half(dx, s.x_type);
          }
        }
        return with_residual({dx, dw_fc, db_fc, dw_proj, db_proj}, dres, s.has_residual);
      });
  return out;
}

Tensor on_device(DeviceKernels& k, const Tensor& x, const Tensor& w_fc, const Tensor& b_fc,
                 const Tensor& w_proj, const Tensor& b_proj, const Tensor& residual, DType half,
                 const Dims& d, Saved s) {
  const Device dev = x.device();
  Shape out_shape = x.shape();
  out_shape.back() = d.cout;
  const Tensor xh = x.dtype() == half ? x.detach() : x.to(half);
  const Tensor w_fc_h = half_weight(w_fc, half), w_proj_h = half_weight(w_proj, half);
  const Tensor pre = Tensor::empty({d.bt, d.hidden}, half, dev);
  const Tensor hh = Tensor::empty({d.bt, d.hidden}, half, dev);
  k.linear_gelu_half(dev, hh.data_ptr(), pre.data_ptr(), xh.data_ptr(), w_fc_h.data_ptr(),
                     ptr_or_null(b_fc), half, d.bt, d.cin, d.hidden);
  Tensor out = Tensor::empty(out_shape, DType::f32, dev);
  k.matmul_half(dev, out.data_ptr(), DType::f32, hh.data_ptr(), w_proj_h.data_ptr(), half,
                ptr_or_null(b_proj), 1, d.bt, d.cout, d.hidden, false, true, 0, 0,
                ptr_or_null(residual), 1.0f);
  s.keep(xh, w_fc_h, pre, hh, w_proj_h);
  record("gelu_mlp", with_residual({x, w_fc, b_fc, w_proj, b_proj}, residual), out,
         [s = std::move(s), d, half, &k, dev](std::vector<Tensor>&& gr) mutable {
           // The half copy the gradient's last summand rounded where it wrote it, or a cast.
           const Tensor given = incoming_half_gradient(0, half);
           const Tensor dout = given.defined() ? given : gr[0].to(half);
           const Tensor dres = s.has_residual ? gr[0] : Tensor();
           gr[0] = Tensor();
           Tensor dw_proj, db_proj, dx, dw_fc, db_fc;
           if (s.gb_proj) db_proj = Tensor::empty(s.b_proj_shape, DType::f32, dev);
           if (s.gw_proj) dw_proj = Tensor::empty(s.w_proj_shape, DType::f32, dev);
           if (s.gw_proj || s.gb_proj)
             k.weight_grad_half(dev, ptr_or_null(dw_proj), ptr_or_null(db_proj), dout.data_ptr(),
                                s.gw_proj ? s.hh.data_ptr() : nullptr, half, d.bt, d.hidden, d.cout,
                                1.0f);
           if (s.needs_dpre()) {
             const Tensor dpre = Tensor::empty({d.bt, d.hidden}, half, dev);
             if (s.gb_fc) db_fc = Tensor::empty(s.b_fc_shape, DType::f32, dev);
             k.linear_input_grad_dgelu_half(dev, dpre.data_ptr(), ptr_or_null(db_fc),
                                            dout.data_ptr(), s.w_proj_h.data_ptr(),
                                            s.pre.data_ptr(), half, d.bt, d.hidden, d.cout);
             if (s.gw_fc) {
               dw_fc = Tensor::empty(s.w_fc_shape, DType::f32, dev);
               k.weight_grad_half(dev, dw_fc.data<float>(), nullptr, dpre.data_ptr(),
                                  s.xh.data_ptr(), half, d.bt, d.cin, d.hidden, 1.0f);
             }
             if (s.gx) {
               dx = Tensor::empty(s.x_shape, s.x_type, dev);
               k.matmul_half(dev, dx.data_ptr(), s.x_type, dpre.data_ptr(), s.w_fc_h.data_ptr(),
                             half, nullptr, 1, d.bt, d.cin, d.hidden, false, false, 0, 0, nullptr,
                             1.0f);
             }
           }
           return with_residual({dx, dw_fc, db_fc, dw_proj, db_proj}, dres, s.has_residual);
         });
  return out;
}

}  // namespace

Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                const Tensor& b_proj, const Tensor& residual) {
  MT_CHECK(autocast_enabled(), "gelu_mlp: runs under autocast (bf16 or f16) only");
  const DType half = autocast_dtype();
  MT_CHECK(x.defined() && (x.dtype() == DType::f32 || x.dtype() == half),
           "gelu_mlp: input must be f32 or ", dtype_name(half));
  check_f32(w_fc, "gelu_mlp", "w_fc");
  check_f32(w_proj, "gelu_mlp", "w_proj");
  const int64_t cin = w_fc.size(1), hidden = w_fc.size(0), cout = w_proj.size(0);
  MT_CHECK(w_fc.dim() == 2 && w_proj.dim() == 2 && w_proj.size(1) == hidden && x.dim() >= 1 &&
               x.size(-1) == cin,
           "gelu_mlp: input ", shape_str(x.shape()), ", w_fc ", shape_str(w_fc.shape()),
           " and w_proj ", shape_str(w_proj.shape()), " do not chain");
  if (b_fc.defined()) {
    check_f32(b_fc, "gelu_mlp", "b_fc");
    MT_CHECK(b_fc.dim() == 1 && b_fc.size(0) == hidden, "gelu_mlp: b_fc ", shape_str(b_fc.shape()),
             " does not match w_fc ", shape_str(w_fc.shape()));
  }
  if (b_proj.defined()) {
    check_f32(b_proj, "gelu_mlp", "b_proj");
    MT_CHECK(b_proj.dim() == 1 && b_proj.size(0) == cout, "gelu_mlp: b_proj ",
             shape_str(b_proj.shape()), " does not match w_proj ", shape_str(w_proj.shape()));
  }
  const Dims d{rows_of(x.shape()), cin, hidden, cout};
  if (residual.defined()) {
    check_f32(residual, "gelu_mlp", "residual");
    MT_CHECK(residual.numel() == d.bt * cout, "gelu_mlp: residual ", shape_str(residual.shape()),
             " does not match the output's ", d.bt, " x ", cout);
  }
  Saved s;
  s.x_shape = x.shape();
  s.x_type = x.dtype();
  s.w_fc_shape = w_fc.shape();
  s.w_proj_shape = w_proj.shape();
  if (b_fc.defined()) s.b_fc_shape = b_fc.shape();
  if (b_proj.defined()) s.b_proj_shape = b_proj.shape();
  s.gx = wants(x);
  s.gw_fc = wants(w_fc);
  s.gb_fc = wants(b_fc);
  s.gw_proj = wants(w_proj);
  s.gb_proj = wants(b_proj);
  s.has_residual = residual.defined();
  DeviceKernels* k = kernels_for("gelu_mlp", {&x, &w_fc, &b_fc, &w_proj, &b_proj, &residual});
  return k == nullptr
             ? on_cpu(x, w_fc, b_fc, w_proj, b_proj, residual, half, d, std::move(s))
             : on_device(*k, x, w_fc, b_fc, w_proj, b_proj, residual, half, d, std::move(s));
}

}  // namespace meshtrain::autograd
