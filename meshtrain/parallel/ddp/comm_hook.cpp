#include "meshtrain/parallel/ddp/comm_hook.h"

namespace meshtrain::parallel {

comm::WorkPtr AllReduceHook::launch(GradBucket& bucket, comm::ProcessGroup& pg) {
  return pg.all_reduce(bucket.buffer.data_ptr(), static_cast<size_t>(bucket.buffer.numel()),
                       DType::f32);
}

HalfPrecisionHook::HalfPrecisionHook(DType dtype) : dtype_(dtype) {
  MT_CHECK(dtype == DType::bf16 || dtype == DType::f16, "half-precision hook needs bf16 or f16");
}

std::string HalfPrecisionHook::name() const {
  return std::string(dtype_name(dtype_));
}

comm::WorkPtr HalfPrecisionHook::launch(GradBucket& bucket, comm::ProcessGroup& pg) {
  if (staging_.size() <= static_cast<size_t>(bucket.index)) staging_.resize(bucket.index + 1);
  Tensor& s = staging_[static_cast<size_t>(bucket.index)];
  if (!s.defined() || s.numel() != bucket.buffer.numel())
    s = Tensor::empty(bucket.buffer.shape(), dtype_);
  s.copy_(bucket.buffer);
  return pg.all_reduce(s.data_ptr(), static_cast<size_t>(s.numel()), dtype_);
}

void HalfPrecisionHook::finish(GradBucket& bucket) {
  bucket.buffer.copy_(staging_[static_cast<size_t>(bucket.index)]);
}

std::unique_ptr<CommHook> make_comm_hook(const std::string& name) {
  if (name == "allreduce" || name == "none" || name.empty())
    return std::make_unique<AllReduceHook>();
  if (name == "bf16") return std::make_unique<HalfPrecisionHook>(DType::bf16);
  if (name == "f16") return std::make_unique<HalfPrecisionHook>(DType::f16);
  MT_THROW(ValueError, "unknown comm hook '", name, "' (expected allreduce, bf16 or f16)");
}

}  // namespace meshtrain::parallel
