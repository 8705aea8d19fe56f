// Image batches: normalisation values, crop and flip against hand-computed images, the draw's
// determinism and spread, and sampler order (sharding, restoring) with augmentation that is the
// same for a sample on any rank and at any world size.
#include "meshtrain/data/image_batches.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "meshtrain/util/error.h"
#include "meshtrain/util/splitmix64.h"

namespace meshtrain::data {
namespace {

// One image [C, H, W] rendered as f32.
std::vector<float> rendered(const ImageTransform& t, const std::vector<uint8_t>& image,
                            int64_t height, int64_t width, const ImageAugment& a) {
  std::vector<float> out(image.size());
  t.render(image, height, width, a, out.data());
  return out;
}

// The bytes as floats: what a transform with mean 0 and std 1/255 makes of them.
std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  return std::vector<float>(bytes.begin(), bytes.end());
}

// Rendered values that are these bytes (to a few ulps).
auto are_bytes(const std::vector<uint8_t>& bytes) {
  return ::testing::Pointwise(::testing::FloatEq(), as_floats(bytes));
}

// Mean 0 and std 1/255: each output value is the byte it came from.
ImageTransformOptions identity() {
  ImageTransformOptions o;
  o.std = {1.0f / 255.0f};
  return o;
}

// `n` images of 1 x side x side with pseudo-random bytes, image i labelled i: a label names its
// sample.
std::shared_ptr<const ImageSet> numbered_set(int64_t n, int64_t side) {
  std::vector<uint8_t> pixels(static_cast<size_t>(n * side * side));
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<uint8_t>(splitmix64_at(42, i) | 1);  // never 0: padding stands out
  std::vector<int32_t> labels(static_cast<size_t>(n));
  std::iota(labels.begin(), labels.end(), 0);
  return std::make_shared<const ImageSet>(std::move(pixels), std::move(labels), 1, side, side, n);
}

TEST(ImageTransform, NormalisesWithTheFashionMnistMeanAndStd) {
  const ImageTransform t(fashion_mnist_transform(/*train=*/false), 1);
  EXPECT_FALSE(t.augments());
  const std::vector<float> v = rendered(t, {0, 255, 73, 128}, 2, 2, {});
  EXPECT_FLOAT_EQ(v[0], -0.2860f / 0.3530f);          // -0.8102
  EXPECT_FLOAT_EQ(v[1], (1.0f - 0.2860f) / 0.3530f);  // 2.0227
  EXPECT_NEAR(v[2], (73 / 255.0 - 0.2860) / 0.3530, 1e-6);
  EXPECT_NEAR(v[3], (128 / 255.0 - 0.2860) / 0.3530, 1e-6);

  ImageTransformOptions rgb;
  rgb.mean = {0.5f, 0.25f, 0.0f};
  rgb.std = {0.5f, 0.25f, 2.0f};
  const ImageTransform c(rgb, 3);
  const std::vector<float> w = rendered(c, {255, 0, 255}, 1, 1, {});
  EXPECT_FLOAT_EQ(w[0], 1.0f);
  EXPECT_FLOAT_EQ(w[1], -1.0f);
  EXPECT_FLOAT_EQ(w[2], 0.5f);
}

TEST(ImageTransform, RefusesOptionsThatDoNotFitTheImages) {
  ImageTransformOptions o;
  o.mean = {0.1f, 0.2f};
  EXPECT_THROW(ImageTransform(o, 3), ValueError);  // two means for three channels
  o.mean = {0.1f};
  o.std = {0.0f};
  EXPECT_THROW(ImageTransform(o, 1), ValueError);
  o.std = {1.0f};
  o.crop_padding = -1;
  EXPECT_THROW(ImageTransform(o, 1), ValueError);
}

// A 3 x 4 image,
//    1  2  3  4
//    5  6  7  8
//    9 10 11 12
// moved by hand: out(y, x) = in(y + shift_y, x + shift_x), mirrored after the crop.
TEST(ImageTransform, CropAndFlipMovePixelsAsTorchvisionDoes) {
  const ImageTransform t(identity(), 1);
  const std::vector<uint8_t> in{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_THAT(rendered(t, in, 3, 4, {}), are_bytes(in));
  // Padding 2, crop window at top 3, left 1 of the padded image: shift (1, -1).
  EXPECT_THAT(rendered(t, in, 3, 4, {.shift_y = 1, .shift_x = -1}), are_bytes({0, 5, 6, 7,    //
                                                                               0, 9, 10, 11,  //
                                                                               0, 0, 0, 0}));
  EXPECT_THAT(rendered(t, in, 3, 4, {.flip = true}), are_bytes({4, 3, 2, 1,  //
                                                                8, 7, 6, 5,  //
                                                                12, 11, 10, 9}));
  // Crop at shift (-1, 2): rows 0 | 1 2 3 4 | 5 6 7 8 cut to columns 2..5, then mirrored.
  EXPECT_THAT(rendered(t, in, 3, 4, {.shift_y = -1, .shift_x = 2, .flip = true}),
              are_bytes({0, 0, 0, 0,  //
                         0, 0, 4, 3,  //
                         0, 0, 8, 7}));
  // A window wholly in the padding.
  EXPECT_THAT(rendered(t, in, 3, 4, {.shift_y = 0, .shift_x = 4}),
              are_bytes(std::vector<uint8_t>(12)));
  // Channels move together.
  const ImageTransform two(identity(), 2);
  EXPECT_THAT(
      rendered(two, {1, 2, 3, 4, 5, 6, 7, 8}, 2, 2, {.shift_y = 0, .shift_x = 1, .flip = true}),
      are_bytes({0, 2, 0, 4, 0, 6, 0, 8}));
}

TEST(ImageTransform, DrawsArePureFunctionsOfSeedEpochAndSample) {
  const ImageTransform t(fashion_mnist_transform(/*train=*/true, 7), 1);
  const ImageTransform same(fashion_mnist_transform(true, 7), 1);
  const ImageTransform other(fashion_mnist_transform(true, 8), 1);
  EXPECT_TRUE(t.augments());
  std::map<std::pair<int64_t, int64_t>, int> shifts;
  int flips = 0, differ_by_seed = 0, differ_by_epoch = 0;
  constexpr int kDraws = 4000;
  for (int s = 0; s < kDraws; ++s) {
    const ImageAugment a = t.draw(3, s);
    EXPECT_EQ(a, same.draw(3, s));
    differ_by_seed += !(a == other.draw(3, s));
    differ_by_epoch += !(a == t.draw(4, s));
    ASSERT_GE(a.shift_y, -4);
    ASSERT_LE(a.shift_y, 4);
    ASSERT_GE(a.shift_x, -4);
    ASSERT_LE(a.shift_x, 4);
    ++shifts[{a.shift_y, a.shift_x}];
    flips += a.flip;
  }
  // 81 offsets about 49 times each, half of the images mirrored.
  EXPECT_EQ(shifts.size(), 81u);
  for (const auto& [shift, count] : shifts)
    EXPECT_GT(count, 15) << shift.first << ", " << shift.second;
  EXPECT_NEAR(flips, kDraws / 2, 150);
  EXPECT_GT(differ_by_seed, kDraws * 9 / 10);
  EXPECT_GT(differ_by_epoch, kDraws * 9 / 10);
  // Evaluation draws nothing.
  EXPECT_EQ(ImageTransform(fashion_mnist_transform(false), 1).draw(3, 5), ImageAugment{});
}

TEST(ImageBatches, BatchesAreTheSampledImagesAugmentedByTheirDraws) {
  const auto set = numbered_set(10, 6);
  SamplerOptions so;
  so.seed = 11;
  ImageBatches batches(set, so, 4, fashion_mnist_transform(true, 11));
  const ImageTransform& t = batches.transform();
  int moved = 0;
  for (int64_t k = 0; k < 5; ++k) {  // 20 samples: the third batch straddles the epochs
    const auto [x, y] = batches.next();
    ASSERT_EQ(x.shape(), (Shape{4, 1, 6, 6}));
    ASSERT_EQ(x.dtype(), DType::f32);
    ASSERT_EQ(y.shape(), (Shape{4}));
    ASSERT_EQ(y.dtype(), DType::i32);
    const std::vector<float> xs = x.to_vector();
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t s = y.data<int32_t>()[i];
      const int64_t epoch = (4 * k + i) / 10;
      const std::span<const uint8_t> img = set->image(s);
      const std::vector<uint8_t> bytes(img.begin(), img.end());
      const std::vector<float> got(xs.begin() + i * 36, xs.begin() + (i + 1) * 36);
      EXPECT_EQ(got, rendered(t, bytes, 6, 6, t.draw(epoch, s))) << "batch " << k << " image " << i;
      moved += got != rendered(t, bytes, 6, 6, {});
    }
  }
  EXPECT_GT(moved, 15);  // 1 in 162 draws is the identity
}

TEST(ImageBatches, EvaluationIsInOrderAndUnaugmented) {
  const auto set = numbered_set(5, 4);
  const ImageTransform t(fashion_mnist_transform(false), 1);
  const auto [x, y] = t.slice(*set, 1, 4);
  EXPECT_EQ(x.shape(), (Shape{3, 1, 4, 4}));
  EXPECT_EQ(y.to_vector(), (std::vector<float>{1, 2, 3}));
  const std::vector<float> xs = x.to_vector();
  for (int64_t i = 0; i < 3; ++i) {
    const std::span<const uint8_t> img = set->image(i + 1);
    const std::vector<uint8_t> bytes(img.begin(), img.end());
    for (int64_t p = 0; p < 16; ++p)
      EXPECT_FLOAT_EQ(
          xs[static_cast<size_t>(i * 16 + p)],
          static_cast<float>((bytes[static_cast<size_t>(p)] / 255.0 - 0.2860f) / 0.3530f));
  }
  // A training transform's slice is not augmented either.
  const ImageTransform train(fashion_mnist_transform(true, 3), 1);
  EXPECT_EQ(train.slice(*set, 0, 5).first.to_vector(), t.slice(*set, 0, 5).first.to_vector());
}

// Every (epoch, sample) visit of the first two epochs, as the given world's ranks render it.
std::map<std::pair<int64_t, int64_t>, std::vector<float>> visits(
    const std::shared_ptr<const ImageSet>& set, int64_t world, int64_t batch_size) {
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> seen;
  const int64_t image = set->image_bytes();
  for (int64_t rank = 0; rank < world; ++rank) {
    SamplerOptions so;
    so.seed = 5;
    so.num_replicas = world;
    so.rank = rank;
    ImageBatches batches(set, so, batch_size, fashion_mnist_transform(true, 5));
    const int64_t per_rank = set->size() / world;
    for (int64_t j = 0; j < 2 * per_rank;) {
      const auto [x, y] = batches.next();
      const std::vector<float> xs = x.to_vector();
      for (int64_t i = 0; i < batch_size; ++i, ++j) {
        if (j >= 2 * per_rank) break;
        const auto key = std::make_pair(j / per_rank, int64_t{y.data<int32_t>()[i]});
        EXPECT_FALSE(seen.contains(key)) << "sample " << key.second << " twice in epoch "
                                         << key.first << " at world size " << world;
        seen[key] = std::vector<float>(xs.begin() + i * image, xs.begin() + (i + 1) * image);
      }
    }
  }
  return seen;
}

// Ranks split each epoch without overlap, and a sample's augmentation depends on neither the
// rank that reads it nor the world size.
TEST(ImageBatches, ASampleLooksTheSameOnAnyRankAtAnyWorldSize) {
  const auto set = numbered_set(24, 8);
  const auto one = visits(set, 1, 5);
  ASSERT_EQ(one.size(), 48u);  // both epochs, every sample once in each
  for (int64_t world : {2, 3, 4}) {
    const auto many = visits(set, world, 5);
    EXPECT_EQ(many.size(), 48u) << "world size " << world;
    EXPECT_TRUE(many == one) << "world size " << world;
  }
  int changed = 0;
  for (int64_t s = 0; s < 24; ++s) changed += one.at({0, s}) != one.at({1, s});
  EXPECT_GT(changed, 20);  // a new epoch draws anew
}

TEST(ImageBatches, ARestoredPositionGivesTheSameBatches) {
  const auto set = numbered_set(20, 5);
  SamplerOptions so;
  so.seed = 9;
  so.num_replicas = 2;
  so.rank = 1;
  ImageBatches a(set, so, 3, fashion_mnist_transform(true, 9));
  for (int i = 0; i < 3; ++i) a.next();
  const SamplerState at = a.state();
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 3; ++i) want.push_back(a.next().first.to_vector());  // crosses an epoch

  ImageBatches b(set, so, 3, fashion_mnist_transform(true, 9));
  b.set_state(at);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.next().first.to_vector(), want[static_cast<size_t>(i)]);
  EXPECT_EQ(b.state(), a.state());

  EXPECT_THROW(ImageBatches(set, so, 0, fashion_mnist_transform(true)), ValueError);
  ImageTransformOptions rgb;
  rgb.mean = {0.1f, 0.2f, 0.3f};
  EXPECT_THROW(ImageBatches(set, so, 2, rgb), ValueError);  // three means, one channel
}

}  // namespace
}  // namespace meshtrain::data
