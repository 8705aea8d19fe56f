#include <gtest/gtest.h>

#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {
namespace {

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::arange(12).view({3, 4});
  EXPECT_EQ(t.shape(), (Shape{3, 4}));
  Tensor v = t.view({-1, 6});
  EXPECT_EQ(v.shape(), (Shape{2, 6}));
  Tensor row = t.slice(1, 2);
  EXPECT_EQ(row.shape(), (Shape{1, 4}));
  EXPECT_EQ(row.to_vector(), (std::vector<float>{4, 5, 6, 7}));
  row.fill_(-1);
  EXPECT_EQ(t.to_vector()[5], -1.f);  // the slice wrote through to its parent
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.slice(2, 4), Error);
}

// A tensor over borrowed memory writes through to it, keeps its owner alive while any view does,
// and never frees the memory itself.
TEST(Tensor, FromBlobBorrowsMemoryAndKeepsItsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(6, 0.0f);
  std::weak_ptr<std::vector<float>> watch = owner;
  float* data = owner->data();
  Tensor t = Tensor::from_blob(data, {2, 3}, DType::f32, Device::cpu(), owner);
  owner.reset();
  Tensor row = t.slice(1, 2);
  t = Tensor();
  EXPECT_FALSE(watch.expired());  // the view still holds it
  row.fill_(2.0f);
  EXPECT_EQ(data[3], 2.0f);
  EXPECT_EQ(data[0], 0.0f);
  row = Tensor();
  EXPECT_TRUE(watch.expired());  // released with the last view, freed by its owner
  EXPECT_THROW(Tensor::from_blob(data, {1}, DType::f32, Device::cpu(), nullptr), Error);
}

TEST(Tensor, CastsRoundTrip) {
  Tensor t = Tensor::from_vector(std::vector<float>{1.f, -2.5f, 3.25f}, {3});
  for (DType d : {DType::bf16, DType::f16, DType::i32, DType::i64}) {
    Tensor back = t.to(d).to(DType::f32);
    if (d == DType::i32 || d == DType::i64) {
      EXPECT_EQ(back.to_vector(), (std::vector<float>{1.f, -2.f, 3.f}));
    } else {
      EXPECT_EQ(back.to_vector(), t.to_vector()) << dtype_name(d);
    }
  }
  EXPECT_THROW(t.data<int32_t>(), Error);
}

TEST(Ops, BroadcastingMatchesLoops) {
  Generator g(1);
  Tensor a = randn({2, 3, 4}, g), b = randn({3, 1}, g), c = randn({4}, g);
  Tensor ab = ops::add(a, b), ac = ops::mul(a, c);
  auto va = a.to_vector(), vb = b.to_vector(), vc = c.to_vector();
  auto vab = ab.to_vector(), vac = ac.to_vector();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) {
        const int n = (i * 3 + j) * 4 + k;
        EXPECT_EQ(vab[n], va[n] + vb[j]);
        EXPECT_EQ(vac[n], va[n] * vc[k]);
      }
  EXPECT_THROW(ops::add(a, randn({3, 2}, g)), ValueError);
  Tensor s = ops::sum_to_shape(ab, {3, 1});
  EXPECT_EQ(s.shape(), (Shape{3, 1}));
}

// scale_each_ is scale_ of each tensor, and a tensor listed twice is scaled once.
TEST(Ops, ScaleEachIsScaleOfEachTensorOnce) {
  Generator gen(11);
  const Tensor a = randn({5, 3}, gen), b = randn({7}, gen);
  Tensor a1 = a.clone(), b1 = b.clone(), a2 = a.clone(), b2 = b.clone();
  ops::scale_(a1, -0.37f);
  ops::scale_(b1, -0.37f);
  ops::scale_each_({a2, b2, a2}, -0.37f);
  EXPECT_EQ(a2.to_vector(), a1.to_vector());
  EXPECT_EQ(b2.to_vector(), b1.to_vector());
}

TEST(Ops, MatmulAgainstLoops) {
  Generator g(2);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int M = 5, N = 3, K = 7;
      Tensor a = ta ? randn({2, K, M}, g) : randn({2, M, K}, g);
      Tensor b = tb ? randn({2, N, K}, g) : randn({2, K, N}, g);
      Tensor c = ops::matmul(a, b, ta, tb);
      ASSERT_EQ(c.shape(), (Shape{2, M, N}));
      auto va = a.to_vector(), vb = b.to_vector(), vc = c.to_vector();
      for (int bt = 0; bt < 2; ++bt)
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            double acc = 0;
            for (int k = 0; k < K; ++k) {
              const double x = ta ? va[bt * K * M + k * M + i] : va[bt * M * K + i * K + k];
              const double y = tb ? vb[bt * N * K + j * K + k] : vb[bt * K * N + k * N + j];
              acc += x * y;
            }
            EXPECT_NEAR(vc[bt * M * N + i * N + j], acc, 1e-4);
          }
    }
}

TEST(Ops, PermuteAndCat) {
  Tensor t = Tensor::arange(24).view({2, 3, 4});
  Tensor p = ops::permute(t, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  auto vt = t.to_vector(), vp = p.to_vector();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(vp[(k * 2 + i) * 3 + j], vt[(i * 3 + j) * 4 + k]);
  Tensor c = ops::cat({ops::narrow(t, 2, 0, 1), ops::narrow(t, 2, 1, 3)}, 2);
  EXPECT_TRUE(ops::equal(c, t));
}

TEST(Random, SameSeedSameNumbers) {
  Generator a(7), b(7), c(8);
  Tensor x = randn({100}, a), y = randn({100}, b), z = randn({100}, c);
  EXPECT_TRUE(ops::equal(x, y));
  EXPECT_FALSE(ops::equal(x, z));
  double mean = 0;
  for (float v : randn({10000}, a).to_vector()) mean += v;
  EXPECT_NEAR(mean / 10000, 0.0, 0.05);
}

}  // namespace
}  // namespace meshtrain
