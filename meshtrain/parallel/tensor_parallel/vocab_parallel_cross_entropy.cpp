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
  // host_targets: the targets on the host (the same tensor on the CPU), for the loss's count.
  VocabParallelCrossEntropy(Tensor targets, Tensor host_targets, int64_t begin, int64_t valid,
                            comm::ProcessGroupPtr group, int32_t ignore_index)
      : targets_(std::move(targets)),
        host_targets_(std::move(host_targets)),
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
    // The mean over the rows on the host, in double and in row order on either side (a device
    // run waits for its rows here: N floats each).
    const Tensor hmax = max_.to(Device::cpu()), hsum = sum_.to(Device::cpu()),
                 htarget = target_logit.to(Device::cpu());
    const float* mx = hmax.data<float>();
    const float* sm = hsum.data<float>();
    const float* tl = htarget.data<float>();
    const int32_t* ht = host_targets_.data<int32_t>();
    double total = 0;
    count_ = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (ht[n] == ignore_) continue;
      total += std::log(static_cast<double>(sm[n])) + mx[n] - tl[n];
      ++count_;
    }
    const float mean = count_ == 0 ? std::numeric_limits<float>::quiet_NaN()
                                   : static_cast<float>(total / static_cast<double>(count_));
    return {Tensor::scalar(mean).to(device)};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Device device = logits_.device();
    const int64_t N = logits_.size(0), Vl = logits_.size(1);
    if (count_ == 0) return {Tensor::zeros(logits_.shape(), DType::f32, device)};
    Tensor d = Tensor::empty(logits_.shape(), DType::f32, device);
    const float* l = logits_.data<float>();
    const int32_t* t = targets_.data<int32_t>();
    if (device.is_cpu()) {
      const float scale = g[0].item() / static_cast<float>(count_);
      cpu::vocab_parallel_backward(d.data<float>(), l, max_.data<float>(), sum_.data<float>(), t, N,
                                   Vl, valid_, begin_, ignore_, scale);
    } else {
      const Tensor dloss = g[0].device() == device ? g[0] : g[0].to(device);
      device_kernels(device, "vocab-parallel loss")
          .vocab_parallel_backward(device, d.data<float>(), l, max_.data<float>(),
                                   sum_.data<float>(), t, N, Vl, valid_, begin_, ignore_,
                                   dloss.data<float>(), static_cast<float>(count_));
    }
    return {d};
  }
  std::string name() const override { return "VocabParallelCrossEntropy"; }

 private:
  Tensor targets_, host_targets_;
  int64_t begin_, valid_;
  comm::ProcessGroupPtr group_;
  int32_t ignore_;
  Tensor logits_;
  Tensor max_, sum_;  // [N], combined over the group, where the logits are
  int64_t count_ = 0;
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
  // The targets on the host: checked here, and counted by the loss.
  const Tensor host_targets = targets.to(Device::cpu());
  const int32_t* t = host_targets.data<int32_t>();
  for (int64_t n = 0; n < host_targets.numel(); ++n)
    MT_CHECK(t[n] == ignore_index || t[n] >= 0, "vocab-parallel cross-entropy: target ", t[n],
             " at row ", n, " is negative");
  return autograd::Function::apply(std::make_shared<VocabParallelCrossEntropy>(
                                       targets, host_targets, begin, valid, group, ignore_index),
                                   {local_logits})[0];
}

}  // namespace meshtrain::parallel::tp
