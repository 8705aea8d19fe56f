// Whether this process can use CUDA, asked without any CUDA header, and the few CUDA entry points
// that code outside meshtrain/cuda needs (the tensor core's allocator and kernel table, the
// trainer's device choice): the tensor core, the command line and the tests include this in every
// build. With CUDA it is answered by the runtime (availability.cpp); without, by
// stub/no_cuda_availability.cpp, which says "built without CUDA".
#pragma once

#include <string>

#include "meshtrain/tensor/device_kernels.h"
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

// The tensor core's kernel table for DeviceType::cuda (CUDA kernels on the current stream), or
// nullptr when built without CUDA.
DeviceKernels* kernel_table();

// Lets f32 matrix products on cuda use TF32 tensor cores (declared again here, free of CUDA
// headers, for the trainer; see kernels/gemm.h). Without CUDA it does nothing.
void set_allow_tf32(bool allow);

// Makes device `index` this thread's current device (the device that NCCL groups and cuBLASLt
// handles bind to). Throws naming the reason when there is no such device.
void use_device(int index);

}  // namespace meshtrain::cuda
