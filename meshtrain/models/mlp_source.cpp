#include "meshtrain/models/mlp_source.h"

#include <string>

#include "meshtrain/autograd/functional.h"
#include "meshtrain/util/error.h"

namespace meshtrain::models {

namespace {

// Layers [begin, end) of a classifier built whole from its seed (small: the values of a layer
// depend on the draws of the layers before it).
class MlpStage : public StageModule {
 public:
  MlpStage(const std::vector<int64_t>& sizes, uint64_t seed, size_t begin, size_t end)
      : sizes_(sizes), begin_(begin), end_(end) {
    const nn::MLPClassifier whole(sizes, seed);
    for (size_t i = begin; i < end; ++i)
      layers_.push_back(register_module(std::to_string(i), whole.layers()[i]));
  }
  Tensor forward(const Tensor& input, const Tensor& targets, uint64_t /*seed*/) const override {
    const size_t n = sizes_.size() - 1;  // layers of the whole classifier
    Tensor h = input;
    for (size_t i = begin_; i < end_; ++i) {
      h = layers_[i - begin_]->forward(h);
      if (i + 1 < n) h = autograd::gelu(h);
    }
    return is_last() ? autograd::cross_entropy(h, targets, -1) : h;
  }
  bool is_first() const override { return begin_ == 0; }
  bool is_last() const override { return end_ == sizes_.size() - 1; }
  Shape input_shape(int64_t B, int64_t T) const override {
    return is_first() ? Shape{B, T} : Shape{B, sizes_[begin_]};
  }
  Shape output_shape(int64_t B, int64_t /*T*/) const override {
    return is_last() ? Shape{} : Shape{B, sizes_[end_]};
  }

 private:
  std::vector<int64_t> sizes_;
  size_t begin_, end_;
  std::vector<std::shared_ptr<nn::Linear>> layers_;
};

}  // namespace

MlpStack::MlpStack(std::vector<int64_t> sizes, uint64_t seed)
    : sizes_(std::move(sizes)), seed_(seed) {
  MT_CHECK(sizes_.size() >= 2, "an MLP classifier needs at least input and class sizes");
  for (size_t i = 0; i + 1 < sizes_.size(); ++i) {
    const int64_t in = sizes_[i], out = sizes_[i + 1];
    layers_.push_back({std::to_string(i), in * out + out, 6 * in * out});
  }
}

std::unique_ptr<StageModule> MlpStack::build(size_t begin, size_t end) const {
  MT_CHECK(begin < end && end <= layers_.size(), "layers [", begin, ", ", end,
           ") are not a range of the classifier's ", layers_.size());
  return std::make_unique<MlpStage>(sizes_, seed_, begin, end);
}

MlpSource::MlpSource(std::vector<int64_t> sizes, uint64_t seed)
    : sizes_(sizes), seed_(seed), stack_(std::move(sizes), seed) {}

std::shared_ptr<parallel::TrainModel> MlpSource::build(const parallel::tp::TpContext& tp) const {
  if (tp.size() > 1)
    MT_THROW(ValueError,
             "the MLP classifier is not split over tensor-parallel ranks; use "
             "parallel.tp = 1");
  return std::make_shared<MlpModel>(std::make_shared<nn::MLPClassifier>(sizes_, seed_));
}

std::unique_ptr<StageModule> MlpSource::build_stage(size_t begin, size_t end,
                                                    const parallel::tp::TpContext& tp) const {
  if (tp.size() > 1)
    MT_THROW(ValueError,
             "the MLP classifier is not split over tensor-parallel ranks; use "
             "parallel.tp = 1");
  return stack_.build(begin, end);
}

std::vector<nn::ParamInfo> MlpSource::param_infos() const {
  return nn::MLPClassifier(sizes_, seed_).param_infos();
}

size_t MlpSource::layer_of(const std::string& name) const {
  return std::stoul(name.substr(0, name.find('.')));
}

int64_t MlpSource::num_parameters() const {
  int64_t n = 0;
  for (const LayerSpec& l : stack_.layers()) n += l.params;
  return n;
}

}  // namespace meshtrain::models
