// Autocast: rounding to bf16/f16 is round-to-nearest-even with f16 overflowing to infinity, and
// the autocast linear and matmul equal a double-precision product of the rounded operands
// (forward, and backward with the rounded incoming gradient) to f32 accumulation accuracy,
// while they differ from the unrounded product by about the half type's precision.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/node.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/storage.h"
#include "meshtrain/util/error.h"

namespace meshtrain::autograd {
namespace {

Tensor rnd(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, g);
}

std::vector<double> rounded(const Tensor& t, DType half) {
  std::vector<double> out;
  for (float v : round_to(t, half).to_vector()) out.push_back(v);
  return out;
}
std::vector<double> exact(const Tensor& t) {
  std::vector<double> out;
  for (float v : t.to_vector()) out.push_back(v);
  return out;
}

// c[M, N] = a[M, K] @ b[N, K]^T in double.
std::vector<double> ref_abt(const std::vector<double>& a, const std::vector<double>& b, int64_t M,
                            int64_t N, int64_t K) {
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[i * K + k] * b[j * K + k];
      c[i * N + j] = s;
    }
  return c;
}
// c[M, N] = a[K, M]^T @ b[K, N] in double.
std::vector<double> ref_atb(const std::vector<double>& a, const std::vector<double>& b, int64_t M,
                            int64_t N, int64_t K) {
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[k * M + i] * b[k * N + j];
      c[i * N + j] = s;
    }
  return c;
}
// c[M, N] = a[M, K] @ b[K, N] in double.
std::vector<double> ref_ab(const std::vector<double>& a, const std::vector<double>& b, int64_t M,
                           int64_t N, int64_t K) {
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[i * K + k] * b[k * N + j];
      c[i * N + j] = s;
    }
  return c;
}

// Largest |got - ref| relative to the largest |ref|.
double max_rel(const Tensor& got, const std::vector<double>& ref) {
  const auto g = got.to_vector();
  EXPECT_EQ(g.size(), ref.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::fabs(g[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return err / scale;
}

TEST(Autocast, RoundsToNearestEven) {
  const float one = 1.0f;
  auto r = [](float v, DType t) {
    return round_to(Tensor::from_vector(std::vector<float>{v}, {1}), t).item();
  };
  // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to even.
  EXPECT_EQ(r(one + std::ldexp(1.0f, -8), DType::bf16), 1.0f);
  EXPECT_EQ(r(one + 3 * std::ldexp(1.0f, -8), DType::bf16), one + std::ldexp(1.0f, -6));
  EXPECT_EQ(r(one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), DType::bf16),
            one + std::ldexp(1.0f, -7));
  // f16 keeps 11 bits and overflows past 65504 (65520 and above round to infinity).
  EXPECT_EQ(r(one + std::ldexp(1.0f, -11), DType::f16), 1.0f);
  EXPECT_EQ(r(65504.0f, DType::f16), 65504.0f);
  EXPECT_EQ(r(65519.0f, DType::f16), 65504.0f);
  EXPECT_TRUE(std::isinf(r(65520.0f, DType::f16)));
  EXPECT_TRUE(std::isinf(r(-1e6f, DType::f16)));
  EXPECT_EQ(r(1e-9f, DType::f16), 0.0f);              // below half the smallest subnormal
  EXPECT_TRUE(std::isfinite(r(1e30f, DType::bf16)));  // bf16 has f32's range
  EXPECT_TRUE(std::isnan(r(std::nanf(""), DType::bf16)));
  // pack/unpack: 2 bytes per element and back without further change.
  Tensor x = rnd({1000}, 1);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor h = pack_half(x, t);
    EXPECT_EQ(h.dtype(), t);
    EXPECT_EQ(h.nbytes(), 2000u);
    EXPECT_EQ(unpack_half(h).to_vector(), round_to(x, t).to_vector());
  }
}

TEST(Autocast, GuardNestsAndIsOffByDefault) {
  EXPECT_EQ(autocast_dtype(), DType::f32);
  {
    AutocastGuard a(DType::bf16);
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    {
      AutocastGuard b(DType::f32);
      EXPECT_FALSE(autocast_enabled());
    }
    EXPECT_EQ(autocast_dtype(), DType::bf16);
  }
  EXPECT_EQ(autocast_dtype(), DType::f32);
  EXPECT_THROW(AutocastGuard(DType::i32), Error);
}

TEST(Autocast, LinearIsTheDoubleProductOfRoundedOperands) {
  // BT 37, C_in 96, C_out 53: odd sizes, K long enough for rounding of the inputs to matter.
  const int64_t BT = 37, Ci = 96, Co = 53;
  for (DType half : {DType::bf16, DType::f16}) {
    Tensor x = rnd({BT, Ci}, 2).set_requires_grad(true);
    Tensor w = rnd({Co, Ci}, 3).set_requires_grad(true);
    Tensor b = rnd({Co}, 4).set_requires_grad(true);
    Tensor dout = rnd({BT, Co}, 5);
    Tensor y;
    {
      AutocastGuard cast(half);
      y = linear(x, w, b);
    }
    backward(y, dout);  // outside the guard: the node remembers the type

    const auto xr = rounded(x, half), wr = rounded(w, half), gr = rounded(dout, half);
    std::vector<double> yref = ref_abt(xr, wr, BT, Co, Ci);
    const auto bv = exact(b);
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t j = 0; j < Co; ++j) yref[i * Co + j] += bv[j];
    // f32 accumulation of K = 96 products of exact half values: a few ulps of f32.
    EXPECT_LT(max_rel(y, yref), 1e-5) << dtype_name(half);
    // ...and clearly not the f32 product of the unrounded operands.
    std::vector<double> yfull = ref_abt(exact(x), exact(w), BT, Co, Ci);
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t j = 0; j < Co; ++j) yfull[i * Co + j] += bv[j];
    EXPECT_GT(max_rel(y, yfull), half == DType::bf16 ? 5e-4 : 5e-5) << dtype_name(half);

    EXPECT_LT(max_rel(x.grad(), ref_ab(gr, wr, BT, Ci, Co)), 1e-5) << dtype_name(half);
    EXPECT_LT(max_rel(w.grad(), ref_atb(gr, xr, Co, Ci, BT)), 1e-5) << dtype_name(half);
    // The bias gradient is a column sum of the gradient the products take (rounded, as PyTorch's
    // autocast hands its linear a half gradient), summed in f32, not a product.
    std::vector<double> dbref(static_cast<size_t>(Co), 0.0), dbfull(dbref);
    const auto dv = exact(dout);
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t j = 0; j < Co; ++j) {
        dbref[j] += gr[i * Co + j];
        dbfull[j] += dv[i * Co + j];
      }
    EXPECT_LT(max_rel(b.grad(), dbref), 1e-6) << dtype_name(half);
    EXPECT_GT(max_rel(b.grad(), dbfull), half == DType::bf16 ? 1e-4 : 1e-5) << dtype_name(half);
  }
}

TEST(Autocast, MatmulIsTheDoubleProductOfRoundedOperands) {
  const int64_t M = 19, K = 70, N = 23;
  Tensor a = rnd({M, K}, 6).set_requires_grad(true);
  Tensor b = rnd({K, N}, 7).set_requires_grad(true);
  Tensor dout = rnd({M, N}, 8);
  Tensor c;
  {
    AutocastGuard cast(DType::bf16);
    c = matmul(a, b);
  }
  backward(c, dout);
  const auto ar = rounded(a, DType::bf16), br = rounded(b, DType::bf16),
             gr = rounded(dout, DType::bf16);
  EXPECT_LT(max_rel(c, ref_ab(ar, br, M, N, K)), 1e-5);
  // da = dC @ B^T, db = A^T @ dC.
  std::vector<double> bt(static_cast<size_t>(N * K));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) bt[n * K + k] = br[k * N + n];
  EXPECT_LT(max_rel(a.grad(), ref_ab(gr, bt, M, K, N)), 1e-5);
  EXPECT_LT(max_rel(b.grad(), ref_atb(ar, gr, K, N, M)), 1e-5);
}

// Attention under autocast reads q, k, v rounded to the half type (what flash attention gets on a
// device): the f32 attention of the rounded values, with the gradient passed straight through
// the rounding.
TEST(Autocast, AttentionReadsRoundedQueriesKeysAndValues) {
  const int64_t B = 2, T = 9, C = 16, NH = 2;
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    const Tensor qkv = rnd({B, T, 3 * C}, 31), dout = rnd({B, T, C}, 32);
    Tensor a = qkv.clone(), r = round_to(qkv, half);
    a.set_requires_grad(true);
    r.set_requires_grad(true);
    Tensor got;
    {
      AutocastGuard autocast(half);
      got = causal_attention(a, NH);
      backward(got, dout);
    }
    const Tensor want = causal_attention(r, NH);
    backward(want, dout);
    EXPECT_EQ(got.to_vector(), want.to_vector());
    EXPECT_EQ(a.grad().to_vector(), r.grad().to_vector());
    EXPECT_NE(causal_attention(qkv, NH).to_vector(), want.to_vector()) << "no rounding seen";
  }
}

// GELU under autocast reads its input rounded to the half type and keeps that copy (2 bytes an
// element) for the backward: gelu of the rounded values, the gradient at them.
TEST(Autocast, GeluReadsItsInputRoundedAndKeepsItInTheHalfType) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    const Tensor x = rnd({64, 48}, 41), dout = rnd({64, 48}, 42);
    Tensor a = x.clone(), r = round_to(x, half);
    a.set_requires_grad(true);
    r.set_requires_grad(true);
    Tensor got;
    size_t kept = 0;
    {
      AutocastGuard autocast(half);
      const size_t before = host_tensor_bytes();
      got = gelu(a);
      kept = host_tensor_bytes() - before - got.nbytes();
      backward(got, dout);
    }
    EXPECT_EQ(kept, x.nbytes() / 2) << "the graph keeps the half copy only";
    const Tensor want = gelu(r);
    backward(want, dout);
    EXPECT_EQ(got.to_vector(), want.to_vector());
    EXPECT_EQ(a.grad().to_vector(), r.grad().to_vector());
    EXPECT_NE(gelu(x).to_vector(), want.to_vector()) << "no rounding seen";
  }
}

// A producer handing a half product its output rounded already (autocast's out_type), against
// its f32 output rounded by the product: the same forward bits, one f32 activation less. The
// half output's gradient is the f32 one rounded to the half type (as under PyTorch's autocast,
// whose half activations have half gradients), and the producer's backward takes that. Between
// the producer and the product may sit a consumer that reads its input rounded anyway.
template <typename Produce, typename Consume>
void expect_rounded_output(DType half, const std::vector<Tensor>& inputs, const Tensor& w0,
                           const Tensor& b0, const Tensor& dout, Produce produce, Consume consume) {
  auto run = [&](bool rounded_by_producer) {
    std::vector<Tensor> in;
    for (const Tensor& t : inputs) {
      in.push_back(t.clone());
      in.back().set_requires_grad(true);
    }
    Tensor w = w0.clone(), b = b0.defined() ? b0.clone() : Tensor();
    w.set_requires_grad(true);
    if (b.defined()) b.set_requires_grad(true);
    AutocastGuard autocast(half);
    const Tensor h = produce(in, rounded_by_producer ? half : DType::f32);
    EXPECT_EQ(h.dtype(), rounded_by_producer ? half : DType::f32);
    Tensor y;
    if (rounded_by_producer) {
      y = linear(consume(h), w, b);
      backward(y, dout);
    } else {
      Tensor hd = h.detach();
      hd.set_requires_grad(true);
      y = linear(consume(hd), w, b);
      backward(y, dout);
      backward(h, round_to(hd.grad(), half));
    }
    std::vector<std::vector<float>> got{y.to_vector(), w.grad().to_vector()};
    if (b.defined()) got.push_back(b.grad().to_vector());
    for (const Tensor& t : in) got.push_back(t.grad().to_vector());
    return got;
  };
  EXPECT_EQ(run(true), run(false));
}

template <typename Produce>
void expect_rounded_output(DType half, const std::vector<Tensor>& inputs, const Tensor& w0,
                           const Tensor& b0, const Tensor& dout, Produce produce) {
  expect_rounded_output(half, inputs, w0, b0, dout, produce, [](const Tensor& h) { return h; });
}

// GELU hands the MLP's projection its output rounded.
TEST(Autocast, GeluHandsAProductItsOutputRoundedWithTheSameBits) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    expect_rounded_output(half, {rnd({32, 64}, 51)}, rnd({16, 64}, 53), rnd({16}, 54),
                          rnd({32, 16}, 52),
                          [](const std::vector<Tensor>& in, DType t) { return gelu(in[0], t); });
  }
  // A half output is autocast's alone.
  EXPECT_THROW(gelu(rnd({4}, 55), DType::bf16), Error);
  const Tensor xh = rnd({2, 4}, 56).to(DType::bf16);
  EXPECT_THROW(linear(xh, rnd({3, 4}, 57), Tensor()), Error);
}

// The attention hands the output projection its output rounded.
TEST(Autocast, AttentionHandsAProductItsOutputRoundedWithTheSameBits) {
  const int64_t B = 2, T = 7, C = 16, NH = 2;
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    expect_rounded_output(
        half, {rnd({B, T, 3 * C}, 61)}, rnd({C, C}, 63), Tensor(), rnd({B, T, C}, 62),
        [&](const std::vector<Tensor>& in, DType t) { return causal_attention(in[0], NH, t); });
  }
  EXPECT_THROW(causal_attention(rnd({B, T, 3 * C}, 64), NH, DType::bf16), Error);
}

// A layer norm hands the next product its output rounded.
TEST(Autocast, LayerNormHandsAProductItsOutputRoundedWithTheSameBits) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    expect_rounded_output(half, {rnd({12, 32}, 71), rnd({32}, 74), rnd({32}, 75)}, rnd({8, 32}, 73),
                          Tensor(), rnd({12, 8}, 72), [](const std::vector<Tensor>& in, DType t) {
                            return layer_norm(in[0], in[1], in[2], 1e-5f, t);
                          });
  }
  EXPECT_THROW(layer_norm(rnd({2, 4}, 76), Tensor(), Tensor(), 1e-5f, DType::bf16), Error);
}

// A linear hands its consumer (attention's q, k, v; GELU's input) its output, bias included,
// rounded once; the input and output of the consumer take it in the half type too.
TEST(Autocast, LinearHandsAConsumerItsOutputRoundedWithTheSameBits) {
  const auto linear_of = [](const std::vector<Tensor>& in, DType t) {
    return linear(in[0], in[1], in[2], t);
  };
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    const Tensor w1 = rnd({48, 32}, 81), b1 = rnd({48}, 82);
    expect_rounded_output(half, {rnd({2, 5, 32}, 83), w1, b1}, rnd({8, 48}, 84), rnd({8}, 85),
                          rnd({2, 5, 8}, 86), linear_of, [](const Tensor& u) { return gelu(u); });
    expect_rounded_output(half, {rnd({2, 5, 32}, 87), w1, b1}, rnd({8, 16}, 88), Tensor(),
                          rnd({2, 5, 8}, 89), linear_of,
                          [](const Tensor& u) { return causal_attention(u, 2); });
  }
  EXPECT_THROW(linear(rnd({2, 4}, 90), rnd({3, 4}, 91), Tensor(), DType::bf16), Error);
}

// The gradient of a half activation is half: where it feeds two products, the two half
// gradients are summed in f32 and rounded once; an f32 gradient returned for it is rounded.
TEST(Autocast, GradientsOfHalfActivationsAreHalf) {
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    const Tensor x = rnd({6, 16}, 92), w1 = rnd({8, 16}, 93), w2 = rnd({8, 16}, 94);
    const Tensor d1 = rnd({6, 8}, 95), d2 = rnd({6, 8}, 96);
    AutocastGuard autocast(half);
    Tensor a = x.clone();
    a.set_requires_grad(true);
    const Tensor h = gelu(a, half);
    const Tensor y1 = linear(h, w1, Tensor()), y2 = linear(h, w2, Tensor());
    const Tensor g1 = grad({y1}, {d1}, {h}, {.retain_graph = true})[0];
    const Tensor g2 = grad({y2}, {d2}, {h}, {.retain_graph = true})[0];
    EXPECT_EQ(g1.dtype(), half);
    std::vector<float> sum = g1.to(DType::f32).to_vector();
    const std::vector<float> second = g2.to(DType::f32).to_vector();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += second[i];
    const Tensor both = grad({y1, y2}, {d1, d2}, {h}, {.retain_graph = true})[0];
    EXPECT_EQ(both.dtype(), half);
    EXPECT_EQ(both.to(DType::f32).to_vector(),
              Tensor::from_vector(sum, {6, 16}).to(half).to(DType::f32).to_vector());
    // An op that returns an f32 gradient for a half input: rounded on the way.
    Tensor y3 = Tensor::zeros({6, 16});
    record("returns_f32", {h}, y3, [](std::vector<Tensor>&&) {
      return std::vector<Tensor>{Tensor::full({6, 16}, 1.0 + 1.0 / 4096)};
    });
    const Tensor g3 = grad({y3}, {Tensor::ones({6, 16})}, {h})[0];
    EXPECT_EQ(g3.dtype(), half);
    EXPECT_EQ(g3.to(DType::f32).to_vector(), std::vector<float>(6 * 16, 1.0f));
  }
}

// residual + linear in one op: the values and gradients of add(residual, linear(...)) bit for bit,
// in f32 and under autocast (the residual stream stays f32, its gradient is the output's).
TEST(LinearResidual, IsTheAdditionOfTheProductWithTheSameBits) {
  for (const DType half : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    std::optional<AutocastGuard> autocast;
    if (half != DType::f32) autocast.emplace(half);
    Tensor w = rnd({6, 10}, 101), b = rnd({6}, 102), x = rnd({2, 3, 10}, 103),
           r = rnd({2, 3, 6}, 104);
    for (Tensor* t : {&w, &b, &x, &r}) t->set_requires_grad(true);
    const Tensor d = rnd({2, 3, 6}, 105);
    const Tensor fused = linear_residual(r, x, w, b);
    const Tensor apart = add(r, linear(x, w, b));
    EXPECT_EQ(fused.dtype(), DType::f32);
    EXPECT_EQ(fused.shape(), apart.shape());
    EXPECT_EQ(fused.to_vector(), apart.to_vector());
    const auto g1 = grad({fused}, {d}, {x, w, b, r});
    const auto g2 = grad({apart}, {d}, {x, w, b, r});
    for (size_t i = 0; i < g1.size(); ++i) {
      EXPECT_EQ(g1[i].dtype(), g2[i].dtype()) << i;
      EXPECT_EQ(g1[i].to(DType::f32).to_vector(), g2[i].to(DType::f32).to_vector()) << i;
    }
    EXPECT_EQ(g1[3].to_vector(), d.to_vector());
  }
  std::string msg;
  try {
    (void)linear_residual(rnd({2, 5}, 1), rnd({2, 4}, 2), rnd({3, 4}, 3), Tensor());
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("linear_residual: residual [2, 5] is not the output's shape [2, 3]"),
            std::string::npos)
      << msg;
}

TEST(Autocast, F16OverflowBecomesInfinity) {
  // A gradient beyond f16's range overflows in the backward product: what loss scaling is for.
  Tensor x = rnd({4, 8}, 9);
  Tensor w = rnd({8, 8}, 10).set_requires_grad(true);
  Tensor y;
  {
    AutocastGuard cast(DType::f16);
    y = linear(x, w, Tensor());
  }
  backward(y, Tensor::full({4, 8}, 1e5));
  bool non_finite = false;
  for (float v : w.grad().to_vector()) non_finite = non_finite || !std::isfinite(v);
  EXPECT_TRUE(non_finite);
}

}  // namespace
}  // namespace meshtrain::autograd
