#include "meshtrain/nn/top1.h"

#include "meshtrain/util/error.h"

namespace meshtrain::nn {

std::vector<int32_t> top1(const Tensor& logits) {
  MT_CHECK(logits.dim() == 2 && logits.dtype() == DType::f32,
           "top1: expected f32 logits [N, K], got ", shape_str(logits.shape()));
  const Tensor host = logits.device().is_cpu() ? logits : logits.to(Device::cpu());
  const int64_t n = host.size(0), k = host.size(1);
  const float* p = host.data<float>();
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j)
      if (p[i * k + j] > p[i * k + best]) best = j;
    out[static_cast<size_t>(i)] = static_cast<int32_t>(best);
  }
  return out;
}

int64_t count_top1(const Tensor& logits, const Tensor& labels) {
  const std::vector<int32_t> predicted = top1(logits);
  MT_CHECK(labels.dtype() == DType::i32 && labels.numel() == static_cast<int64_t>(predicted.size()),
           "count_top1: expected ", predicted.size(), " i32 labels, got ",
           shape_str(labels.shape()));
  const Tensor host = labels.device().is_cpu() ? labels : labels.to(Device::cpu());
  const int32_t* y = host.data<int32_t>();
  int64_t right = 0;
  for (size_t i = 0; i < predicted.size(); ++i) right += predicted[i] == y[i];
  return right;
}

}  // namespace meshtrain::nn
