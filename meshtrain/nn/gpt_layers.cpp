#include "meshtrain/nn/gpt_layers.h"

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/linear_cross_entropy.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {
namespace {

// The whole [V, C] table, drawn as nn::Embedding draws it.
class PlainVocabTable : public VocabTable {
 public:
  PlainVocabTable(int64_t vocab, int64_t dim, Generator& gen) {
    Tensor w = Tensor::empty({vocab, dim});
    normal_(w, gen, 0.0, 0.02);
    weight_ = register_parameter("weight", w, ParamInit::normal(0.02));
  }
  const Tensor& weight() const override { return weight_; }
  // One fused kernel for the token and position lookups.
  Tensor embed(const Tensor& idx, const Tensor& wpe) const override {
    return autograd::gpt_embedding(idx, weight_, wpe);
  }
  Tensor logits(const Tensor& h) const override { return autograd::linear(h, weight_, Tensor()); }
  Tensor loss(const Tensor& logits, const Tensor& targets) const override {
    const int64_t N = targets.numel();
    return autograd::cross_entropy(autograd::reshape(logits, {N, logits.size(2)}),
                                   targets.view({N}), -1);
  }
  Tensor loss_of_hidden(const Tensor& h, const Tensor& targets) const override {
    return autograd::linear_cross_entropy(h, weight_, targets, -1);
  }
  bool takes_half_hidden() const override { return true; }

 private:
  Tensor weight_;
};

class PlainGPTLayers : public GPTLayers {
 public:
  void validate(const GPTConfig&) const override {}
  int ranks() const override { return 1; }
  int sequence_ranks() const override { return 1; }
  std::shared_ptr<Layer> column(int64_t in, int64_t out, bool bias, double init_std, int64_t,
                                Generator& gen) const override {
    return std::make_shared<Linear>(in, out, bias, gen, init_std);
  }
  std::shared_ptr<Layer> row(int64_t in, int64_t out, bool bias, double init_std,
                             Generator& gen) const override {
    return std::make_shared<Linear>(in, out, bias, gen, init_std);
  }
  std::shared_ptr<VocabTable> vocab(int64_t vocab, int64_t dim, Generator& gen) const override {
    return std::make_shared<PlainVocabTable>(vocab, dim, gen);
  }
  Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset,
                 bool training) const override {
    return autograd::dropout(x, p, seed, offset, training);
  }
};

}  // namespace

std::shared_ptr<const GPTLayers> plain_gpt_layers() {
  static const auto layers = std::make_shared<const PlainGPTLayers>();
  return layers;
}

}  // namespace meshtrain::nn
