// Pooling and ReLU kernels against hand-computed values: windows, padding, the argmax the max-pool
// backward scatters to, the two divisors of average pooling, NaN propagation.
#include "meshtrain/tensor/cpu/pool2d.h"
#include "meshtrain/tensor/cpu/relu.h"

#include <cmath>

#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

Pool2dShape pool(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t stride,
                 int64_t pad) {
  Pool2dShape s;
  s.N = N;
  s.C = C;
  s.H = H;
  s.W = W;
  s.KH = s.KW = K;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

// A 4x4 plane whose maxima are not in the window corners:
//    3  9  1  0
//    2  4  8  6
//    7  5 -1 12
//   11 10  2 -3
const Vec kPlane = {3, 9, 1, 0, 2, 4, 8, 6, 7, 5, -1, 12, 11, 10, 2, -3};

TEST(MaxPool2d, ForwardAndArgmaxByHand) {
  const Pool2dShape s = pool(1, 1, 4, 4, 2, 2, 0);
  Vec out(4);
  std::vector<int32_t> arg(4);
  max_pool2d_forward(out.data(), arg.data(), kPlane.data(), s);
  EXPECT_EQ(out, (Vec{9, 8, 11, 12}));
  EXPECT_EQ(arg, (std::vector<int32_t>{1, 6, 12, 11}));
}

TEST(MaxPool2d, ResNetStemWindowWithPadding) {
  // kernel 3, stride 2, padding 1: windows rows/cols {-1..1} and {1..3}.
  const Pool2dShape s = pool(1, 1, 4, 4, 3, 2, 1);
  ASSERT_EQ(s.out_h(), 2);
  Vec out(4);
  std::vector<int32_t> arg(4);
  max_pool2d_forward(out.data(), arg.data(), kPlane.data(), s);
  EXPECT_EQ(out, (Vec{9, 9, 11, 12}));
  EXPECT_EQ(arg, (std::vector<int32_t>{1, 1, 12, 11}));
  // Backward: the 9 won two windows and gets both gradients, added to what dinp held.
  Vec dinp(16, 1.0f);
  const Vec dout = {0.5f, 0.25f, 2.0f, -1.0f};
  max_pool2d_backward(dinp.data(), dout.data(), arg.data(), s);
  Vec want(16, 1.0f);
  want[1] += 0.75f;
  want[12] += 2.0f;
  want[11] += -1.0f;
  EXPECT_EQ(dinp, want);
}

TEST(MaxPool2d, NegativePlanesAndSeveralChannels) {
  // Padding must never win even when every value is negative; planes are independent.
  Vec x(2 * 16);
  for (int i = 0; i < 16; ++i) {
    x[static_cast<size_t>(i)] = -kPlane[static_cast<size_t>(i)] - 20.0f;
    x[static_cast<size_t>(16 + i)] = kPlane[static_cast<size_t>(i)];
  }
  Vec out(8);
  std::vector<int32_t> arg(8);
  max_pool2d_forward(out.data(), arg.data(), x.data(), pool(1, 2, 4, 4, 3, 2, 1));
  EXPECT_EQ(out, (Vec{-22, -20, -22, -17, 9, 9, 11, 12}));
  EXPECT_EQ(arg, (std::vector<int32_t>{4, 3, 4, 15, 1, 1, 12, 11}));
}

TEST(MaxPool2d, NanPropagates) {
  Vec x = kPlane;
  x[5] = NAN;
  Vec out(4);
  std::vector<int32_t> arg(4);
  max_pool2d_forward(out.data(), arg.data(), x.data(), pool(1, 1, 4, 4, 2, 2, 0));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(arg[0], 5);
  EXPECT_EQ(out[1], 8.0f);
}

TEST(AvgPool2d, DivisorsWithAndWithoutPadding) {
  // kernel 3, stride 2, padding 1 on the 4x4 plane. Window (0, 0) covers rows/cols 0..1: sum
  // 3 + 9 + 2 + 4 = 18 over 9 padded positions or 4 real ones.
  const Pool2dShape s = pool(1, 1, 4, 4, 3, 2, 1);
  Vec with(4), without(4);
  avg_pool2d_forward(with.data(), kPlane.data(), s, true);
  avg_pool2d_forward(without.data(), kPlane.data(), s, false);
  // Window (0, 1): rows 0..1, cols 1..3: 9 + 1 + 0 + 4 + 8 + 6 = 28 over 9 or 6.
  // Window (1, 0): rows 1..3, cols 0..1: 2 + 4 + 7 + 5 + 11 + 10 = 39 over 9 or 6.
  // Window (1, 1): rows 1..3, cols 1..3: 4 + 8 + 6 + 5 - 1 + 12 + 10 + 2 - 3 = 43 over 9 or 9.
  EXPECT_EQ(with, (Vec{18.0f / 9, 28.0f / 9, 39.0f / 9, 43.0f / 9}));
  EXPECT_EQ(without, (Vec{18.0f / 4, 28.0f / 6, 39.0f / 6, 43.0f / 9}));
  Vec dinp(16, 0.0f);
  const Vec dout = {9, 18, 27, 36};
  avg_pool2d_backward(dinp.data(), dout.data(), s, true);
  // Position (1, 1) lies in all four windows: 1 + 2 + 3 + 4; (0, 0) only in the first.
  EXPECT_EQ(dinp[5], 10.0f);
  EXPECT_EQ(dinp[0], 1.0f);
  EXPECT_EQ(dinp[15], 4.0f);
}

TEST(AvgPool2d, WindowPastThePaddedEdgeCountsOnlyThePaddedPart) {
  // H = W = 4, kernel 2, stride 2, padding 1: windows start at -1, 1 and 3, so the first and the
  // last hold one real row and one of padding. PyTorch divides by 4 counting the padding, else by
  // the real positions only.
  const Vec x(16, 1.0f);
  const Pool2dShape s = pool(1, 1, 4, 4, 2, 2, 1);
  ASSERT_EQ(s.out_h(), 3);
  Vec with(9), without(9);
  avg_pool2d_forward(with.data(), x.data(), s, true);
  avg_pool2d_forward(without.data(), x.data(), s, false);
  EXPECT_EQ(with, (Vec{0.25f, 0.5f, 0.25f, 0.5f, 1.0f, 0.5f, 0.25f, 0.5f, 0.25f}));
  EXPECT_EQ(without, Vec(9, 1.0f));
}

TEST(GlobalAvgPool, MeanPerPlaneAndEvenBackward) {
  Vec x(2 * 16);
  for (int i = 0; i < 16; ++i) {
    x[static_cast<size_t>(i)] = kPlane[static_cast<size_t>(i)];
    x[static_cast<size_t>(16 + i)] = 2.0f;
  }
  Vec out(2);
  global_avg_pool_forward(out.data(), x.data(), 1, 2, 16);
  EXPECT_EQ(out, (Vec{76.0f / 16, 2.0f}));
  Vec dinp(32, 1.0f);
  const Vec dout = {8.0f, -16.0f};
  global_avg_pool_backward(dinp.data(), dout.data(), 1, 2, 16);
  EXPECT_EQ(dinp[0], 1.5f);
  EXPECT_EQ(dinp[31], 0.0f);
}

TEST(Relu, ForwardBackwardAndNan) {
  const Vec x = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f, NAN};
  Vec out(x.size());
  relu_forward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.5f);
  EXPECT_EQ(out[4], 3.0f);
  EXPECT_TRUE(std::isnan(out[5]));
  const Vec dout = {1, 2, 3, 4, 5, 6};
  Vec dx(x.size(), 99.0f);
  relu_backward(dx.data(), dout.data(), out.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(dx, (Vec{0, 0, 0, 4, 5, 0}));  // written; zero where the output is not positive
}

}  // namespace
}  // namespace meshtrain::cpu::testing
