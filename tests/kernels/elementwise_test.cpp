// Elementwise arithmetic, unary math, reductions and dropout against double loops. Single float
// operations are correctly rounded (6e-8 relative); the vectorised exp/tanh are allowed 4e-7
// relative (2 ulp plus the input's own rounding); float row reductions 1e-5.
#include "meshtrain/tensor/cpu/elementwise.h"
#include "meshtrain/tensor/cpu/dropout.h"
#include "meshtrain/tensor/cpu/reduce.h"
#include "meshtrain/tensor/cpu/vec_math.h"

#include "meshtrain/util/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

TEST(Elementwise, BinaryOpsSameShapeAndRowBroadcast) {
  const int64_t N = 37, C = 53;
  const Vec a = random_vec(N * C, 1), b = random_vec(N * C, 2, 0.5f, 2.0f),
            r = random_vec(C, 3, 0.5f, 2.0f);
  using Op = void (*)(float*, const float*, const float*, int64_t);
  using RowOp = void (*)(float*, const float*, const float*, int64_t, int64_t);
  const Op ops[] = {add, sub, mul, div};
  const RowOp row_ops[] = {add_row, sub_row, mul_row, div_row};
  const auto apply = [](int k, double x, double y) {
    return k == 0 ? x + y : k == 1 ? x - y : k == 2 ? x * y : x / y;
  };
  for (int k = 0; k < 4; ++k) {
    Vec out(N * C), out_row(N * C);
    ops[k](out.data(), a.data(), b.data(), N * C);
    row_ops[k](out_row.data(), a.data(), r.data(), N, C);
    DVec ref(N * C), ref_row(N * C);
    for (int64_t i = 0; i < N * C; ++i) {
      ref[i] = apply(k, a[i], b[i]);
      ref_row[i] = apply(k, a[i], r[i % C]);
    }
    expect_close(out, ref, 1e-7, 0.0, "binary");
    expect_close(out_row, ref_row, 1e-7, 0.0, "row broadcast");
  }
  Vec inplace = a;  // out may alias an input
  add(inplace.data(), inplace.data(), b.data(), N * C);
  for (int64_t i = 0; i < N * C; ++i) EXPECT_EQ(inplace[i], a[i] + b[i]);
}

TEST(Elementwise, ScaleAxpyResidual) {
  const int64_t n = 1027;
  const Vec x = random_vec(n, 4), y0 = random_vec(n, 5), g = random_vec(n, 6);
  Vec out(n), y = y0, da = y0, db = x;
  scale(out.data(), x.data(), -2.5f, n);
  axpy(y.data(), x.data(), 0.75f, n);
  residual_backward(da.data(), db.data(), g.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], x[i] * -2.5f);
    EXPECT_NEAR(y[i], y0[i] + 0.75 * x[i], 1e-7);
    EXPECT_EQ(da[i], y0[i] + g[i]);
    EXPECT_EQ(db[i], x[i] + g[i]);
  }
  residual_forward(out.data(), x.data(), g.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], x[i] + g[i]);
}

TEST(Elementwise, UnaryMathAndBackwards) {
  const int64_t n = 4001;
  const Vec x = random_vec(n, 7, -20.0f, 20.0f), pos = random_vec(n, 8, 1e-3f, 50.0f);
  const Vec g = random_vec(n, 9), d0 = random_vec(n, 10);
  Vec e(n), l(n), t(n), s(n);
  exp(e.data(), x.data(), n);
  log(l.data(), pos.data(), n);
  tanh(t.data(), x.data(), n);
  sqrt(s.data(), pos.data(), n);
  DVec re(n), rl(n), rt(n), rs(n);
  for (int64_t i = 0; i < n; ++i) {
    re[i] = std::exp(static_cast<double>(x[i]));
    rl[i] = std::log(static_cast<double>(pos[i]));
    rt[i] = std::tanh(static_cast<double>(x[i]));
    rs[i] = std::sqrt(static_cast<double>(pos[i]));
  }
  expect_close(e, re, 4e-7, 0.0, "exp");
  expect_close(l, rl, 1e-7, 1e-8, "log");
  expect_close(t, rt, 4e-7, 1e-7, "tanh");
  expect_close(s, rs, 1e-7, 0.0, "sqrt");

  Vec de = d0, dl = d0, dt = d0, ds = d0;
  exp_backward(de.data(), g.data(), e.data(), n);
  log_backward(dl.data(), g.data(), pos.data(), n);
  tanh_backward(dt.data(), g.data(), t.data(), n);
  sqrt_backward(ds.data(), g.data(), s.data(), n);
  DVec rde(n), rdl(n), rdt(n), rds(n);
  for (int64_t i = 0; i < n; ++i) {
    rde[i] = d0[i] + g[i] * re[i];
    rdl[i] = d0[i] + g[i] / pos[i];
    rdt[i] = d0[i] + g[i] * (1 - rt[i] * rt[i]);
    rds[i] = d0[i] + g[i] * 0.5 / rs[i];
  }
  expect_close(de, rde, 1e-6, 1e-7, "exp backward");
  expect_close(dl, rdl, 1e-6, 1e-7, "log backward");
  expect_close(dt, rdt, 1e-6, 1e-7, "tanh backward");
  expect_close(ds, rds, 1e-6, 1e-7, "sqrt backward");
}

TEST(Elementwise, FastExpEdgeCases) {
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_EQ(fast_exp(-100.0f), 0.0f);
  EXPECT_TRUE(std::isinf(fast_exp(100.0f)));
  EXPECT_TRUE(std::isnan(fast_exp(std::nanf(""))));
  EXPECT_NEAR(fast_exp(88.7f) / std::exp(88.7f), 1.0f, 4e-7);
  EXPECT_NEAR(fast_exp(-87.0f) / std::exp(-87.0f), 1.0f, 4e-7);
  EXPECT_EQ(fast_tanh(0.0f), 0.0f);
  EXPECT_EQ(fast_tanh(30.0f), 1.0f);
  EXPECT_EQ(fast_tanh(-30.0f), -1.0f);
}

TEST(Reduce, LastAndFirstDimensions) {
  const int64_t N = 29, C = 131;
  const Vec x = random_vec(N * C, 11, -3.0f, 3.0f);
  Vec sl(N), ml(N), mx(N), sf(C), mf(C), acc = random_vec(C, 12);
  const Vec acc0 = acc;
  std::vector<int32_t> am(N);
  sum_last_dim(sl.data(), x.data(), N, C);
  mean_last_dim(ml.data(), x.data(), N, C);
  max_last_dim(mx.data(), am.data(), x.data(), N, C);
  sum_first_dim(sf.data(), x.data(), N, C);
  mean_first_dim(mf.data(), x.data(), N, C);
  sum_first_dim(acc.data(), x.data(), N, C, /*accumulate=*/true);
  DVec rsl(N, 0.0), rml(N), rmx(N, -INFINITY), rsf(C, 0.0), rmf(C), racc(acc0.begin(), acc0.end());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const double v = x[n * C + c];
      rsl[n] += v;
      rsf[c] += v;
      racc[c] += v;
      if (v > rmx[n]) rmx[n] = v;
    }
    rml[n] = rsl[n] / C;
    EXPECT_EQ(x[n * C + am[n]], mx[n]);
  }
  for (int64_t c = 0; c < C; ++c) rmf[c] = rsf[c] / N;
  expect_close(sl, rsl, 1e-5, 1e-6, "sum_last_dim");
  expect_close(ml, rml, 1e-5, 1e-6, "mean_last_dim");
  expect_close(mx, rmx, 0.0, 0.0, "max_last_dim");
  expect_close(sf, rsf, 1e-5, 1e-6, "sum_first_dim");
  expect_close(mf, rmf, 1e-5, 1e-6, "mean_first_dim");
  expect_close(acc, racc, 1e-5, 1e-6, "sum_first_dim accumulate");
}

TEST(Reduce, FlatSumsInDouble) {
  for (int64_t n : {0, 1, 63, 65, 100003}) {
    const Vec x = random_vec(n, 13, -2.0f, 2.0f);
    long double sq = 0.0L, s = 0.0L;
    for (float v : x) {
      sq += static_cast<long double>(v) * v;
      s += v;
    }
    EXPECT_NEAR(sum_squares(x.data(), n), static_cast<double>(sq), 1e-12 * (1.0 + sq));
    EXPECT_NEAR(sum_all(x.data(), n), static_cast<double>(s), 1e-12 * (1.0 + n));
  }
}

TEST(Dropout, MaskRateScaleAndBackward) {
  const int64_t n = 200000;
  const float p = 0.3f;
  const Vec x = random_vec(n, 14, 0.5f, 1.5f), g = random_vec(n, 15);
  Vec out(n), dx(n, 0.0f);
  dropout_forward(out.data(), x.data(), n, p, 42);
  dropout_backward(dx.data(), g.data(), n, p, 42);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(42, i, p);
    kept += keep;
    EXPECT_EQ(out[i], keep ? x[i] * (1.0f / 0.7f) : 0.0f);
    EXPECT_EQ(dx[i], keep ? g[i] * (1.0f / 0.7f) : 0.0f);
  }
  // Binomial(n, 0.7): the standard deviation of the kept count is about 205; allow 6 of them.
  EXPECT_NEAR(static_cast<double>(kept), 0.7 * n, 6 * std::sqrt(n * 0.7 * 0.3));
  // The offset selects a window of the same mask stream; another seed gives another mask.
  Vec window(100), other(n);
  dropout_forward(window.data(), x.data() + 1000, 100, p, 42, 1000);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(window[i], out[1000 + i]);
  dropout_forward(other.data(), x.data(), n, p, 43);
  EXPECT_NE(0, std::memcmp(other.data(), out.data(), n * sizeof(float)));
  // p = 0 is the identity and p = 1 drops everything; p outside [0, 1] is an error.
  dropout_forward(out.data(), x.data(), n, 0.0f, 7);
  EXPECT_EQ(0, std::memcmp(out.data(), x.data(), n * sizeof(float)));
  dropout_forward(out.data(), x.data(), n, 1.0f, 7);
  for (float v : out) ASSERT_EQ(v, 0.0f);
  EXPECT_THROW(dropout_forward(out.data(), x.data(), n, 1.5f, 7), Error);
}

TEST(Elementwise, ThreadCountDoesNotChangeBits) {
  const int64_t N = 513, C = 389;
  const Vec a = random_vec(N * C, 16), b = random_vec(N * C, 17, 0.5f, 2.0f), r = random_vec(C, 18);
  expect_thread_independent([&] {
    Vec o1(N * C), o2(N * C), o3(N * C), o4(N * C), sl(N), sf(C), mx(N), dx(N * C, 0.0f);
    std::vector<int32_t> am(N);
    div(o1.data(), a.data(), b.data(), N * C);
    mul_row(o2.data(), a.data(), r.data(), N, C);
    exp(o3.data(), a.data(), N * C);
    tanh(o4.data(), a.data(), N * C);
    Vec o5(N * C);
    sqrt(o5.data(), b.data(), N * C);
    sum_last_dim(sl.data(), a.data(), N, C);
    sum_first_dim(sf.data(), a.data(), N, C);
    max_last_dim(mx.data(), am.data(), a.data(), N, C);
    dropout_backward(dx.data(), a.data(), N * C, 0.1f, 5);
    const Vec sums{
        static_cast<float>(sum_squares(a.data(), N * C)),
        static_cast<float>(sum_squares(a.data(), N * C) -
                           static_cast<double>(static_cast<float>(sum_squares(a.data(), N * C)))),
        static_cast<float>(sum_all(a.data(), N * C))};
    return std::vector<Vec>{o1, o2, o3, o4, o5, sl, sf, mx, dx, sums};
  });
}

}  // namespace
}  // namespace meshtrain::cpu::testing
