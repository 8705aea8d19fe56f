#include "meshtrain/parallel/tensor_parallel/vocab_parallel_embedding.h"

#include <algorithm>

#include "meshtrain/autograd/function.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/parallel/tensor_parallel/region_mappings.h"
#include "meshtrain/parallel/tensor_parallel/vocab_parallel_cross_entropy.h"
#include "meshtrain/tensor/cpu/embedding.h"
#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::parallel::tp {
namespace {

// table[id - begin] for the ids this rank owns, zeros elsewhere; the backward accumulates into
// the owned rows only. The ids are where the table is.
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
    Tensor out = Tensor::empty(shape, DType::f32, table.device());
    const Device d = table.device();
    if (d.is_cpu())
      cpu::vocab_lookup_forward(out.data<float>(), idx_.data<int32_t>(), table.data<float>(),
                                idx_.numel(), C_, begin_, valid_);
    else
      device_kernels(d, "vocab-parallel embedding")
          .vocab_lookup_forward(d, out.data<float>(), idx_.data<int32_t>(), table.data<float>(),
                                idx_.numel(), C_, begin_, valid_);
    return {out};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Device d = g[0].device();
    Tensor dt = Tensor::zeros({rows_, C_}, DType::f32, d);
    if (d.is_cpu())
      cpu::vocab_lookup_backward(dt.data<float>(), g[0].data<float>(), idx_.data<int32_t>(),
                                 idx_.numel(), C_, begin_, valid_);
    else
      device_kernels(d, "vocab-parallel embedding")
          .vocab_lookup_backward(d, dt.data<float>(), g[0].data<float>(), idx_.data<int32_t>(),
                                 idx_.numel(), C_, begin_, valid_);
    return {dt};
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
  MT_CHECK(idx.dtype() == DType::i32 && idx.device() == weight_.device(),
           "vocab-parallel embedding: token ids must be i32 on the table's ",
           weight_.device().str(), ", got ", idx.str());
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
