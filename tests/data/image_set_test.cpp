// The image set and Fashion-MNIST loading: the checks on small generated files, then the real
// files of the dataset-fashion-mnist package.
#include "meshtrain/data/image_set.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/util/error.h"
#include "tests/data/idx_test_files.h"
#include "tests/support/capability.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

using idx_files::gzip;
using idx_files::idx_u8;
using ::meshtrain::testing::TempDir;
using ::meshtrain::testing::write_bytes;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ImageSet, HoldsImagesAndLabels) {
  std::vector<uint8_t> pixels(3 * 2 * 2 * 2);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i);
  const ImageSet set(pixels, {2, 0, 1}, 2, 2, 2, 3);
  EXPECT_EQ(set.size(), 3);
  EXPECT_EQ(set.image_bytes(), 8);
  EXPECT_EQ(set.image(1)[0], 8);
  EXPECT_EQ(set.image(2)[7], 23);
  EXPECT_EQ(set.labels(), (std::vector<int32_t>{2, 0, 1}));
}

TEST(ImageSet, RefusesInconsistentData) {
  EXPECT_THROW(ImageSet(std::vector<uint8_t>(7), {0, 1}, 1, 2, 2, 2), ValueError);  // 8 bytes
  EXPECT_THROW(ImageSet(std::vector<uint8_t>(4), {2}, 1, 2, 2, 2), ValueError);     // label
  EXPECT_THROW(ImageSet(std::vector<uint8_t>(4), {-1}, 1, 2, 2, 2), ValueError);
  EXPECT_THROW(ImageSet(std::vector<uint8_t>(4), {0}, 1, 2, 2, 1), ValueError);  // one class
  EXPECT_THROW(ImageSet({}, {}, 1, 2, 2, 2), ValueError);                        // empty
  EXPECT_THROW(ImageSet({}, {0}, 0, 2, 2, 2), ValueError);                       // no channel
}

// A Fashion-MNIST directory of `n` images (pixel values from the image and pixel index) and the
// given labels, written gzipped, or unpacked when `packed` is false.
void write_split(const TempDir& dir, const std::string& prefix, uint32_t n,
                 const std::vector<uint8_t>& labels, bool packed = true, uint32_t side = 28) {
  std::vector<uint8_t> pixels(n * side * side);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 31 + i / 784);
  const std::string images = idx_u8({n, side, side}, pixels);
  const std::string labels_file = idx_u8({static_cast<uint32_t>(labels.size())}, labels);
  const std::string ext = packed ? ".gz" : "";
  write_bytes(dir.file(prefix + "-images-idx3-ubyte" + ext), packed ? gzip(images) : images);
  write_bytes(dir.file(prefix + "-labels-idx1-ubyte" + ext),
              packed ? gzip(labels_file) : labels_file);
}

std::string load_error(const std::string& dir, const std::string& split) {
  try {
    load_fashion_mnist(dir, split);
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading " << split << " from " << dir << " did not fail";
  return "";
}

TEST(FashionMnist, LoadsASplitFromPackedOrUnpackedFiles) {
  TempDir dir;
  write_split(dir, "train", 3, {9, 0, 4});
  write_split(dir, "t10k", 2, {1, 1}, /*packed=*/false);
  const ImageSet train = load_fashion_mnist(dir.path().string(), "train");
  EXPECT_EQ(train.size(), 3);
  EXPECT_EQ(train.channels(), 1);
  EXPECT_EQ(train.height(), 28);
  EXPECT_EQ(train.width(), 28);
  EXPECT_EQ(train.num_classes(), 10);
  EXPECT_EQ(train.labels(), (std::vector<int32_t>{9, 0, 4}));
  EXPECT_EQ(train.image(2)[5], static_cast<uint8_t>((2 * 784 + 5) * 31 + 2));
  const ImageSet test = load_fashion_mnist(dir.path().string(), "test");
  EXPECT_EQ(test.size(), 2);
  EXPECT_EQ(test.labels(), (std::vector<int32_t>{1, 1}));
  EXPECT_THROW(load_fashion_mnist(dir.path().string(), "val"), ValueError);
}

TEST(FashionMnist, EachBadFileIsNamedWithWhatWasExpected) {
  {
    TempDir dir;
    const std::string d = dir.path().string();
    EXPECT_THAT(load_error(d, "test"),
                AllOf(HasSubstr("no Fashion-MNIST test images in " + d),
                      HasSubstr(dir.file("t10k-images-idx3-ubyte.gz")),
                      HasSubstr("install the dataset-fashion-mnist package")));
    write_split(dir, "t10k", 2, {1, 1});
    std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
    EXPECT_THAT(load_error(d, "test"), HasSubstr("no Fashion-MNIST test labels in " + d));
  }
  {
    TempDir dir;
    write_split(dir, "train", 2, {1, 1}, true, 32);
    EXPECT_THAT(load_error(dir.path().string(), "train"),
                AllOf(HasSubstr(dir.file("train-images-idx3-ubyte.gz")),
                      HasSubstr("holds a 2 x 32 x 32 u8 array"),
                      HasSubstr("expected Fashion-MNIST images, N x 28 x 28 u8")));
  }
  {
    TempDir dir;
    write_split(dir, "train", 3, {1, 1});
    EXPECT_THAT(load_error(dir.path().string(), "train"),
                AllOf(HasSubstr(dir.file("train-images-idx3-ubyte.gz") + " has 3 images but " +
                                dir.file("train-labels-idx1-ubyte.gz") + " has 2 labels"),
                      HasSubstr("expected one label per image")));
  }
  {
    TempDir dir;
    write_split(dir, "train", 3, {1, 10, 2});
    EXPECT_THAT(load_error(dir.path().string(), "train"),
                AllOf(HasSubstr(dir.file("train-labels-idx1-ubyte.gz")),
                      HasSubstr("label 10 of image 1 is outside [0, 10)")));
  }
  {
    TempDir dir;
    write_split(dir, "train", 2, {1, 1});
    // Labels stored as images: the wrong file under the labels' name.
    std::filesystem::copy_file(dir.file("train-images-idx3-ubyte.gz"),
                               dir.file("train-labels-idx1-ubyte.gz"),
                               std::filesystem::copy_options::overwrite_existing);
    EXPECT_THAT(load_error(dir.path().string(), "train"),
                AllOf(HasSubstr(dir.file("train-labels-idx1-ubyte.gz")),
                      HasSubstr("holds a 2 x 28 x 28 u8 array; expected Fashion-MNIST labels")));
  }
}

// The real files: present wherever scripts/install-deps.sh ran, and then never skipped in CI.
bool fashion_mnist_installed() {
  const std::filesystem::path dir(kFashionMnistDir);
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    if (!std::filesystem::exists(dir / f)) return false;
  }
  return true;
}

std::vector<int64_t> histogram(const ImageSet& set) {
  std::vector<int64_t> h(static_cast<size_t>(set.num_classes()));
  for (int32_t y : set.labels()) ++h[static_cast<size_t>(y)];
  return h;
}

TEST(FashionMnist, ThePackagedTrainingSetIsBalancedWithTheKnownStatistics) {
  MT_SKIP_UNLESS(
      "fashion-mnist", fashion_mnist_installed(),
      "no Fashion-MNIST files in " << kFashionMnistDir << " (install dataset-fashion-mnist)");
  const ImageSet train = load_fashion_mnist(std::string(kFashionMnistDir), "train");
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(train.channels(), 1);
  EXPECT_EQ(train.height(), 28);
  EXPECT_EQ(train.width(), 28);
  EXPECT_EQ(histogram(train), std::vector<int64_t>(10, 6000));
  // The normalisation constants are these images' pixel mean and standard deviation.
  std::vector<int64_t> count(256);
  for (int64_t i = 0; i < train.size(); ++i)
    for (uint8_t p : train.image(i)) ++count[p];
  double sum = 0, sum_sq = 0;
  for (int p = 0; p < 256; ++p) {
    const double v = p / 255.0;
    sum += static_cast<double>(count[static_cast<size_t>(p)]) * v;
    sum_sq += static_cast<double>(count[static_cast<size_t>(p)]) * v * v;
  }
  const double n = static_cast<double>(train.size() * train.image_bytes());
  const double mean = sum / n;
  EXPECT_NEAR(mean, kFashionMnistMean, 5e-5);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), kFashionMnistStd, 5e-5);
}

TEST(FashionMnist, ThePackagedTestSetHasTenThousandImages) {
  MT_SKIP_UNLESS(
      "fashion-mnist", fashion_mnist_installed(),
      "no Fashion-MNIST files in " << kFashionMnistDir << " (install dataset-fashion-mnist)");
  const ImageSet test = load_fashion_mnist(std::string(kFashionMnistDir), "test");
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(test.image_bytes(), 784);
  EXPECT_EQ(histogram(test), std::vector<int64_t>(10, 1000));
}

}  // namespace
}  // namespace meshtrain::data
