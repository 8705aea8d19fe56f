#include "meshtrain/optim/step_gate.h"

#include <cstring>

#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/util/error.h"

namespace meshtrain::optim {

namespace {

const double* doubles(const DeviceSquares& s) {
  return s.count > 0 ? static_cast<const double*>(s.sums.data_ptr()) : nullptr;
}

}  // namespace

Tensor gate_step(const Tensor& losses, const DeviceSquares& pre, const DeviceSquares& squares,
                 double max_norm) {
  if (max_norm > 0.0) check_max_norm(max_norm);
  const Device device = losses.device();
  MT_CHECK(!device.is_cpu() && losses.dtype() == DType::f32 && losses.dim() == 1,
           "step gate: the losses must be a 1-d f32 device tensor, got ", losses.str());
  for (const DeviceSquares* s : {&pre, &squares})
    MT_CHECK(s->count == 0 || (s->sums.device() == device &&
                               s->sums.numel() == s->count * static_cast<int64_t>(sizeof(double))),
             "step gate: ", s->count, " sums of squares must be on ", device.str());
  MT_CHECK(squares.split >= 0 && squares.split <= squares.count, "step gate: ", squares.split,
           " split sums out of ", squares.count);
  Tensor gate = Tensor::empty({static_cast<int64_t>(sizeof(cpu::StepGate))}, DType::u8, device);
  device_kernels(device, "step gate")
      .step_gate(device, static_cast<cpu::StepGate*>(gate.data_ptr()), losses.data<float>(),
                 losses.numel(), doubles(pre), pre.count, doubles(squares), squares.split,
                 squares.count, max_norm, kClipEpsilon);
  return gate;
}

cpu::StepGate read_gate(const Tensor& gate) {
  MT_CHECK(gate.dtype() == DType::u8 && gate.numel() == sizeof(cpu::StepGate),
           "step gate: ", gate.str(), " holds no gate");
  const Tensor host = gate.to(Device::cpu());
  cpu::StepGate out;
  std::memcpy(&out, host.data_ptr(), sizeof out);
  return out;
}

}  // namespace meshtrain::optim
