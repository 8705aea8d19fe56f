#include "meshtrain/parallel/tensor_parallel/vocab_parallel_cross_entropy.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "meshtrain/autograd/function.h"
#include "meshtrain/tensor/cpu/vocab_parallel_cross_entropy.h"
#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::parallel::tp {
namespace {

// In place over the group; the rows live where the logits do (a device's rows through its group).
void all_reduce(Tensor& rows, comm::ReduceOp op, const comm::ProcessGroupPtr& group) {
  if (group == nullptr || group->size() == 1) return;
  comm::AllReduceOptions opts;
  opts.op = op;
  opts.async_op = false;
  group->all_reduce(rows.data_ptr(), static_cast<size_t>(rows.numel()), DType::f32, opts)->wait();
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
    const Device device = logits_.device();
    const int64_t N = logits_.size(0), Vl = logits_.size(1);
    const float* l = logits_.data<float>();
    const int32_t* t = targets_.data<int32_t>();
    DeviceKernels* k = device.is_cpu() ? nullptr : &device_kernels(device, "vocab-parallel loss");
    // The global row max, then the sum of exponentials and the target's logit against it.
    max_ = Tensor::empty({N}, DType::f32, device);
    if (k)
      k->vocab_parallel_row_max(device, max_.data<float>(), l, N, Vl, valid_);
    else
      cpu::vocab_parallel_row_max(max_.data<float>(), l, N, Vl, valid_);
    all_reduce(max_, comm::ReduceOp::max, group_);
    sum_ = Tensor::empty({N}, DType::f32, device);
    Tensor target_logit = Tensor::empty({N}, DType::f32, device);
    if (k)
      k->vocab_parallel_row_sums(device, sum_.data<float>(), target_logit.data<float>(), l,
                                 max_.data<float>(), t, N, Vl, valid_, begin_, ignore_);
    else
      cpu::vocab_parallel_row_sums(sum_.data<float>(), target_logit.data<float>(), l,
                                   max_.data<float>(), t, N, Vl, valid_, begin_, ignore_);
    all_reduce(sum_, comm::ReduceOp::sum, group_);
    all_reduce(target_logit, comm::ReduceOp::sum, group_);
    // The mean and the count of the rows that count, where the rows are (a device's stay there:
    // the host reads nothing here).
    mean_count_ = Tensor::empty({2}, DType::f32, device);
    if (k)
      k->vocab_parallel_loss_mean(device, mean_count_.data<float>(), max_.data<float>(),
                                  sum_.data<float>(), target_logit.data<float>(), t, N, ignore_);
    else
      cpu::vocab_parallel_loss_mean(mean_count_.data<float>(), max_.data<float>(),
                                    sum_.data<float>(), target_logit.data<float>(), t, N, ignore_);
    return {mean_count_.slice(0, 1).clone().view({})};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Device device = logits_.device();
    const int64_t N = logits_.size(0), Vl = logits_.size(1);
    Tensor d = Tensor::empty(logits_.shape(), DType::f32, device);
    const float* l = logits_.data<float>();
    const int32_t* t = targets_.data<int32_t>();
    if (device.is_cpu()) {
      const float count = mean_count_.data<float>()[1];
      if (count == 0) return {Tensor::zeros(logits_.shape())};
      const float scale = g[0].item() / count;
      cpu::vocab_parallel_backward(d.data<float>(), l, max_.data<float>(), sum_.data<float>(), t, N,
                                   Vl, valid_, begin_, ignore_, scale);
    } else {
      // Every row ignored: the kernel writes zeros without reading the count.
      const Tensor dloss = g[0].device() == device ? g[0] : g[0].to(device);
      device_kernels(device, "vocab-parallel loss")
          .vocab_parallel_backward(device, d.data<float>(), l, max_.data<float>(),
                                   sum_.data<float>(), t, N, Vl, valid_, begin_, ignore_,
                                   dloss.data<float>(), mean_count_.data<float>() + 1);
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
  Tensor max_, sum_;   // [N], combined over the group, where the logits are
  Tensor mean_count_;  // [2]: the mean loss and the count of the rows that count
};

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    int64_t begin, int64_t valid,
                                    const comm::ProcessGroupPtr& group, int32_t ignore_index) {
  MT_CHECK(local_logits.defined() && local_logits.dtype() == DType::f32 && local_logits.dim() == 2,
           "vocab-parallel cross-entropy: logits must be f32 [N, V / tp], got ",
           local_logits.defined() ? local_logits.str() : std::string("undefined"));
  MT_CHECK(targets.dtype() == DType::i32 && targets.numel() == local_logits.size(0),
           "vocab-parallel cross-entropy: targets must be i32 [N] for logits ",
           shape_str(local_logits.shape()), ", got ", targets.str());
  MT_CHECK(targets.device() == local_logits.device(), "vocab-parallel cross-entropy: logits on ",
           local_logits.device().str(), " and targets on ", targets.device().str());
  MT_CHECK(valid >= 0 && valid <= local_logits.size(1), "vocab-parallel cross-entropy: ", valid,
           " valid columns of ", local_logits.size(1));
  // On the CPU a negative target is an error here; a device's targets are not read on the host
  // (the loss is NaN for one, as the device's plain cross-entropy).
  if (targets.device().is_cpu()) {
    const int32_t* t = targets.data<int32_t>();
    for (int64_t n = 0; n < targets.numel(); ++n)
      MT_CHECK(t[n] == ignore_index || t[n] >= 0, "vocab-parallel cross-entropy: target ", t[n],
               " at row ", n, " is negative");
  }
  return autograd::Function::apply(
      std::make_shared<VocabParallelCrossEntropy>(targets, begin, valid, group, ignore_index),
      {local_logits})[0];
}

}  // namespace meshtrain::parallel::tp
