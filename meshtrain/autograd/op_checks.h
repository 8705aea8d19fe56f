// Operand checks and small helpers shared by the files of fused autograd ops (functional.cpp,
// vision.cpp): every op names itself and the offending operand the same way.
#pragma once

#include <initializer_list>
#include <vector>

#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd::detail {

inline void check_f32(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.defined(), op, ": ", what, " is undefined");
  MT_CHECK(t.dtype() == DType::f32, op, ": ", what, " must be f32, got ", dtype_name(t.dtype()));
}

inline void check_cpu_only(const Tensor& t, const char* op) {
  MT_CHECK(t.device().is_cpu(), op, " is not supported on ", t.device().str(),
           " (it runs on the CPU only)");
}

// Every defined operand must be on the first one's device. Returns that device's kernel table,
// or nullptr on the CPU (whose kernels are called directly): the CPU path pays one branch.
inline DeviceKernels* kernels_for(const char* op, std::initializer_list<const Tensor*> operands) {
  const Device d = (*operands.begin())->device();
  for (const Tensor* t : operands)
    MT_CHECK(!t->defined() || t->device() == d, op, ": operands on ", d.str(), " and ",
             t->device().str(), "; move the model and its inputs to one device");
  if (d.is_cpu()) [[likely]]
    return nullptr;
  return &device_kernels(d, op);
}

inline float* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

inline bool wants(const Tensor& t) {
  return t.defined() && t.requires_grad();
}

// An op's inputs or gradients, with the residual's last where the op adds one (linear_residual,
// gelu_mlp).
inline std::vector<Tensor> with_residual(std::vector<Tensor> v, const Tensor& residual,
                                         bool has_residual) {
  if (has_residual) v.push_back(residual);
  return v;
}
inline std::vector<Tensor> with_residual(std::vector<Tensor> v, const Tensor& residual) {
  return with_residual(std::move(v), residual, residual.defined());
}

}  // namespace meshtrain::autograd::detail
