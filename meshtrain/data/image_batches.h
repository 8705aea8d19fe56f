// Image batches for training and evaluation: stored bytes in, normalised f32 images [B, C, H, W]
// and i32 labels [B] out, in the order of a Sampler, as ClassificationBatches does for feature
// rows (data-parallel sharding, seeded shuffling, a restorable position).
//
// Training augmentation is torchvision's RandomCrop(size, padding=p) then
// RandomHorizontalFlip(0.5): the image is padded with p zero pixels on every side, an H x W window
// of the padded image is cut at a random offset, and the result is mirrored left-right with
// probability 1/2. Padding is in pixel space, before normalisation, so a padded pixel becomes
// (0 - mean) / std as it does in torchvision. Each sample's draw is a pure function of (seed,
// epoch, sample index) through a counter-based generator: a sample is augmented the same way on
// whichever rank reads it, at any world size and after a restart, so a resumed or resharded run
// sees exactly the images an uninterrupted one would have.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "meshtrain/data/image_set.h"
#include "meshtrain/data/prefetch_loader.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::data {

struct ImageTransformOptions {
  // Per channel, on the [0, 1] pixel scale: a byte p of channel c becomes
  // (p / 255 - mean[c]) / std[c]. One value stands for every channel.
  std::vector<float> mean{0.0f};
  std::vector<float> std{1.0f};
  // Random crop: zero pixels added on every side before an H x W window is cut (0: no crop).
  int64_t crop_padding = 0;
  // Random left-right mirror with probability 1/2.
  bool horizontal_flip = false;
  // Keys the augmentation draws (salted: it may equal the sampler's seed).
  uint64_t seed = 0;
};

// Fashion-MNIST's normalisation; with `train`, its usual augmentation (crop with padding 4, flip).
ImageTransformOptions fashion_mnist_transform(bool train, uint64_t seed = 0);

// One sample's augmentation: output pixel (y, x) is input pixel (y + shift_y, x + shift_x), or
// (y + shift_y, W - 1 - x + shift_x) when flipped; positions outside the image are zero pixels.
struct ImageAugment {
  int64_t shift_y = 0;  // in [-crop_padding, crop_padding]
  int64_t shift_x = 0;
  bool flip = false;
  friend bool operator==(const ImageAugment&, const ImageAugment&) = default;
};

// Normalisation and augmentation of one set's images, decided once: per channel, a byte p becomes
// p * scale + shift, so a pixel costs a convert and a multiply-add.
class ImageTransform {
 public:
  // ValueError for a mean or std list that is neither one value nor one per channel, a std that
  // is not positive and finite, or a negative crop padding.
  ImageTransform(ImageTransformOptions options, int64_t channels);

  const ImageTransformOptions& options() const { return options_; }
  bool augments() const { return options_.crop_padding > 0 || options_.horizontal_flip; }

  // The augmentation of `sample` in `epoch` (none when the transform does not augment).
  ImageAugment draw(int64_t epoch, int64_t sample) const;
  // Writes one image [C, H, W] of bytes to `out` as normalised f32, augmented by `augment`.
  void render(std::span<const uint8_t> image, int64_t height, int64_t width,
              const ImageAugment& augment, float* out) const;

  // Images [B, C, H, W] (f32) and labels [B] (i32) of `samples`, each augmented by its draw for
  // the epoch it was sampled in (epochs[i], one per sample).
  std::pair<Tensor, Tensor> batch(const ImageSet& set, std::span<const int64_t> samples,
                                  std::span<const int64_t> epochs) const;
  // Samples [begin, end) in order and without augmentation: evaluation.
  std::pair<Tensor, Tensor> slice(const ImageSet& set, int64_t begin, int64_t end) const;

 private:
  ImageTransformOptions options_;
  int64_t channels_;
  std::vector<float> scale_;  // per channel: 1 / (255 std)
  std::vector<float> shift_;  // per channel: -mean / std, the value of a zero pixel
};

// Batches of an ImageSet in the order of a Sampler, transformed; the sampler's position is the
// one a checkpoint saves.
class ImageBatches : public BatchSource {
 public:
  // sampler.num_windows is filled in from the set; ValueError for a batch size below 1 and for
  // transform options that do not fit the set (ImageTransform).
  ImageBatches(std::shared_ptr<const ImageSet> set, SamplerOptions sampler, int64_t batch_size,
               ImageTransformOptions transform);
  std::pair<Tensor, Tensor> next() override;
  SamplerState state() const override { return sampler_.state(); }
  void set_state(const SamplerState& state) override { sampler_.set_state(state); }

  const ImageTransform& transform() const { return transform_; }

 private:
  std::shared_ptr<const ImageSet> set_;
  Sampler sampler_;
  int64_t batch_size_;
  ImageTransform transform_;
  std::vector<int64_t> epochs_;  // of the last batch's samples (kept to reuse its memory)
};

}  // namespace meshtrain::data
