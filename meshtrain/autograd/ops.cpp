#include "meshtrain/autograd/ops.h"

#include <algorithm>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/node.h"

namespace meshtrain::autograd {

namespace {
Tensor reduce_grad(const Tensor& g, const Tensor& input) {
  return ops::sum_to_shape(g, input.shape());
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = ops::add(a, b);
  // Only the shapes: holding the operands would keep a GPT's every residual branch (the
  // attention's and the MLP's outputs) alive until backward for nothing.
  record("add", {a, b}, out, [as = a.shape(), bs = b.shape()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{ops::sum_to_shape(g[0], as), ops::sum_to_shape(g[0], bs)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = ops::sub(a, b);
  record("sub", {a, b}, out, [as = a.shape(), bs = b.shape()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{ops::sum_to_shape(g[0], as),
                               ops::sum_to_shape(ops::affine(g[0], -1.f, 0.f), bs)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = ops::mul(a, b);
  record("mul", {a, b}, out, [a = a.detach(), b = b.detach()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{reduce_grad(ops::mul(g[0], b), a),
                               reduce_grad(ops::mul(g[0], a), b)};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = ops::div(a, b);
  record("div", {a, b}, out, [a = a.detach(), b = b.detach()](std::vector<Tensor>&& g) {
    Tensor ga = ops::div(g[0], b);
    // d(a/b)/db = -a / b^2
    Tensor gb = ops::affine(ops::div(ops::mul(ga, a), b), -1.f, 0.f);
    return std::vector<Tensor>{reduce_grad(ga, a), reduce_grad(gb, b)};
  });
  return out;
}

Tensor affine(const Tensor& a, float alpha, float beta) {
  Tensor out = ops::affine(a, alpha, beta);
  record("affine", {a}, out, [alpha](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{ops::affine(g[0], alpha, 0.f)};
  });
  return out;
}

Tensor neg(const Tensor& a) {
  return affine(a, -1.f, 0.f);
}

Tensor exp(const Tensor& a) {
  Tensor out = ops::unary(ops::UnaryOp::exp, a);
  record("exp", {a}, out, [o = out.detach()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{ops::mul(g[0], o)};
  });
  return out;
}

Tensor log(const Tensor& a) {
  Tensor out = ops::unary(ops::UnaryOp::log, a);
  record("log", {a}, out, [a = a.detach()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{ops::div(g[0], a)};
  });
  return out;
}

Tensor tanh(const Tensor& a) {
  Tensor out = ops::unary(ops::UnaryOp::tanh, a);
  record("tanh", {a}, out, [o = out.detach()](std::vector<Tensor>&& g) {
    // 1 - tanh^2
    Tensor d = ops::affine(ops::mul(o, o), -1.f, 1.f);
    return std::vector<Tensor>{ops::mul(g[0], d)};
  });
  return out;
}

Tensor sqrt(const Tensor& a) {
  Tensor out = ops::unary(ops::UnaryOp::sqrt, a);
  record("sqrt", {a}, out, [o = out.detach()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{ops::div(ops::affine(g[0], 0.5f, 0.f), o)};
  });
  return out;
}

Tensor pow(const Tensor& a, float exponent) {
  Tensor out = ops::pow_scalar(a, exponent);
  record("pow", {a}, out, [a = a.detach(), exponent](std::vector<Tensor>&& g) {
    Tensor d = ops::affine(ops::pow_scalar(a, exponent - 1.f), exponent, 0.f);
    return std::vector<Tensor>{ops::mul(g[0], d)};
  });
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  // Under autocast both operands, and in backward the incoming gradient, are rounded to the
  // half type first (see autocast.h).
  const DType half =
      a.dtype() == DType::f32 && b.dtype() == DType::f32 ? autocast_dtype() : DType::f32;
  const Tensor ar = half == DType::f32 ? a : round_to(a, half);
  const Tensor br = half == DType::f32 ? b : round_to(b, half);
  Tensor out = ops::matmul(ar, br, trans_a, trans_b);
  MT_CHECK(!(trans_a && b.dim() == 2 && a.dim() > 2 && any_requires_grad({&a, &b})),
           "matmul: gradient of a batched transposed left operand with a shared right operand "
           "is not supported; transpose explicitly");
  record("matmul", {a, b}, out,
         [a = ar.detach(), b = br.detach(), trans_a, trans_b, half](std::vector<Tensor>&& g) {
           const Tensor go = half == DType::f32 ? g[0] : round_to(g[0], half);
           std::vector<Tensor> r(2);
           // C = op(A) op(B): dop(A) = dC op(B)^T, dop(B) = op(A)^T dC.
           r[0] = trans_a ? ops::matmul(b, go, trans_b, true) : ops::matmul(go, b, false, !trans_b);
           if (b.dim() == 2 && a.dim() > 2) {
             // Shared right operand: fold the batch into rows.
             const int64_t K = a.size(-1), M = rows_of(a.shape());
             Tensor a2 = a.view({M, K});
             Tensor g2 = go.view({M, go.size(-1)});
             r[1] = trans_b ? ops::matmul(g2, a2, true, false) : ops::matmul(a2, g2, true, false);
           } else {
             r[1] =
                 trans_b ? ops::matmul(go, a, true, trans_a) : ops::matmul(a, go, !trans_a, false);
           }
           return r;
         });
  return out;
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  Tensor out = a.view(shape);
  record("reshape", {a}, out,
         [s = a.shape()](std::vector<Tensor>&& g) { return std::vector<Tensor>{g[0].view(s)}; });
  return out;
}

Tensor flatten(const Tensor& a, int64_t start_dim) {
  const int64_t d = start_dim < 0 ? start_dim + a.dim() : start_dim;
  MT_CHECK(d >= 0 && d < std::max<int64_t>(a.dim(), 1), "flatten: start_dim ", start_dim,
           " is out of range for a tensor of shape ", shape_str(a.shape()));
  if (a.dim() == 0) return reshape(a, {1});
  Shape shape(a.shape().begin(), a.shape().begin() + d);
  int64_t rest = 1;
  for (int64_t k = d; k < a.dim(); ++k) rest *= a.size(k);
  shape.push_back(rest);
  return reshape(a, shape);
}

Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  Tensor out = ops::permute(a, dims);
  record("permute", {a}, out, [dims, n = a.dim()](std::vector<Tensor>&& g) {
    std::vector<int64_t> inv(dims.size());
    for (size_t k = 0; k < dims.size(); ++k) {
      const int64_t d = dims[k] < 0 ? dims[k] + n : dims[k];
      inv[static_cast<size_t>(d)] = static_cast<int64_t>(k);
    }
    return std::vector<Tensor>{ops::permute(g[0], inv)};
  });
  return out;
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  Tensor out = ops::transpose(a, d0, d1);
  record("transpose", {a}, out, [d0, d1](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{ops::transpose(g[0], d0, d1)};
  });
  return out;
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  Tensor out = ops::narrow(a, dim, start, length);
  record("narrow", {a}, out, [s = a.shape(), dim, start, length](std::vector<Tensor>&& g) {
    const int64_t d = dim < 0 ? dim + static_cast<int64_t>(s.size()) : dim;
    std::vector<Tensor> parts;
    Shape before = s, after = s;
    before[static_cast<size_t>(d)] = start;
    after[static_cast<size_t>(d)] = s[static_cast<size_t>(d)] - start - length;
    if (start > 0) parts.push_back(Tensor::zeros(before, g[0].dtype(), g[0].device()));
    parts.push_back(g[0]);
    if (after[static_cast<size_t>(d)] > 0)
      parts.push_back(Tensor::zeros(after, g[0].dtype(), g[0].device()));
    return std::vector<Tensor>{ops::cat(parts, d)};
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& parts, int64_t dim) {
  Tensor out = ops::cat(parts, dim);
  std::vector<int64_t> sizes;
  const int64_t d = dim < 0 ? dim + parts[0].dim() : dim;
  for (const Tensor& p : parts) sizes.push_back(p.size(d));
  record("cat", parts, out, [sizes, d](std::vector<Tensor>&& g) {
    std::vector<Tensor> r;
    int64_t start = 0;
    for (int64_t s : sizes) {
      r.push_back(ops::narrow(g[0], d, start, s));
      start += s;
    }
    return r;
  });
  return out;
}

namespace {
Tensor expand_back(const Tensor& g, const Shape& in_shape, int64_t dim) {
  // Broadcast a reduced gradient back over `dim`.
  Shape keep = in_shape;
  keep[static_cast<size_t>(dim)] = 1;
  return ops::add(g.view(keep), Tensor::zeros(in_shape));
}
}  // namespace

Tensor sum(const Tensor& a, int64_t dim, bool keepdim) {
  Tensor out = ops::sum(a, dim, keepdim);
  const int64_t d = dim < 0 ? dim + a.dim() : dim;
  record("sum", {a}, out, [s = a.shape(), d](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{expand_back(g[0], s, d)};
  });
  return out;
}

Tensor mean(const Tensor& a, int64_t dim, bool keepdim) {
  Tensor out = ops::mean(a, dim, keepdim);
  const int64_t d = dim < 0 ? dim + a.dim() : dim;
  record("mean", {a}, out, [s = a.shape(), d](std::vector<Tensor>&& g) {
    Tensor r = expand_back(g[0], s, d);
    ops::scale_(r, 1.f / static_cast<float>(s[static_cast<size_t>(d)]));
    return std::vector<Tensor>{r};
  });
  return out;
}

Tensor max(const Tensor& a, int64_t dim, bool keepdim) {
  auto [vals, idx] = ops::max(a, dim, keepdim);
  const int64_t d = dim < 0 ? dim + a.dim() : dim;
  record("max", {a}, vals, [s = a.shape(), d, idx = idx](std::vector<Tensor>&& g) {
    Tensor r = Tensor::zeros(s);
    int64_t outer = 1, inner = 1;
    for (int64_t k = 0; k < static_cast<int64_t>(s.size()); ++k) {
      if (k < d) outer *= s[static_cast<size_t>(k)];
      if (k > d) inner *= s[static_cast<size_t>(k)];
    }
    const int64_t mid = s[static_cast<size_t>(d)];
    const float* pg = g[0].data<float>();
    const int64_t* pi = idx.data<int64_t>();
    float* pr = r.data<float>();
    for (int64_t i = 0; i < outer; ++i)
      for (int64_t j = 0; j < inner; ++j)
        pr[(i * mid + pi[i * inner + j]) * inner + j] = pg[i * inner + j];
    return std::vector<Tensor>{r};
  });
  return vals;
}

Tensor sum_all(const Tensor& a) {
  Tensor out = ops::sum_all(a);
  record("sum_all", {a}, out, [s = a.shape()](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{Tensor::full(s, g[0].item())};
  });
  return out;
}

Tensor mean_all(const Tensor& a) {
  MT_CHECK(a.numel() > 0, "mean of an empty tensor");
  return scale(sum_all(a), 1.f / static_cast<float>(a.numel()));
}

}  // namespace meshtrain::autograd
