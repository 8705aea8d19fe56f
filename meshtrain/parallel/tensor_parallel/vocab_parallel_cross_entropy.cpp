#include "meshtrain/parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "meshtrain/autograd/function.h"

namespace meshtrain::parallel::tp {
namespace {

void all_reduce(std::vector<float>& v, comm::ReduceOp op, const comm::ProcessGroupPtr& group) {
  if (group == nullptr || group->size() == 1) return;
  comm::AllReduceOptions opts;
  opts.op = op;
  opts.async_op = false;
  group->all_reduce(v.data(), v.size(), DType::f32, opts)->wait();
}

class VocabParallelCrossEntropy final : public autograd::Function {
 public:
  VocabParallelCrossEntropy(Tensor targets, int64_t begin, int64_t valid,
                            comm::ProcessGroupPtr group, int32_t ignore_index)
      : targets_(std::move(targets)),
        begin_(begin),
        valid_(valid),
        group_(std::move(group)),
        ignore_(ignore_index) {}

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    logits_ = in[0];
    const int64_t N = logits_.size(0), Vl = logits_.size(1);
    const float* l = logits_.data<float>();
    const int32_t* t = targets_.data<int32_t>();
    // The global row max, then the sum of exponentials and the target's logit against it.
    max_.assign(static_cast<size_t>(N), -std::numeric_limits<float>::infinity());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = 0; v < valid_; ++v) max_[n] = std::max(max_[n], l[n * Vl + v]);
    all_reduce(max_, comm::ReduceOp::max, group_);
    sum_.assign(static_cast<size_t>(N), 0.0f);
    std::vector<float> target_logit(static_cast<size_t>(N), 0.0f);
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t v = 0; v < valid_; ++v) s += std::exp(l[n * Vl + v] - max_[n]);
      sum_[n] = static_cast<float>(s);
      const int64_t col = static_cast<int64_t>(t[n]) - begin_;
      if (t[n] != ignore_ && col >= 0 && col < valid_) target_logit[n] = l[n * Vl + col];
    }
    all_reduce(sum_, comm::ReduceOp::sum, group_);
    all_reduce(target_logit, comm::ReduceOp::sum, group_);
    double total = 0;
    count_ = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (targets_.data<int32_t>()[n] == ignore_) continue;
      total += std::log(static_cast<double>(sum_[n])) + max_[n] - target_logit[n];
      ++count_;
    }
    const float mean = count_ == 0 ? std::numeric_limits<float>::quiet_NaN()
                                   : static_cast<float>(total / static_cast<double>(count_));
    return {Tensor::scalar(mean)};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const int64_t N = logits_.size(0), Vl = logits_.size(1);
    Tensor d = Tensor::zeros(logits_.shape());
    if (count_ == 0) return {d};
    const float scale = g[0].item() / static_cast<float>(count_);
    const float* l = logits_.data<float>();
    const int32_t* t = targets_.data<int32_t>();
    float* dl = d.data<float>();
    for (int64_t n = 0; n < N; ++n) {
      if (t[n] == ignore_) continue;
      const float inv = 1.0f / sum_[n];
      for (int64_t v = 0; v < valid_; ++v)
        dl[n * Vl + v] = std::exp(l[n * Vl + v] - max_[n]) * inv * scale;
      const int64_t col = static_cast<int64_t>(t[n]) - begin_;
      if (col >= 0 && col < valid_) dl[n * Vl + col] -= scale;
    }
    return {d};
  }
  std::string name() const override { return "VocabParallelCrossEntropy"; }

 private:
  Tensor targets_;
  int64_t begin_, valid_;
  comm::ProcessGroupPtr group_;
  int32_t ignore_;
  Tensor logits_;
  std::vector<float> max_, sum_;
  int64_t count_ = 0;
};

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    int64_t begin, int64_t valid,
                                    const comm::ProcessGroupPtr& group, int32_t ignore_index) {
  MT_CHECK(local_logits.dtype() == DType::f32 && local_logits.device().is_cpu() &&
               local_logits.dim() == 2,
           "vocab-parallel cross-entropy: logits must be f32 [N, V / tp] on the CPU, got ",
           local_logits.str());
  MT_CHECK(targets.dtype() == DType::i32 && targets.numel() == local_logits.size(0),
           "vocab-parallel cross-entropy: targets must be i32 [N] for logits ",
           shape_str(local_logits.shape()), ", got ", targets.str());
  MT_CHECK(valid >= 0 && valid <= local_logits.size(1), "vocab-parallel cross-entropy: ", valid,
           " valid columns of ", local_logits.size(1));
  const int32_t* t = targets.data<int32_t>();
  for (int64_t n = 0; n < targets.numel(); ++n)
    MT_CHECK(t[n] == ignore_index || t[n] >= 0, "vocab-parallel cross-entropy: target ", t[n],
             " at row ", n, " is negative");
  return autograd::Function::apply(
      std::make_shared<VocabParallelCrossEntropy>(targets, begin, valid, group, ignore_index),
      {local_logits})[0];
}

}  // namespace meshtrain::parallel::tp
