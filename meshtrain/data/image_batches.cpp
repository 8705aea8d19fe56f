// ImageTransform: the per-channel affine map, the per-sample draw and a row-at-a-time renderer
// whose inner loops are a convert and a multiply-add per pixel, which the compiler vectorises (a
// 256-entry lookup table measured 2.5 times slower: a gather per pixel); the crop and the flip
// only move the loop bounds and the read direction. Batches are built on the calling thread
// without OpenMP: a batch of 256 Fashion-MNIST images is well under a millisecond of work, and the
// prefetch thread that calls it runs beside the training step's own OpenMP team, which a second
// team would only slow down.
#include "meshtrain/data/image_batches.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "meshtrain/tensor/random.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/splitmix64.h"

namespace meshtrain::data {

namespace {

// Separates the augmentation stream from the sampler's permutation when both use one seed.
constexpr uint64_t kAugmentSalt = 0x1a6e'a06b'e17e'd5ULL;

SamplerOptions sized(SamplerOptions options, const ImageSet* set) {
  MT_CHECK(set != nullptr, "ImageBatches without a set");
  options.num_windows = set->size();
  return options;
}

int64_t channels_of(const ImageSet* set) {
  MT_CHECK(set != nullptr, "ImageBatches without a set");
  return set->channels();
}

}  // namespace

ImageTransformOptions fashion_mnist_transform(bool train, uint64_t seed) {
  ImageTransformOptions o;
  o.mean = {kFashionMnistMean};
  o.std = {kFashionMnistStd};
  o.crop_padding = train ? 4 : 0;
  o.horizontal_flip = train;
  o.seed = seed;
  return o;
}

ImageTransform::ImageTransform(ImageTransformOptions options, int64_t channels)
    : options_(std::move(options)), channels_(channels) {
  MT_CHECK(channels_ >= 1, "an image transform for ", channels_, " channels");
  const auto per_channel = [&](const std::vector<float>& v, const char* name) {
    if (v.size() != 1 && static_cast<int64_t>(v.size()) != channels_)
      MT_THROW(ValueError, "image normalisation has ", v.size(), " ", name,
               " values for images of ", channels_, " channels; expected 1 or ", channels_);
  };
  per_channel(options_.mean, "mean");
  per_channel(options_.std, "std");
  for (float s : options_.std)
    if (!(std::isfinite(s) && s > 0))
      MT_THROW(ValueError, "image normalisation std must be positive and finite, got ", s);
  for (float m : options_.mean)
    if (!std::isfinite(m)) MT_THROW(ValueError, "image normalisation mean must be finite, got ", m);
  if (options_.crop_padding < 0)
    MT_THROW(ValueError, "crop padding must be 0 or more, got ", options_.crop_padding);

  // (p / 255 - mean) / std = p * scale + shift, both rounded once from double.
  scale_.resize(static_cast<size_t>(channels_));
  shift_.resize(static_cast<size_t>(channels_));
  for (int64_t c = 0; c < channels_; ++c) {
    const auto pick = [&](const std::vector<float>& v) {
      return static_cast<double>(v.size() == 1 ? v[0] : v[static_cast<size_t>(c)]);
    };
    const double mean = pick(options_.mean), std = pick(options_.std);
    scale_[static_cast<size_t>(c)] = static_cast<float>(1.0 / (255.0 * std));
    shift_[static_cast<size_t>(c)] = static_cast<float>(-mean / std);
  }
}

ImageAugment ImageTransform::draw(int64_t epoch, int64_t sample) const {
  ImageAugment a;
  if (!augments()) return a;
  const uint64_t epoch_key =
      splitmix64_key(options_.seed ^ kAugmentSalt, static_cast<uint64_t>(epoch));
  Generator gen(splitmix64_key(epoch_key, static_cast<uint64_t>(sample)));
  const int64_t p = options_.crop_padding;
  if (p > 0) {
    const auto span = static_cast<uint64_t>(2 * p + 1);
    a.shift_y = static_cast<int64_t>(gen.below(span)) - p;
    a.shift_x = static_cast<int64_t>(gen.below(span)) - p;
  }
  if (options_.horizontal_flip) a.flip = (gen.next_u64() >> 63) != 0;
  return a;
}

void ImageTransform::render(std::span<const uint8_t> image, int64_t height, int64_t width,
                            const ImageAugment& augment, float* out) const {
  MT_CHECK(static_cast<int64_t>(image.size()) == channels_ * height * width, "an image of ",
           image.size(), " bytes is not ", channels_, " x ", height, " x ", width);
  const int64_t sy = augment.shift_y, sx = augment.shift_x;
  // Output columns [x0, x1) read inside the image; the rest are padding. Unflipped, column x
  // reads x + sx; flipped, it reads W - 1 - x + sx.
  const int64_t x0 = std::clamp(augment.flip ? sx : -sx, int64_t{0}, width);
  const int64_t x1 = std::clamp(augment.flip ? width + sx : width - sx, x0, width);
  for (int64_t c = 0; c < channels_; ++c) {
    const float scale = scale_[static_cast<size_t>(c)];
    const float shift = shift_[static_cast<size_t>(c)];  // also a zero pixel's value: padding
    const uint8_t* plane = image.data() + c * height * width;
    for (int64_t y = 0; y < height; ++y) {
      float* row_out = out + (c * height + y) * width;
      const int64_t src_y = y + sy;
      if (src_y < 0 || src_y >= height) {
        std::fill(row_out, row_out + width, shift);
        continue;
      }
      const uint8_t* row = plane + src_y * width;
      std::fill(row_out, row_out + x0, shift);
      if (augment.flip) {
        const int64_t last = width - 1 + sx;
        for (int64_t x = x0; x < x1; ++x)
          row_out[x] = static_cast<float>(row[last - x]) * scale + shift;
      } else {
        for (int64_t x = x0; x < x1; ++x)
          row_out[x] = static_cast<float>(row[x + sx]) * scale + shift;
      }
      std::fill(row_out + x1, row_out + width, shift);
    }
  }
}

std::pair<Tensor, Tensor> ImageTransform::batch(const ImageSet& set,
                                                std::span<const int64_t> samples,
                                                std::span<const int64_t> epochs) const {
  const auto b = static_cast<int64_t>(samples.size());
  MT_CHECK(b > 0, "empty batch");
  MT_CHECK(epochs.size() == samples.size(), samples.size(), " samples with ", epochs.size(),
           " epochs");
  MT_CHECK(set.channels() == channels_, "a transform for ", channels_, " channels over images of ",
           set.channels());
  const int64_t h = set.height(), w = set.width(), n = set.image_bytes();
  Tensor x = Tensor::empty({b, channels_, h, w}, DType::f32);
  Tensor y = Tensor::empty({b}, DType::i32);
  float* xs = x.data<float>();
  int32_t* ys = y.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t s = samples[static_cast<size_t>(i)];
    MT_CHECK(s >= 0 && s < set.size(), "sample ", s, " of a set of ", set.size());
    render(set.image(s), h, w, draw(epochs[static_cast<size_t>(i)], s), xs + i * n);
    ys[i] = set.labels()[static_cast<size_t>(s)];
  }
  return {std::move(x), std::move(y)};
}

std::pair<Tensor, Tensor> ImageTransform::slice(const ImageSet& set, int64_t begin,
                                                int64_t end) const {
  MT_CHECK(0 <= begin && begin < end && end <= set.size(), "samples [", begin, ", ", end,
           ") of a set of ", set.size());
  const int64_t b = end - begin, h = set.height(), w = set.width(), n = set.image_bytes();
  Tensor x = Tensor::empty({b, channels_, h, w}, DType::f32);
  Tensor y = Tensor::empty({b}, DType::i32);
  float* xs = x.data<float>();
  int32_t* ys = y.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    render(set.image(begin + i), h, w, ImageAugment{}, xs + i * n);
    ys[i] = set.labels()[static_cast<size_t>(begin + i)];
  }
  return {std::move(x), std::move(y)};
}

ImageBatches::ImageBatches(std::shared_ptr<const ImageSet> set, SamplerOptions sampler,
                           int64_t batch_size, ImageTransformOptions transform)
    : set_(std::move(set)),
      sampler_(sized(sampler, set_.get())),
      batch_size_(batch_size),
      transform_(std::move(transform), channels_of(set_.get())) {
  if (batch_size_ < 1) MT_THROW(ValueError, "batch size must be positive, got ", batch_size_);
}

std::pair<Tensor, Tensor> ImageBatches::next() {
  const std::vector<int64_t> samples = sampler_.next(batch_size_, epochs_);
  return transform_.batch(*set_, samples, epochs_);
}

}  // namespace meshtrain::data
