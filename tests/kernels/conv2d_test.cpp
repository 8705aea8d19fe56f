// Convolution kernels. The reference (im2col + matmul) is checked against direct loops in double
// on small shapes; oneDNN is then held to the reference on a grid of strides, paddings,
// dilations, groups, kernel sizes and bias. Both are float sums over up to a few hundred products
// in different orders, so they agree to ~1e-6 of the array's scale; 1e-5 (relative to the largest
// entry, plus 1e-4 relative per entry) leaves room without hiding a wrong index, which is off by
// the size of a whole term.
#include "meshtrain/tensor/cpu/conv2d.h"

#include <algorithm>
#include <string>

#include "meshtrain/util/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

struct Grads {
  DVec out, dinp, dweight, dbias;
};

// Forward and all three gradients by the definition, in double.
Grads direct(const Vec& x, const Vec& w, const Vec& b, const Vec& dout, const Conv2dShape& s) {
  const int64_t OH = s.out_h(), OW = s.out_w(), Cg = s.C_in / s.groups, Og = s.C_out / s.groups;
  Grads r;
  r.out.assign(static_cast<size_t>(s.N * s.C_out * OH * OW), 0.0);
  r.dinp.assign(x.size(), 0.0);
  r.dweight.assign(w.size(), 0.0);
  r.dbias.assign(static_cast<size_t>(s.C_out), 0.0);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t oc = 0; oc < s.C_out; ++oc) {
      const int64_t g = oc / Og;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const size_t o = static_cast<size_t>(((n * s.C_out + oc) * OH + oh) * OW + ow);
          double acc = b.empty() ? 0.0 : b[static_cast<size_t>(oc)];
          r.dbias[static_cast<size_t>(oc)] += dout[o];
          for (int64_t ic = 0; ic < Cg; ++ic)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t ih = oh * s.stride_h - s.pad_h + kh * s.dil_h;
                const int64_t iw = ow * s.stride_w - s.pad_w + kw * s.dil_w;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const size_t xi =
                    static_cast<size_t>(((n * s.C_in + g * Cg + ic) * s.H + ih) * s.W + iw);
                const size_t wi = static_cast<size_t>(((oc * Cg + ic) * s.KH + kh) * s.KW + kw);
                acc += static_cast<double>(x[xi]) * w[wi];
                r.dinp[xi] += static_cast<double>(w[wi]) * dout[o];
                r.dweight[wi] += static_cast<double>(x[xi]) * dout[o];
              }
          r.out[o] = acc;
        }
    }
  return r;
}

struct Case {
  Conv2dShape s;
  bool bias;
  std::string name() const { return s.str() + (bias ? " bias" : " no bias"); }
};

struct ConvRun {
  Vec out, dinp, dweight, dbias;
};

ConvRun run(ConvImpl impl, const Case& c, const Vec& x, const Vec& w, const Vec& b,
            const Vec& dout) {
  const Conv2dShape& s = c.s;
  ConvRun r;
  r.out = random_vec(static_cast<size_t>(s.N * s.C_out * s.out_h() * s.out_w()), 90);
  r.dinp = random_vec(x.size(), 91);  // garbage: the kernels write, they do not add
  r.dweight = random_vec(w.size(), 92);
  r.dbias = random_vec(static_cast<size_t>(s.C_out), 93);
  conv2d_forward(r.out.data(), x.data(), w.data(), c.bias ? b.data() : nullptr, s, impl);
  conv2d_backward_data(r.dinp.data(), dout.data(), w.data(), s, impl);
  conv2d_backward_weights(r.dweight.data(), c.bias ? r.dbias.data() : nullptr, dout.data(),
                          x.data(), s, impl);
  return r;
}

struct Inputs {
  Vec x, w, b, dout;
  explicit Inputs(const Conv2dShape& s, uint32_t seed)
      : x(random_vec(static_cast<size_t>(s.N * s.C_in * s.H * s.W), seed)),
        w(random_vec(static_cast<size_t>(s.C_out * (s.C_in / s.groups) * s.KH * s.KW), seed + 1)),
        b(random_vec(static_cast<size_t>(s.C_out), seed + 2)),
        dout(random_vec(static_cast<size_t>(s.N * s.C_out * s.out_h() * s.out_w()), seed + 3)) {}
};

Conv2dShape shape(int64_t N, int64_t C_in, int64_t H, int64_t W, int64_t C_out, int64_t K,
                  int64_t stride, int64_t pad, int64_t dil, int64_t groups) {
  Conv2dShape s;
  s.N = N;
  s.C_in = C_in;
  s.H = H;
  s.W = W;
  s.C_out = C_out;
  s.KH = s.KW = K;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  s.dil_h = s.dil_w = dil;
  s.groups = groups;
  return s;
}

TEST(Conv2dReference, MatchesDirectLoops) {
  std::vector<Case> cases = {
      {shape(2, 4, 7, 6, 6, 3, 1, 1, 1, 1), true},  {shape(2, 4, 7, 6, 6, 3, 2, 0, 1, 2), false},
      {shape(1, 3, 9, 8, 4, 3, 1, 2, 2, 1), true},  {shape(2, 4, 5, 5, 4, 1, 2, 0, 1, 4), true},
      {shape(1, 2, 8, 9, 3, 5, 2, 2, 1, 1), false},
  };
  // Rectangular kernel, stride, padding and dilation: the h and w paths must not be swapped.
  Conv2dShape rect = shape(1, 2, 9, 7, 3, 3, 1, 1, 1, 1);
  rect.KW = 2;
  rect.stride_w = 2;
  rect.pad_h = 2;
  rect.dil_w = 2;
  cases.push_back({rect, true});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    const Inputs in(c.s, 7);
    const ConvRun got = run(ConvImpl::reference, c, in.x, in.w, in.b, in.dout);
    const Grads want = direct(in.x, in.w, c.bias ? in.b : Vec(), in.dout, c.s);
    expect_close(got.out, want.out, 1e-5, 1e-5, "out");
    expect_close(got.dinp, want.dinp, 1e-5, 1e-5, "dinp");
    expect_close(got.dweight, want.dweight, 1e-5, 1e-5, "dweight");
    if (c.bias) expect_close(got.dbias, want.dbias, 1e-5, 1e-5, "dbias");
  }
}

TEST(Conv2dOnednn, MatchesReferenceOnAGridOfShapes) {
  int checked = 0;
  for (int64_t K : {1, 3, 7})
    for (int64_t stride : {1, 2})
      for (int64_t pad : {0, 1})
        for (int64_t dil : {1, 2})
          for (int64_t groups : {1, 2, 8})  // 8: depthwise
            for (bool bias : {false, true}) {
              const int64_t H = K == 7 ? 16 : 9, C_in = 8, C_out = groups == 8 ? 16 : 6;
              const Case c{shape(2, C_in, H, H - 1, C_out, K, stride, pad, dil, groups), bias};
              SCOPED_TRACE(c.name());
              const Inputs in(c.s, static_cast<uint32_t>(11 + checked));
              const ConvRun ref = run(ConvImpl::reference, c, in.x, in.w, in.b, in.dout);
              const ConvRun got = run(ConvImpl::onednn, c, in.x, in.w, in.b, in.dout);
              expect_close(got.out, to_double(ref.out), 1e-4, 1e-5, "out");
              expect_close(got.dinp, to_double(ref.dinp), 1e-4, 1e-5, "dinp");
              expect_close(got.dweight, to_double(ref.dweight), 1e-4, 1e-5, "dweight");
              if (bias) expect_close(got.dbias, to_double(ref.dbias), 1e-4, 1e-5, "dbias");
              ++checked;
            }
  EXPECT_EQ(checked, 3 * 2 * 2 * 2 * 3 * 2);
}

TEST(Conv2dOnednn, RectangularWindowsKeepHeightAndWidthApart) {
  // Every window parameter differs between height and width, so a swap anywhere shows.
  Conv2dShape s = shape(2, 4, 11, 9, 6, 3, 1, 1, 1, 2);
  s.KW = 2;
  s.stride_w = 2;
  s.pad_h = 2;
  s.dil_w = 2;
  for (bool bias : {false, true}) {
    const Case c{s, bias};
    SCOPED_TRACE(c.name());
    const Inputs in(c.s, 21);
    const ConvRun got = run(ConvImpl::onednn, c, in.x, in.w, in.b, in.dout);
    const Grads want = direct(in.x, in.w, bias ? in.b : Vec(), in.dout, c.s);
    expect_close(got.out, want.out, 1e-4, 1e-5, "out");
    expect_close(got.dinp, want.dinp, 1e-4, 1e-5, "dinp");
    expect_close(got.dweight, want.dweight, 1e-4, 1e-5, "dweight");
    if (bias) expect_close(got.dbias, want.dbias, 1e-4, 1e-5, "dbias");
  }
}

TEST(Conv2dOnednn, ResNetStemAndDownsampleShapes) {
  // The 7x7/2 stem on 3 channels (oneDNN keeps a plain layout for so few input channels) and a
  // 1x1/2 downsample: layouts the small grid above does not reach.
  for (const Case& c : {Case{shape(2, 3, 32, 32, 16, 7, 2, 3, 1, 1), false},
                        Case{shape(2, 32, 8, 8, 64, 1, 2, 0, 1, 1), false},
                        Case{shape(2, 64, 8, 8, 64, 3, 1, 1, 1, 1), true}}) {
    SCOPED_TRACE(c.name());
    const Inputs in(c.s, 5);
    const ConvRun ref = run(ConvImpl::reference, c, in.x, in.w, in.b, in.dout);
    const ConvRun got = run(ConvImpl::onednn, c, in.x, in.w, in.b, in.dout);
    expect_close(got.out, to_double(ref.out), 1e-4, 1e-5, "out");
    expect_close(got.dinp, to_double(ref.dinp), 1e-4, 1e-5, "dinp");
    expect_close(got.dweight, to_double(ref.dweight), 1e-4, 1e-5, "dweight");
    if (c.bias) expect_close(got.dbias, to_double(ref.dbias), 1e-4, 1e-5, "dbias");
  }
}

TEST(Conv2dOnednn, PrimitivesAreCreatedOncePerShape) {
  const Case c{shape(2, 4, 6, 6, 8, 3, 1, 1, 1, 1), true};
  const Inputs in(c.s, 3);
  const ConvCacheStats before = conv_cache_stats();
  const ConvRun first = run(ConvImpl::onednn, c, in.x, in.w, in.b, in.dout);
  const ConvCacheStats after_first = conv_cache_stats();
  EXPECT_EQ(after_first.created - before.created, 3);  // forward, backward data, backward weights
  const ConvRun second = run(ConvImpl::onednn, c, in.x, in.w, in.b, in.dout);
  EXPECT_EQ(conv_cache_stats().created, after_first.created);
  EXPECT_EQ(first.out, second.out);  // the cached primitive computes the same thing again
  EXPECT_EQ(first.dweight, second.dweight);
  // Another batch size is another shape.
  Case other = c;
  other.s.N = 3;
  const Inputs in3(other.s, 4);
  run(ConvImpl::onednn, other, in3.x, in3.w, in3.b, in3.dout);
  EXPECT_EQ(conv_cache_stats().created - after_first.created, 3);
}

TEST(Conv2d, EmptyBatchWritesZeroGradients) {
  for (ConvImpl impl : {ConvImpl::onednn, ConvImpl::reference}) {
    const Conv2dShape s = shape(0, 4, 6, 6, 8, 3, 1, 1, 1, 1);
    Vec w = random_vec(8 * 4 * 9, 1), dw = random_vec(8 * 4 * 9, 2), db = random_vec(8, 3);
    conv2d_forward(nullptr, nullptr, w.data(), nullptr, s, impl);
    conv2d_backward_data(nullptr, nullptr, w.data(), s, impl);
    conv2d_backward_weights(dw.data(), db.data(), nullptr, nullptr, s, impl);
    EXPECT_EQ(dw, Vec(dw.size(), 0.0f));
    EXPECT_EQ(db, Vec(db.size(), 0.0f));
  }
}

TEST(Conv2d, ScopedImplSelectsAndRestores) {
  EXPECT_EQ(conv_impl(), ConvImpl::onednn);
  {
    ScopedConvImpl ref(ConvImpl::reference);
    EXPECT_EQ(conv_impl(), ConvImpl::reference);
    {
      ScopedConvImpl back(ConvImpl::onednn);
      EXPECT_EQ(conv_impl(), ConvImpl::onednn);
    }
    EXPECT_EQ(conv_impl(), ConvImpl::reference);
  }
  EXPECT_EQ(conv_impl(), ConvImpl::onednn);
  EXPECT_NE(onednn_config().find("oneDNN"), std::string::npos) << onednn_config();
}

// The inference convolution (oneDNN's with a ReLU post-op, the reference's convolve-then-clamp)
// against the direct loops, ReLU applied in double: the same tolerances as the forward above.
TEST(Conv2dInference, ReluPostOpMatchesDirectLoops) {
  int checked = 0;
  for (const Conv2dShape& s :
       {shape(2, 8, 9, 8, 6, 3, 1, 1, 1, 1), shape(2, 8, 9, 8, 6, 3, 2, 0, 1, 2),
        shape(2, 8, 9, 9, 8, 3, 1, 1, 1, 8), shape(2, 3, 16, 16, 16, 7, 2, 3, 1, 1),
        shape(2, 16, 8, 8, 32, 1, 2, 0, 1, 1), shape(1, 4, 10, 10, 4, 3, 1, 2, 2, 1)})
    for (bool bias : {false, true})
      for (bool relu : {false, true}) {
        const Case c{s, bias};
        SCOPED_TRACE(c.name() + (relu ? " relu" : " no relu"));
        const Inputs in(s, static_cast<uint32_t>(31 + checked));
        DVec want = direct(in.x, in.w, bias ? in.b : Vec(), in.dout, s).out;
        if (relu)
          for (double& v : want) v = std::max(v, 0.0);
        for (ConvImpl impl : {ConvImpl::onednn, ConvImpl::reference}) {
          Vec out = random_vec(want.size(), 94);  // garbage: the kernel writes every entry
          conv2d_forward_inference(out.data(), in.x.data(), in.w.data(),
                                   bias ? in.b.data() : nullptr, s, relu, impl);
          expect_close(out, want, 1e-4, 1e-5,
                       impl == ConvImpl::onednn ? "onednn out" : "reference out");
          if (relu) {
            EXPECT_TRUE(std::ranges::none_of(out, [](float v) { return v < 0.0f; }));
          }
        }
        ++checked;
      }
  EXPECT_EQ(checked, 6 * 2 * 2);
}

// With and without the post-op are two primitives of one shape, each created once.
TEST(Conv2dInference, PrimitivesAreCreatedOncePerShapeAndPostOp) {
  const Conv2dShape s = shape(2, 4, 6, 6, 8, 3, 1, 1, 1, 1);
  const Inputs in(s, 4);
  Vec out(static_cast<size_t>(s.N * s.C_out * s.out_h() * s.out_w()));
  const ConvCacheStats before = conv_cache_stats();
  for (int i = 0; i < 2; ++i)
    for (bool relu : {false, true})
      conv2d_forward_inference(out.data(), in.x.data(), in.w.data(), in.b.data(), s, relu,
                               ConvImpl::onednn);
  EXPECT_EQ(conv_cache_stats().created - before.created, 2);
}

}  // namespace
}  // namespace meshtrain::cpu::testing
