// GELU (tanh form) and softmax against double references and finite differences. The float exp
// and tanh used by the kernels are within a few ulp, so 1e-5 relative (of the array scale for
// values near zero) is the bound; gradients get 1e-4 because the finite differences and the float
// kernels each lose a digit on small entries.
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/softmax.h"

#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

DVec ref_gelu(const DVec& x) {
  DVec out(x.size());
  const double k = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  }
  return out;
}

DVec ref_softmax(const DVec& x, int64_t N, int64_t C) {
  DVec out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double m = -INFINITY;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[n * C + c]);
    double s = 0.0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[n * C + c] - m);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = std::exp(x[n * C + c] - m) / s;
  }
  return out;
}

TEST(Gelu, ForwardMatchesReference) {
  for (int64_t n : {1, 7, 1000, 4099}) {
    const Vec x = random_vec(n, 1, -8.0f, 8.0f);
    Vec out(n);
    gelu_forward(out.data(), x.data(), n);
    expect_close(out, ref_gelu(to_double(x)), 1e-5, 1e-6, "gelu");
  }
  // Near zero, where tanh switches from its series to its exp form.
  const Vec tiny = random_vec(513, 2, -0.3f, 0.3f);
  Vec out(tiny.size());
  gelu_forward(out.data(), tiny.data(), tiny.size());
  expect_close(out, ref_gelu(to_double(tiny)), 1e-5, 1e-6, "gelu near 0");
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 777;
  const Vec x = random_vec(n, 3, -5.0f, 5.0f), dout = random_vec(n, 4), d0 = random_vec(n, 5);
  Vec dx = d0;
  gelu_backward(dx.data(), x.data(), dout.data(), n);
  const DVec g = numeric_grad(ref_gelu, to_double(x), to_double(dout));
  expect_close(dx, g, 1e-4, 1e-5, "gelu dinp");  // written over its random initial contents
}

// Far out, GELU is the identity (derivative 1) or -0 (derivative 0): not x / FLT_MAX, and no NaN
// or infinite gradient once x^2 or x^3 overflows; infinities included. NaN stays NaN.
TEST(Gelu, SaturatedInputsGiveTheIdentityOrZeroWithFiniteGradients) {
  const float inf = std::numeric_limits<float>::infinity(), big = 3.0e38f;
  const Vec x = {-big, -1e20f, -5e19f, -1e6f, -11.0f, -inf, 1e20f, 6e19f, big, inf, 12.0f};
  const auto n = static_cast<int64_t>(x.size());
  Vec y(x.size()), dx(x.size());
  const Vec ones(x.size(), 1.0f);
  gelu_forward(y.data(), x.data(), n);
  gelu_backward(dx.data(), x.data(), ones.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(x[i]);
    if (x[i] < 0) {
      EXPECT_EQ(y[i], 0.0f);
      EXPECT_TRUE(std::signbit(y[i]));
      EXPECT_EQ(dx[i], 0.0f);
    } else {
      EXPECT_EQ(y[i], x[i]);
      EXPECT_EQ(dx[i], 1.0f);
    }
  }
  const Vec nan = {std::numeric_limits<float>::quiet_NaN()};
  gelu_forward(y.data(), nan.data(), 1);
  gelu_backward(dx.data(), nan.data(), ones.data(), 1);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_TRUE(std::isnan(dx[0]));
  // Just inside the clamp GELU is still its tiny negative value.
  const Vec edge = {-10.0f};
  gelu_forward(y.data(), edge.data(), 1);
  EXPECT_LT(y[0], 0.0f);
}

TEST(Gelu, ThreadCountDoesNotChangeBits) {
  const int64_t n = 100003;
  const Vec x = random_vec(n, 6, -4.0f, 4.0f), dout = random_vec(n, 7);
  expect_thread_independent([&] {
    Vec out(n), dx(n, 1.0f);
    gelu_forward(out.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), dout.data(), n);
    return std::vector<Vec>{out, dx};
  });
}

TEST(Softmax, ForwardMatchesReferenceAndIsStable) {
  const int64_t shapes[][2] = {{1, 1}, {4, 9}, {31, 128}, {5, 1003}};
  for (const auto& s : shapes) {
    const int64_t N = s[0], C = s[1];
    for (float range : {1.0f, 30.0f}) {
      Vec x = random_vec(N * C, 8, -range, range);
      x[0] += 1000.0f;  // a huge logit must not overflow
      Vec out(N * C);
      softmax_forward(out.data(), x.data(), N, C);
      expect_close(out, ref_softmax(to_double(x), N, C), 1e-5, 1e-7, "softmax");
    }
  }
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  const int64_t N = 6, C = 37;
  const Vec x = random_vec(N * C, 9, -3.0f, 3.0f), dout = random_vec(N * C, 10);
  const Vec d0 = random_vec(N * C, 11);
  Vec out(N * C), dx = d0;
  softmax_forward(out.data(), x.data(), N, C);
  softmax_backward(dx.data(), dout.data(), out.data(), N, C);
  const DVec g = numeric_grad([&](const DVec& v) { return ref_softmax(v, N, C); }, to_double(x),
                              to_double(dout));
  expect_close(dx, plus(d0, g), 1e-4, 1e-5, "softmax dinp");
}

TEST(Softmax, ThreadCountDoesNotChangeBits) {
  const int64_t N = 257, C = 301;
  const Vec x = random_vec(N * C, 12, -5.0f, 5.0f), dout = random_vec(N * C, 13);
  expect_thread_independent([&] {
    Vec out(N * C), dx(N * C, 0.0f);
    softmax_forward(out.data(), x.data(), N, C);
    softmax_backward(dx.data(), dout.data(), out.data(), N, C);
    return std::vector<Vec>{out, dx};
  });
}

}  // namespace
}  // namespace meshtrain::cpu::testing
