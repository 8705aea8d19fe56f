#include "meshtrain/parallel/tensor_parallel/vocab_parallel_embedding.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/autograd/function.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/parallel/tensor_parallel/region_mappings.h"
#include "meshtrain/parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

namespace meshtrain::parallel::tp {
namespace {

// table[id - begin] for the ids this rank owns, zeros elsewhere; the backward accumulates into
// the owned rows only.
class LocalLookup final : public autograd::Function {
 public:
  LocalLookup(Tensor idx, int64_t begin, int64_t valid)
      : idx_(std::move(idx)), begin_(begin), valid_(valid) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    const Tensor& table = in[0];
    rows_ = table.size(0);
    C_ = table.size(1);
    Shape shape = idx_.shape();
    shape.push_back(C_);
    Tensor out = Tensor::zeros(shape);
    const int32_t* ids = idx_.data<int32_t>();
    const float* t = table.data<float>();
    float* o = out.data<float>();
    for (int64_t n = 0; n < idx_.numel(); ++n) {
      const int64_t row = ids[n] - begin_;
      if (row >= 0 && row < valid_)
        std::memcpy(o + n * C_, t + row * C_, static_cast<size_t>(C_) * sizeof(float));
    }
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    Tensor d = Tensor::zeros({rows_, C_});
    const int32_t* ids = idx_.data<int32_t>();
    const float* go = g[0].data<float>();
    float* dt = d.data<float>();
    for (int64_t n = 0; n < idx_.numel(); ++n) {
      const int64_t row = ids[n] - begin_;
      if (row < 0 || row >= valid_) continue;
      float* dst = dt + row * C_;
      const float* src = go + n * C_;
      for (int64_t c = 0; c < C_; ++c) dst[c] += src[c];
    }
    return {d};
  }
  std::string name() const override { return "VocabParallelLookup"; }

 private:
  Tensor idx_;
  int64_t begin_, valid_;
  int64_t rows_ = 0, C_ = 0;
};

}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(int64_t vocab, int64_t dim, const TpContext& tp,
                                               double init_std)
    : tp_(tp) {
  nn::ParamInit init = nn::ParamInit::normal(init_std);
  init.shard = tp.shard({vocab, dim}, 0);
  const int64_t part = init.shard.part_size();
  begin_ = static_cast<int64_t>(tp.rank()) * part;
  valid_ = std::clamp<int64_t>(vocab - begin_, 0, part);
  weight_ = register_parameter("weight", Tensor::zeros(init.shard.local_shape()), init);
}

Tensor VocabParallelEmbedding::local_lookup(const Tensor& idx) const {
  MT_CHECK(idx.dtype() == DType::i32 && idx.device().is_cpu(),
           "vocab-parallel embedding: token ids must be an i32 CPU tensor, got ", idx.str());
  return autograd::Function::apply(std::make_shared<LocalLookup>(idx, begin_, valid_),
                                   {weight_})[0];
}

Tensor VocabParallelEmbedding::forward(const Tensor& idx) const {
  const Tensor partial = local_lookup(idx);
  return tp_.sequence_parallel ? reduce_scatter_to_sequence_parallel(partial, tp_.group)
                               : reduce_from_tp_region(partial, tp_.group);
}

Tensor VocabParallelEmbedding::embed(const Tensor& idx, const Tensor& wpe) const {
  Tensor x = forward(idx);  // whole, or this rank's time steps
  const int64_t Tl = x.size(1), t0 = tp_.sequence_parallel ? tp_.rank() * Tl : 0;
  return autograd::add(x, autograd::narrow(wpe, 0, t0, Tl));
}

Tensor VocabParallelEmbedding::logits(const Tensor& h) const {
  const Tensor in = tp_.sequence_parallel ? gather_from_sequence_parallel(h, tp_.group)
                                          : copy_to_tp_region(h, tp_.group);
  return autograd::linear(in, weight_, Tensor());
}

Tensor VocabParallelEmbedding::loss(const Tensor& logits, const Tensor& targets) const {
  const int64_t N = targets.numel();
  return vocab_parallel_cross_entropy(autograd::reshape(logits, {N, logits.size(2)}),
                                      targets.view({N}), begin_, valid_, tp_.group, -1);
}

}  // namespace meshtrain::parallel::tp
