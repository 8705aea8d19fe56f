// Where a tensor's storage lives: host memory, or the memory of CUDA device N (allocated by the
// caching allocator of meshtrain/cuda when built with CUDA). The tensor core creates, copies,
// fills and reads tensors on either; ops and fused kernels are dispatched per device above it.
#pragma once

#include <string>
#include <string_view>

namespace meshtrain {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {DeviceType::cuda, index}; }
  static Device parse(std::string_view s);  // "cpu", "cuda", "cuda:1"; throws ValueError
  std::string str() const;
  bool is_cpu() const { return type == DeviceType::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace meshtrain
