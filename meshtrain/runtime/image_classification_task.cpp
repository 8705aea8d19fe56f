#include "meshtrain/runtime/image_classification_task.h"

#include <algorithm>
#include <cstdio>

#include "meshtrain/data/image_batches.h"
#include "meshtrain/nn/resnet.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

namespace {

// Fashion-MNIST's normalisation and the augmentation data.crop_padding and data.horizontal_flip
// ask for.
data::ImageTransformOptions train_transform(const TrainConfig& c) {
  data::ImageTransformOptions o =
      data::fashion_mnist_transform(true, static_cast<uint64_t>(c.data.seed));
  o.crop_padding = c.data.crop_padding;
  o.horizontal_flip = c.data.horizontal_flip;
  return o;
}

}  // namespace

ImageClassificationTask::ImageClassificationTask(const ResolvedConfig& config)
    : config_(config.config) {
  MT_CHECK(config.choice.data == DataKind::fashion_mnist, "an image task needs an image set");
  train_ =
      std::make_shared<data::ImageSet>(data::load_fashion_mnist(config_.data.image_dir, "train"));
  test_ =
      std::make_shared<data::ImageSet>(data::load_fashion_mnist(config_.data.image_dir, "test"));
}

std::unique_ptr<data::BatchSource> ImageClassificationTask::train_batches(
    int replicas, int replica, int64_t batch_size) const {
  const data::SamplerOptions so = training_order(config_, replicas, replica);
  return std::make_unique<data::ImageBatches>(train_, so, batch_size, train_transform(config_));
}

std::vector<std::pair<Tensor, Tensor>> ImageClassificationTask::eval_batches() const {
  const data::ImageTransform transform(data::fashion_mnist_transform(false), test_->channels());
  const int64_t batch_size = config_.data.batch_size;
  const int64_t batches = eval_batch_count(config_, test_->size());
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int64_t i = 0; i < batches; ++i)
    out.push_back(
        transform.slice(*test_, i * batch_size, std::min(test_->size(), (i + 1) * batch_size)));
  return out;
}

ThroughputUnit ImageClassificationTask::unit() const {
  return {.name = "images", .rate = "img/s", .per_sample = 1, .flops_per_unit = 0};
}

std::string ImageClassificationTask::describe(int64_t parameters) const {
  return "ResNet (" + config_.model.resnet + ") " + std::to_string(parameters) +
         " parameters; Fashion-MNIST " + std::to_string(train_->size()) + " training images, " +
         std::to_string(test_->size()) + " test images";
}

std::string ImageClassificationTask::sample(parallel::TrainEngine& engine) const {
  auto& model = dynamic_cast<nn::ResNet&>(engine.model());
  const Device device = model.named_parameters().front().second.device();
  model.eval();
  const data::ImageTransform transform(data::fashion_mnist_transform(false), test_->channels());
  int64_t right = 0;
  constexpr int64_t kChunk = 500;
  for (int64_t begin = 0; begin < test_->size(); begin += kChunk) {
    const int64_t end = std::min(test_->size(), begin + kChunk);
    const auto [x, y] = transform.slice(*test_, begin, end);
    // The images are made on the host; the model may live on a device.
    const std::vector<int32_t> predicted = model.predict(x.to(device));
    for (int64_t i = begin; i < end; ++i)
      right += predicted[static_cast<size_t>(i - begin)] == test_->labels()[static_cast<size_t>(i)];
  }
  model.train();
  char line[160];
  std::snprintf(line, sizeof line, "test accuracy %.2f%% (%lld images)",
                100.0 * static_cast<double>(right) / static_cast<double>(test_->size()),
                static_cast<long long>(test_->size()));
  return line;
}

}  // namespace meshtrain::runtime
