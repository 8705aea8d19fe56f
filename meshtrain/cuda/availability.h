// Whether this process can use CUDA, asked without any CUDA header: the tensor core, the command
// line and the tests include this in every build. With CUDA it is answered by the runtime
// (availability.cpp); without, by stub/no_cuda_availability.cpp, which says "built without CUDA".
#pragma once

#include <string>

#include "meshtrain/tensor/storage.h"

namespace meshtrain::cuda {

// True when meshtrain was compiled with the CUDA toolkit.
bool built_with_cuda();

// The number of usable devices: 0 when built without CUDA, when the driver library is missing
// or too old, or when the driver reports no device. Never throws; asked once per process.
int device_count();

// Why device_count() is 0, in one line starting "built without CUDA" or "no CUDA device: ..."
// (the runtime's error name and text); empty when a device is present.
std::string unavailable_reason();

// The tensor core's Allocator for DeviceType::cuda (the caching allocator), or nullptr when
// built without CUDA. Returned whether or not a device exists: allocating then fails with the
// runtime's error.
Allocator* storage_allocator();

}  // namespace meshtrain::cuda
