// LayerNorm against a double reference; the backward against central differences of that
// reference. Per-row reductions in float over C <= 200 elements stay within ~1e-6 relative, so
// 1e-5 tolerances (1e-4 for gradients, which subtract nearly equal terms) leave margin.
#include "meshtrain/tensor/cpu/layer_norm.h"

#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

constexpr double kEps = 1e-5;

// Returns out, and fills mean/rstd when given.
DVec ref_layer_norm(const DVec& x, const DVec& w, const DVec& b, int64_t N, int64_t C,
                    DVec* mean = nullptr, DVec* rstd = nullptr) {
  DVec out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0.0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    double var = 0.0;
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - m) * (x[n * C + c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + kEps);
    for (int64_t c = 0; c < C; ++c) {
      const double wc = w.empty() ? 1.0 : w[c];
      const double bc = b.empty() ? 0.0 : b[c];
      out[n * C + c] = (x[n * C + c] - m) * s * wc + bc;
    }
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = s;
  }
  return out;
}

TEST(LayerNorm, ForwardMatchesReference) {
  const int64_t shapes[][2] = {{1, 1}, {3, 7}, {17, 128}, {9, 385}};
  for (const auto& s : shapes) {
    const int64_t N = s[0], C = s[1];
    const Vec x = random_vec(N * C, 1, -3.0f, 5.0f), w = random_vec(C, 2), b = random_vec(C, 3);
    Vec out(N * C), mean(N), rstd(N);
    layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                       static_cast<float>(kEps));
    DVec rm(N), rs(N);
    const DVec ro = ref_layer_norm(to_double(x), to_double(w), to_double(b), N, C, &rm, &rs);
    expect_close(out, ro, 1e-5, 1e-5, "out");
    expect_close(mean, rm, 1e-5, 1e-6, "mean");
    expect_close(rstd, rs, 1e-5, 1e-6, "rstd");
    Vec plain(N * C);
    layer_norm_forward(plain.data(), nullptr, nullptr, x.data(), nullptr, nullptr, N, C,
                       static_cast<float>(kEps));
    expect_close(plain, ref_layer_norm(to_double(x), {}, {}, N, C), 1e-5, 1e-5, "no affine");
  }
}

// A row of equal values (padding, a constant feature) whose sum is exact normalises to exactly 0
// (the bias): its mean must be its value, which a sum times a rounded 1 / C missed by an ulp that
// rstd = 1 / sqrt(eps) magnified (1000.25 over 7 columns gave -0.019).
TEST(LayerNorm, RowsOfEqualValuesNormaliseToTheBias) {
  for (const float v : {1000.25f, 0.75f, -3.5f})
    for (const int64_t C : {1, 3, 7, 100, 1537}) {
      const Vec x(static_cast<size_t>(C), v), b = random_vec(C, 4);
      Vec out(static_cast<size_t>(C)), mean(1), rstd(1);
      layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), nullptr, b.data(), 1, C,
                         static_cast<float>(kEps));
      EXPECT_EQ(mean[0], v) << v << " over " << C;
      EXPECT_EQ(out, b) << v << " over " << C;
    }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t shapes[][2] = {{2, 3}, {5, 17}, {6, 64}};
  for (const auto& s : shapes) {
    const int64_t N = s[0], C = s[1];
    const Vec x = random_vec(N * C, 4, -2.0f, 2.0f), w = random_vec(C, 5), b = random_vec(C, 6);
    const Vec dout = random_vec(N * C, 7);
    Vec out(N * C), mean(N), rstd(N);
    layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                       static_cast<float>(kEps));
    const Vec dx0 = random_vec(N * C, 8), dw0 = random_vec(C, 9), db0 = random_vec(C, 10);
    Vec dx = dx0, dw = dw0, db = db0;
    layer_norm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                        mean.data(), rstd.data(), N, C);
    const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b), gd = to_double(dout);
    const DVec gx =
        numeric_grad([&](const DVec& v) { return ref_layer_norm(v, wd, bd, N, C); }, xd, gd);
    const DVec gw =
        numeric_grad([&](const DVec& v) { return ref_layer_norm(xd, v, bd, N, C); }, wd, gd);
    const DVec gb =
        numeric_grad([&](const DVec& v) { return ref_layer_norm(xd, wd, v, N, C); }, bd, gd);
    expect_close(dx, gx, 1e-4, 1e-5, "dinp");  // written over its random initial contents
    expect_close(dw, plus(dw0, gw), 1e-4, 1e-5, "dweight");
    expect_close(db, plus(db0, gb), 1e-4, 1e-5, "dbias");

    // Without weight the reference is the plain normalisation.
    Vec dx_plain = dx0;
    layer_norm_backward(dx_plain.data(), nullptr, nullptr, dout.data(), x.data(), nullptr,
                        mean.data(), rstd.data(), N, C);
    const DVec gp =
        numeric_grad([&](const DVec& v) { return ref_layer_norm(v, {}, {}, N, C); }, xd, gd);
    expect_close(dx_plain, gp, 1e-4, 1e-5, "dinp without weight");
  }
}

// Adding the input gradient to what dinp holds gives the bits of writing it and adding apart (no
// multiply-add fused across the two), threaded or not.
TEST(LayerNorm, AccumulatedInputGradientIsTheSeparateSum) {
  for (const int64_t N : {int64_t{3}, int64_t{301}}) {
    const int64_t C = 131;
    const Vec x = random_vec(N * C, 21), w = random_vec(C, 22), dout = random_vec(N * C, 23);
    const Vec prior = random_vec(N * C, 24);
    Vec out(N * C), mean(N), rstd(N);
    layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                       1e-5f);
    Vec fresh(N * C), summed = prior;
    layer_norm_backward(fresh.data(), nullptr, nullptr, dout.data(), x.data(), w.data(),
                        mean.data(), rstd.data(), N, C);
    layer_norm_backward(summed.data(), nullptr, nullptr, dout.data(), x.data(), w.data(),
                        mean.data(), rstd.data(), N, C, true);
    Vec apart(N * C);
    for (int64_t i = 0; i < N * C; ++i) apart[i] = prior[i] + fresh[i];
    EXPECT_EQ(summed, apart) << "N = " << N;
  }
}

TEST(LayerNorm, ThreadCountDoesNotChangeBits) {
  const int64_t N = 301, C = 131;  // large enough for the threaded paths
  const Vec x = random_vec(N * C, 11), w = random_vec(C, 12), b = random_vec(C, 13);
  const Vec dout = random_vec(N * C, 14);
  expect_thread_independent([&] {
    Vec out(N * C), mean(N), rstd(N), dx(N * C, 0.5f), dw(C, 0.25f), db(C, -1.0f);
    layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                       1e-5f);
    layer_norm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                        mean.data(), rstd.data(), N, C);
    return std::vector<Vec>{out, mean, rstd, dx, dw, db};
  });
}

}  // namespace
}  // namespace meshtrain::cpu::testing
