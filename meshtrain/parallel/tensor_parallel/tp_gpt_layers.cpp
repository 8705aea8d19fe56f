#include "meshtrain/parallel/tensor_parallel/tp_gpt_layers.h"

#include "meshtrain/parallel/tensor_parallel/parallel_linear.h"
#include "meshtrain/parallel/tensor_parallel/sequence_dropout.h"
#include "meshtrain/parallel/tensor_parallel/vocab_parallel_embedding.h"

namespace meshtrain::parallel::tp {
namespace {

class TpGPTLayers : public nn::GPTLayers {
 public:
  explicit TpGPTLayers(const TpContext& tp) : tp_(tp) {}

  void validate(const nn::GPTConfig& config) const override {
    validate_tensor_parallel(config, tp_.size(), tp_.sequence_parallel);
  }
  int ranks() const override { return tp_.size(); }
  int sequence_ranks() const override { return tp_.sequence_parallel ? tp_.size() : 1; }

  std::shared_ptr<nn::Layer> column(int64_t in, int64_t out, bool bias, double init_std,
                                    int64_t blocks, Generator&) const override {
    return std::make_shared<ColumnParallelLinear>(in, out, bias, tp_, init_std, blocks);
  }
  std::shared_ptr<nn::Layer> row(int64_t in, int64_t out, bool bias, double init_std,
                                 Generator&) const override {
    return std::make_shared<RowParallelLinear>(in, out, bias, tp_, init_std);
  }
  std::shared_ptr<nn::VocabTable> vocab(int64_t vocab, int64_t dim, Generator&) const override {
    return std::make_shared<VocabParallelEmbedding>(vocab, dim, tp_);
  }
  Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset,
                 bool training) const override {
    const int64_t Tl = x.size(1), split = sequence_ranks();
    const int64_t t0 = split > 1 ? tp_.rank() * Tl : 0;
    return sequence_dropout(x, p, seed, offset, training, t0, Tl * split);
  }

 private:
  TpContext tp_;
};

}  // namespace

void validate_tensor_parallel(const nn::GPTConfig& config, int tp, bool sequence_parallel) {
  if (tp < 1) MT_THROW(ValueError, "parallel.tp must be at least 1, got ", tp);
  if (sequence_parallel && tp == 1)
    MT_THROW(ValueError,
             "parallel.sequence_parallel = true needs tensor parallelism: set parallel.tp > 1 "
             "or turn sequence_parallel off");
  if (config.n_embd % tp != 0)
    MT_THROW(ValueError, "model.n_embd (", config.n_embd, ") is not divisible by parallel.tp (", tp,
             "): choose a width that splits evenly over the tensor-parallel ranks");
  if (config.n_head % tp != 0)
    MT_THROW(ValueError, "model.n_head (", config.n_head, ") is not divisible by parallel.tp (", tp,
             "): each tensor-parallel rank needs whole attention heads");
}

std::shared_ptr<const nn::GPTLayers> gpt_layers(const nn::GPTConfig& config, const TpContext& tp) {
  config.validate();
  validate_tensor_parallel(config, tp.size(), tp.sequence_parallel);
  if (tp.size() == 1) return nn::plain_gpt_layers();
  return std::make_shared<const TpGPTLayers>(tp);
}

}  // namespace meshtrain::parallel::tp
