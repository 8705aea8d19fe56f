// The registry of device kernel tables, one slot per device type, defaulting to the table the
// device's layer provides (nullptr when it was not built).
#include "meshtrain/tensor/device_kernels.h"

#include <array>

#include "meshtrain/cuda/availability.h"
#include "meshtrain/util/error.h"

namespace meshtrain {
namespace {

DeviceKernels* default_kernels(DeviceType type) {
  return type == DeviceType::cuda ? cuda::kernel_table() : nullptr;
}

std::array<DeviceKernels*, 2>& tables() {
  static std::array<DeviceKernels*, 2> t{nullptr, default_kernels(DeviceType::cuda)};
  return t;
}

}  // namespace

void set_device_kernels(DeviceType type, DeviceKernels* kernels) {
  MT_CHECK(type != DeviceType::cpu, "the CPU kernels are not a replaceable table");
  tables()[static_cast<size_t>(type)] = kernels != nullptr ? kernels : default_kernels(type);
}

DeviceKernels& device_kernels(Device device, const char* op) {
  DeviceKernels* k = tables()[static_cast<size_t>(device.type)];
  if (k == nullptr)
    MT_THROW(Error, op, " on ", device.str(), " is not available: ", cuda::unavailable_reason());
  return *k;
}

}  // namespace meshtrain
