#include "meshtrain/tensor/device.h"

#include <charconv>

#include "meshtrain/util/error.h"

namespace meshtrain {

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.starts_with("cuda:")) {
    int idx = -1;
    auto rest = s.substr(5);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), idx);
    if (ec == std::errc() && p == rest.data() + rest.size() && idx >= 0) return cuda(idx);
  }
  MT_THROW(ValueError, "unknown device '", s, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  return type == DeviceType::cpu ? "cpu" : "cuda:" + std::to_string(index);
}

}  // namespace meshtrain
