#include "meshtrain/data/classification_set.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::data {

ClassificationSet::ClassificationSet(std::vector<float> features, std::vector<int32_t> labels,
                                     int64_t num_features, int64_t num_classes)
    : features_(std::move(features)),
      labels_(std::move(labels)),
      num_features_(num_features),
      num_classes_(num_classes) {
  if (num_features_ < 1 || num_classes_ < 2)
    MT_THROW(ValueError, "a classification set needs at least one feature and two classes, got ",
             num_features_, " features and ", num_classes_, " classes");
  if (labels_.empty()) MT_THROW(ValueError, "a classification set needs at least one sample");
  if (features_.size() != labels_.size() * static_cast<size_t>(num_features_))
    MT_THROW(ValueError, "a classification set of ", labels_.size(), " samples with ",
             num_features_, " features needs ", labels_.size() * static_cast<size_t>(num_features_),
             " feature values, got ", features_.size());
  const auto bad = std::find_if(labels_.begin(), labels_.end(),
                                [&](int32_t y) { return y < 0 || y >= num_classes_; });
  if (bad != labels_.end())
    MT_THROW(ValueError, "sample ", bad - labels_.begin(), " has label ", *bad,
             ", outside the set's ", num_classes_, " classes");
}

std::pair<Tensor, Tensor> ClassificationSet::get_batch(const std::vector<int64_t>& indices) const {
  const auto b = static_cast<int64_t>(indices.size());
  MT_CHECK(b > 0, "empty batch");
  Tensor x = Tensor::empty({b, num_features_}, DType::f32);
  Tensor y = Tensor::empty({b}, DType::i32);
  float* xs = x.data<float>();
  int32_t* ys = y.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t s = indices[static_cast<size_t>(i)];
    MT_CHECK(s >= 0 && s < size(), "sample ", s, " of a set of ", size());
    std::memcpy(xs + i * num_features_, features_.data() + s * num_features_,
                static_cast<size_t>(num_features_) * sizeof(float));
    ys[i] = labels_[static_cast<size_t>(s)];
  }
  return {std::move(x), std::move(y)};
}

std::pair<Tensor, Tensor> ClassificationSet::slice(int64_t begin, int64_t end) const {
  MT_CHECK(0 <= begin && begin < end && end <= size(), "samples [", begin, ", ", end,
           ") of a set of ", size());
  std::vector<int64_t> indices(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) indices[static_cast<size_t>(i - begin)] = i;
  return get_batch(indices);
}

namespace {

SamplerOptions sized(SamplerOptions options, const ClassificationSet* set) {
  MT_CHECK(set != nullptr, "ClassificationBatches without a set");
  options.num_windows = set->size();
  return options;
}

}  // namespace

ClassificationBatches::ClassificationBatches(std::shared_ptr<const ClassificationSet> set,
                                             SamplerOptions options, int64_t batch_size)
    : set_(std::move(set)), sampler_(sized(options, set_.get())), batch_size_(batch_size) {
  if (batch_size_ < 1) MT_THROW(ValueError, "batch size must be positive, got ", batch_size_);
}

std::pair<Tensor, Tensor> ClassificationBatches::next() {
  return set_->get_batch(sampler_.next(batch_size_));
}

}  // namespace meshtrain::data
