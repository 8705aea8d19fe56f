// gelu_mlp: the MLP under autocast as one op. Its forward and backward are the rounded products
// with GELU of the unrounded sum and GELU's gradient of the unrounded input gradient (checked bit
// for bit against the CPU kernels composed by hand), and they follow the separate ops (linear,
// gelu, linear_residual, which round in between) within the half type's precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/gelu_mlp.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/reduce.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/util/error.h"

namespace meshtrain::autograd {
namespace {

constexpr int64_t kB = 2, kT = 3, kC = 8, kH = 16, kOut = 6, kBT = kB * kT;

Tensor rnd(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, g);
}

std::vector<float> rounded(const Tensor& t, DType half) {
  return round_to(t, half).to_vector();
}

// The largest difference relative to the largest magnitude of `want`.
double rel_diff(const Tensor& got, const Tensor& want) {
  const auto g = got.to(DType::f32).to_vector(), w = want.to(DType::f32).to_vector();
  EXPECT_EQ(g.size(), w.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(g[i] - w[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(w[i])));
  }
  return diff / scale;
}

struct Mlp {
  Tensor x, w1, b1, w2, b2, r;
  explicit Mlp(uint64_t seed)
      : x(rnd({kB, kT, kC}, seed)),
        w1(rnd({kH, kC}, seed + 1)),
        b1(rnd({kH}, seed + 2)),
        w2(rnd({kOut, kH}, seed + 3)),
        b2(rnd({kOut}, seed + 4)),
        r(rnd({kB, kT, kOut}, seed + 5)) {
    for (Tensor* t : {&x, &w1, &b1, &w2, &b2, &r}) t->set_requires_grad(true);
  }
  std::vector<Tensor> all() const { return {x, w1, b1, w2, b2, r}; }
};

TEST(GeluMlp, IsTheRoundedProductsWithGeluOfTheUnroundedSum) {
  for (const DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    const Mlp m(10);
    const Tensor d = rnd({kB, kT, kOut}, 20);
    Tensor out;
    std::vector<Tensor> g;
    {
      AutocastGuard autocast(half);
      out = gelu_mlp(m.x, m.w1, m.b1, m.w2, m.b2, m.r);
      g = grad({out}, {d}, m.all());
    }
    ASSERT_EQ(out.dtype(), DType::f32);
    ASSERT_EQ(out.shape(), (Shape{kB, kT, kOut}));
    // The definition, composed from the CPU kernels on the rounded operands.
    const auto xr = rounded(m.x, half), w1r = rounded(m.w1, half), w2r = rounded(m.w2, half);
    std::vector<float> sum(kBT * kH), h(kBT * kH), want(kBT * kOut);
    cpu::linear_forward(sum.data(), xr.data(), w1r.data(), m.b1.data<float>(), kBT, kC, kH);
    cpu::gelu_forward(h.data(), sum.data(), kBT * kH);
    const auto pre = rounded(Tensor::from_vector(sum, {kBT, kH}), half);
    h = rounded(Tensor::from_vector(h, {kBT, kH}), half);
    cpu::linear_forward(want.data(), h.data(), w2r.data(), m.b2.data<float>(), kBT, kH, kOut);
    const auto res = m.r.to_vector();
    for (size_t i = 0; i < want.size(); ++i) want[i] += res[i];
    EXPECT_EQ(out.to_vector(), want);

    const auto dr = rounded(d, half);
    std::vector<float> dw2(kOut * kH), db2(kOut), dh(kBT * kH), dp(kBT * kH), db1(kH), dw1(kH * kC),
        dx(kBT * kC);
    cpu::matmul(dw2.data(), dr.data(), h.data(), kOut, kH, kBT, true, false, 1.0f, 0.0f);
    cpu::sum_first_dim(db2.data(), dr.data(), kBT, kOut, false);
    cpu::matmul(dh.data(), dr.data(), w2r.data(), kBT, kH, kOut, false, false, 1.0f, 0.0f);
    cpu::gelu_backward(dp.data(), pre.data(), dh.data(), kBT * kH);
    dp = rounded(Tensor::from_vector(dp, {kBT, kH}), half);
    cpu::sum_first_dim(db1.data(), dp.data(), kBT, kH, false);
    cpu::matmul(dw1.data(), dp.data(), xr.data(), kH, kC, kBT, true, false, 1.0f, 0.0f);
    cpu::matmul(dx.data(), dp.data(), w1r.data(), kBT, kC, kH, false, false, 1.0f, 0.0f);
    ASSERT_EQ(g.size(), 6u);
    EXPECT_EQ(g[0].to_vector(), dx);
    EXPECT_EQ(g[1].to_vector(), dw1);
    EXPECT_EQ(g[2].to_vector(), db1);
    EXPECT_EQ(g[3].to_vector(), dw2);
    EXPECT_EQ(g[4].to_vector(), db2);
    EXPECT_EQ(g[5].to_vector(), d.to_vector()) << "the residual's gradient is the output's";
  }
}

TEST(GeluMlp, FollowsTheSeparateOpsWithinHalfPrecision) {
  for (const DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    const Mlp m(30);
    const Tensor d = rnd({kB, kT, kOut}, 40);
    AutocastGuard autocast(half);
    const Tensor fused = gelu_mlp(m.x, m.w1, m.b1, m.w2, m.b2, m.r);
    const Tensor apart =
        linear_residual(m.r, gelu(linear(m.x, m.w1, m.b1, half), half), m.w2, m.b2);
    const double tol = half == DType::bf16 ? 2e-2 : 4e-3;
    EXPECT_LT(rel_diff(fused, apart), tol);
    const auto g1 = grad({fused}, {d}, m.all()), g2 = grad({apart}, {d}, m.all());
    for (size_t i = 0; i < g1.size(); ++i) {
      EXPECT_EQ(g1[i].dtype(), g2[i].dtype()) << i;
      EXPECT_LT(rel_diff(g1[i], g2[i]), tol) << i;
    }
    // Without a residual or biases, and with an input handed over in the half type, whose
    // gradient is then in that type too.
    const Tensor xh = m.x.to(half).set_requires_grad(true);
    const Tensor plain = gelu_mlp(xh, m.w1, Tensor(), m.w2, Tensor());
    const Tensor plain_apart = linear(gelu(linear(xh, m.w1, Tensor(), half), half), m.w2, Tensor());
    EXPECT_LT(rel_diff(plain, plain_apart), tol);
    const auto gx = grad({plain}, {d}, {xh});
    EXPECT_EQ(gx[0].dtype(), half);
    EXPECT_LT(rel_diff(gx[0], grad({plain_apart}, {d}, {xh})[0]), tol);
  }
}

TEST(GeluMlp, NamesWhatIsWrong) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Mlp m(50);
  EXPECT_NE(message([&] {
              (void)gelu_mlp(m.x, m.w1, m.b1, m.w2, m.b2);
            }).find("gelu_mlp: runs under autocast"),
            std::string::npos);
  AutocastGuard autocast(DType::bf16);
  EXPECT_NE(message([&] { (void)gelu_mlp(m.x, m.w2, m.b1, m.w1, m.b2); }).find("do not chain"),
            std::string::npos);
  EXPECT_NE(message([&] {
              (void)gelu_mlp(m.x, m.w1, m.b2, m.w2, m.b2);
            }).find("gelu_mlp: b_fc [6] does not match w_fc [16, 8]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              (void)gelu_mlp(m.x, m.w1, m.b1, m.w2, m.b2, rnd({2, 2}, 1));
            }).find("gelu_mlp: residual [2, 2] does not match"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain::autograd
