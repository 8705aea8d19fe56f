// Device queries through the CUDA runtime.
#include "meshtrain/cuda/device.h"

#include <cuda_runtime_api.h>

#include <sstream>

#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/check.h"

namespace meshtrain::cuda {

namespace {

void check_index(int index) {
  const int n = device_count();
  if (n == 0) MT_THROW(Error, unavailable_reason());
  MT_CHECK(index >= 0 && index < n, "cuda:", index, " does not exist (", n, " device(s))");
}

}  // namespace

std::string DeviceProperties::str() const {
  std::ostringstream os;
  os.precision(3);
  os << "cuda:" << index << " " << name << " (sm_" << major << minor << ", " << multiprocessors
     << " SMs, " << static_cast<double>(total_memory) / (1 << 30) << " GiB)";
  return os.str();
}

DeviceProperties device_properties(int index) {
  check_index(index);
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  DeviceProperties d;
  d.index = index;
  d.name = p.name;
  d.major = p.major;
  d.minor = p.minor;
  d.total_memory = p.totalGlobalMem;
  d.multiprocessors = p.multiProcessorCount;
  d.max_threads_per_block = p.maxThreadsPerBlock;
  d.shared_memory_per_block_optin = p.sharedMemPerBlockOptin;
  d.l2_cache_bytes = p.l2CacheSize;
  d.memory_bus_width_bits = p.memoryBusWidth;
  return d;
}

MemoryInfo memory_info(int index) {
  check_index(index);
  DeviceGuard guard(index);
  MemoryInfo m;
  MT_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

int current_device() {
  int d = 0;
  MT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  check_index(index);
  MT_CUDA_CHECK(cudaSetDevice(index));
}

void synchronize_device(int index) {
  DeviceGuard guard(index);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
}

DeviceGuard::DeviceGuard(int index) : previous_(current_device()), changed_(previous_ != index) {
  if (changed_) set_device(index);
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; restoring a device that existed a moment ago cannot fail short
  // of a dead context, which every later call will report anyway.
  if (changed_) (void)cudaSetDevice(previous_);
}

}  // namespace meshtrain::cuda
