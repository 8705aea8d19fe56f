// A labelled image set held in memory as it is stored on disk: N images of C x H x W bytes, one
// after the other, and one class label per image. Keeping the bytes (not floats) holds
// Fashion-MNIST's 60000 training images in 47 MB instead of 188; normalisation and augmentation
// happen per batch (image_batches.h). Fashion-MNIST is the embedded image set: Debian's
// dataset-fashion-mnist package installs its four IDX files, and load_fashion_mnist reads and
// checks them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::data {

class ImageSet {
 public:
  // `pixels` holds labels.size() images of channels x height x width bytes each; every label is
  // in [0, num_classes). ValueError otherwise.
  ImageSet(std::vector<uint8_t> pixels, std::vector<int32_t> labels, int64_t channels,
           int64_t height, int64_t width, int64_t num_classes);

  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  int64_t channels() const { return channels_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  int64_t image_bytes() const { return channels_ * height_ * width_; }
  int64_t num_classes() const { return num_classes_; }
  const std::vector<int32_t>& labels() const { return labels_; }
  // Image i, [C, H, W] row-major.
  std::span<const uint8_t> image(int64_t i) const;

 private:
  std::vector<uint8_t> pixels_;
  std::vector<int32_t> labels_;
  int64_t channels_;
  int64_t height_;
  int64_t width_;
  int64_t num_classes_;
};

// Where the dataset-fashion-mnist package puts the files.
inline constexpr std::string_view kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int64_t kFashionMnistClasses = 10;
inline constexpr int64_t kFashionMnistSide = 28;
// The training images' pixel mean and standard deviation, on the [0, 1] scale.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Split "train" (60000 images) or "test" (10000) of Fashion-MNIST from `dir`, which holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (or the files unpacked, without .gz). ValueError
// for another split; IoError, naming the file, for a missing or malformed file, images that are
// not 28 x 28 u8, labels not u8 in [0, 10), or image and label files that disagree in count.
ImageSet load_fashion_mnist(const std::string& dir, std::string_view split);

}  // namespace meshtrain::data
