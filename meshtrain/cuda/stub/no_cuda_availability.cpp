// The answers of availability.h in a build without the CUDA toolkit: no devices, and a reason
// that says so, so that asking for a cuda tensor fails with one clear line.
#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/device_support.h"

#include "meshtrain/util/error.h"

namespace meshtrain::cuda {

bool built_with_cuda() {
  return false;
}

int device_count() {
  return 0;
}

std::string unavailable_reason() {
  return "built without CUDA (the CUDA toolkit was not found when meshtrain was configured, or "
         "MESHTRAIN_CUDA=OFF)";
}

Allocator* storage_allocator() {
  return nullptr;
}

DeviceKernels* kernel_table() {
  return nullptr;
}

void set_allow_tf32(bool) {}

void use_device(int index) {
  MT_THROW(Error, "cuda:", index, " is not available: ", unavailable_reason());
}

std::string compiled_architectures() {
  return "none (built without CUDA)";
}

std::string unsupported_reason(int, DType) {
  return unavailable_reason();
}

}  // namespace meshtrain::cuda
