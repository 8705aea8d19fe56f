// ImageSet: shape and label checks; Fashion-MNIST: which files a split is, and what they must
// hold before their bytes become a set (moved, not copied).
#include "meshtrain/data/image_set.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "meshtrain/data/idx_file.h"
#include "meshtrain/util/error.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

ImageSet::ImageSet(std::vector<uint8_t> pixels, std::vector<int32_t> labels, int64_t channels,
                   int64_t height, int64_t width, int64_t num_classes)
    : pixels_(std::move(pixels)),
      labels_(std::move(labels)),
      channels_(channels),
      height_(height),
      width_(width),
      num_classes_(num_classes) {
  if (channels_ < 1 || height_ < 1 || width_ < 1)
    MT_THROW(ValueError, "an image set needs images of at least 1 x 1 x 1, got ", channels_, " x ",
             height_, " x ", width_);
  if (num_classes_ < 2)
    MT_THROW(ValueError, "an image set needs at least two classes, got ", num_classes_);
  if (labels_.empty()) MT_THROW(ValueError, "an image set needs at least one image");
  const auto need = labels_.size() * static_cast<size_t>(image_bytes());
  if (pixels_.size() != need)
    MT_THROW(ValueError, "an image set of ", labels_.size(), " images of ", channels_, " x ",
             height_, " x ", width_, " needs ", need, " pixel bytes, got ", pixels_.size());
  const auto bad = std::find_if(labels_.begin(), labels_.end(),
                                [&](int32_t y) { return y < 0 || y >= num_classes_; });
  if (bad != labels_.end())
    MT_THROW(ValueError, "image ", bad - labels_.begin(), " has label ", *bad,
             ", outside the set's ", num_classes_, " classes");
}

std::span<const uint8_t> ImageSet::image(int64_t i) const {
  MT_CHECK(i >= 0 && i < size(), "image ", i, " of a set of ", size());
  const auto n = static_cast<size_t>(image_bytes());
  return {pixels_.data() + static_cast<size_t>(i) * n, n};
}

namespace {

// dir/name.gz, else dir/name: the packaged files are compressed, a copy may be unpacked.
std::string find_file(const std::string& dir, const std::string& name, std::string_view what) {
  std::error_code ec;
  for (const std::string& candidate : {name + ".gz", name}) {
    const fs::path p = fs::path(dir) / candidate;
    if (fs::exists(p, ec)) return p.string();
  }
  MT_THROW(IoError, "no Fashion-MNIST ", what, " in ", dir, ": expected ",
           (fs::path(dir) / (name + ".gz")).string(),
           " (or the same unpacked, without .gz); install the dataset-fashion-mnist package or "
           "point the data directory at a copy of its files");
}

}  // namespace

ImageSet load_fashion_mnist(const std::string& dir, std::string_view split) {
  std::string prefix;
  if (split == "train") {
    prefix = "train";
  } else if (split == "test") {
    prefix = "t10k";
  } else {
    MT_THROW(ValueError, "Fashion-MNIST has the splits train and test, not '", split, "'");
  }
  const std::string images_path =
      find_file(dir, prefix + "-images-idx3-ubyte", std::string(split) + " images");
  const std::string labels_path =
      find_file(dir, prefix + "-labels-idx1-ubyte", std::string(split) + " labels");

  IdxArray images = read_idx(images_path);
  if (images.type != IdxType::u8 || images.dims.size() != 3 ||
      images.dims[1] != kFashionMnistSide || images.dims[2] != kFashionMnistSide) {
    MT_THROW(IoError, images_path, " holds a ", images.describe(),
             " array; expected Fashion-MNIST images, N x 28 x 28 u8 (one channel)");
  }
  IdxArray labels = read_idx(labels_path);
  if (labels.type != IdxType::u8 || labels.dims.size() != 1) {
    MT_THROW(IoError, labels_path, " holds a ", labels.describe(),
             " array; expected Fashion-MNIST labels, N u8");
  }
  if (images.dims[0] != labels.dims[0]) {
    MT_THROW(IoError, images_path, " has ", images.dims[0], " images but ", labels_path, " has ",
             labels.dims[0], " labels; expected one label per image");
  }
  if (images.dims[0] == 0) MT_THROW(IoError, images_path, " has no images; expected at least one");
  std::vector<int32_t> classes(labels.bytes.size());
  for (size_t i = 0; i < classes.size(); ++i) {
    classes[i] = labels.bytes[i];
    if (classes[i] >= kFashionMnistClasses) {
      MT_THROW(IoError, labels_path, ": label ", classes[i], " of image ", i, " is outside [0, ",
               kFashionMnistClasses, "); expected a Fashion-MNIST class");
    }
  }
  return ImageSet(std::move(images.bytes), std::move(classes), 1, kFashionMnistSide,
                  kFashionMnistSide, kFashionMnistClasses);
}

}  // namespace meshtrain::data
