// The CUDA devices of this process: properties, memory figures, and the current-device guard.
// Every function here needs a device (see availability.h for asking whether there is one).
#pragma once

#include <cstddef>
#include <string>

namespace meshtrain::cuda {

struct DeviceProperties {
  int index = 0;
  std::string name;
  int major = 0;  // compute capability
  int minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
  int max_threads_per_block = 0;
  size_t shared_memory_per_block_optin = 0;  // the most a kernel can request
  int l2_cache_bytes = 0;
  int memory_bus_width_bits = 0;
  std::string str() const;  // "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"
};

DeviceProperties device_properties(int index);

struct MemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
MemoryInfo memory_info(int index);

int current_device();
void set_device(int index);
void synchronize_device(int index);

// Makes `index` the current device for the guard's lifetime, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  bool changed_;
};

}  // namespace meshtrain::cuda
