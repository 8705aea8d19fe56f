// GPU health and load through NVML, the NVIDIA driver's management library, loaded at run time
// (libnvidia-ml.so.1 comes with the driver, not the toolkit, and its header is often absent): a
// build without it, or a machine without a driver, reports why and exports nothing.
//
// Read per device: utilisation (the share of the last sample period a kernel ran), memory used
// and total, power, temperature, uncorrected ECC errors (volatile count), and XID events (the
// driver's error reports: 13 graphics engine exception, 31 memory page fault, 48 double-bit ECC,
// 79 fallen off the bus, ...), counted since the telemetry started.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace meshtrain::obs {

struct GpuSample {
  double utilization = 0;         // [0, 1]
  double memory_utilization = 0;  // [0, 1], the memory controller's busy share
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  double power_watts = 0;
  double temperature_celsius = 0;
  int64_t ecc_uncorrected = 0;  // -1 where the device has no ECC
  int64_t xid_events = 0;       // since start
  int64_t last_xid = 0;         // the code of the newest XID event, 0 if none
};

class GpuTelemetry {
 public:
  // Loads `library` (default: libnvidia-ml.so.1, or MESHTRAIN_NVML_LIBRARY) and opens device
  // `index`. Never throws: a missing library or device leaves available() false with the reason.
  explicit GpuTelemetry(int index, const std::string& library = "");
  ~GpuTelemetry();
  GpuTelemetry(const GpuTelemetry&) = delete;
  GpuTelemetry& operator=(const GpuTelemetry&) = delete;

  bool available() const { return impl_ != nullptr; }
  const std::string& unavailable_reason() const { return reason_; }
  // The device now, and the XID events that arrived since the last call. A failed query leaves
  // its field at the previous value.
  GpuSample sample();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string reason_;
  GpuSample last_;
};

}  // namespace meshtrain::obs
