#include "meshtrain/obs/gpu_telemetry.h"

#include <dlfcn.h>

#include "meshtrain/util/env_registry.h"

namespace meshtrain::obs {
namespace {

// The few NVML declarations used (nvml.h, stable ABI since NVML 5): status 0 is success.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
using NvmlEventSet = struct NvmlEventSetOpaque*;
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlEventData {
  NvmlDevice device;
  unsigned long long event_type, event_data;
  unsigned int gpu_instance_id, compute_instance_id;
};
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned long long kNvmlEventXidCriticalError = 0x8;
constexpr int kNvmlTemperatureGpu = 0;
constexpr int kNvmlMemoryErrorUncorrected = 1;
constexpr int kNvmlVolatileEcc = 0;

}  // namespace

struct GpuTelemetry::Impl {
  void* lib = nullptr;
  NvmlDevice device = nullptr;
  NvmlEventSet events = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*power)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*ecc)(NvmlDevice, int, int, unsigned long long*) = nullptr;
  NvmlReturn (*event_wait)(NvmlEventSet, NvmlEventData*, unsigned int) = nullptr;
  NvmlReturn (*event_free)(NvmlEventSet) = nullptr;

  ~Impl() {
    if (events != nullptr && event_free != nullptr) (void)event_free(events);
    if (shutdown != nullptr) (void)shutdown();
    if (lib != nullptr) dlclose(lib);
  }
};

namespace {

template <typename F>
bool bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

}  // namespace

GpuTelemetry::GpuTelemetry(int index, const std::string& library) {
  std::string path = library;
  if (path.empty()) path = env_value(Env::nvml_library).value_or("libnvidia-ml.so.1");
  auto impl = std::make_unique<Impl>();
  impl->lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (impl->lib == nullptr) {
    const char* err = dlerror();
    reason_ = "NVML not loaded (" + std::string(err != nullptr ? err : path) +
              "): GPU telemetry needs the NVIDIA driver";
    return;
  }
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*handle)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*event_create)(NvmlEventSet*) = nullptr;
  NvmlReturn (*register_events)(NvmlDevice, unsigned long long, NvmlEventSet) = nullptr;
  if (!bind(impl->lib, "nvmlInit_v2", init) ||
      !bind(impl->lib, "nvmlDeviceGetHandleByIndex_v2", handle) ||
      !bind(impl->lib, "nvmlShutdown", impl->shutdown) ||
      !bind(impl->lib, "nvmlDeviceGetUtilizationRates", impl->utilization) ||
      !bind(impl->lib, "nvmlDeviceGetMemoryInfo", impl->memory) ||
      !bind(impl->lib, "nvmlDeviceGetPowerUsage", impl->power) ||
      !bind(impl->lib, "nvmlDeviceGetTemperature", impl->temperature) ||
      !bind(impl->lib, "nvmlDeviceGetTotalEccErrors", impl->ecc)) {
    reason_ = path + " lacks an NVML function this build uses";
    impl->shutdown = nullptr;
    return;
  }
  if (init() != kNvmlSuccess) {
    reason_ = "nvmlInit failed: no NVIDIA driver running?";
    impl->shutdown = nullptr;
    return;
  }
  if (handle(static_cast<unsigned int>(index), &impl->device) != kNvmlSuccess) {
    reason_ = "NVML has no GPU " + std::to_string(index);
    return;
  }
  // XID events are optional (containers often may not register for them).
  if (bind(impl->lib, "nvmlEventSetCreate", event_create) &&
      bind(impl->lib, "nvmlDeviceRegisterEvents", register_events) &&
      bind(impl->lib, "nvmlEventSetWait_v2", impl->event_wait) &&
      bind(impl->lib, "nvmlEventSetFree", impl->event_free) &&
      event_create(&impl->events) == kNvmlSuccess &&
      register_events(impl->device, kNvmlEventXidCriticalError, impl->events) != kNvmlSuccess) {
    (void)impl->event_free(impl->events);
    impl->events = nullptr;
  }
  impl_ = std::move(impl);
}

GpuTelemetry::~GpuTelemetry() = default;

GpuSample GpuTelemetry::sample() {
  if (!impl_) return last_;
  Impl& n = *impl_;
  GpuSample& s = last_;
  NvmlUtilization u{};
  if (n.utilization(n.device, &u) == kNvmlSuccess) {
    s.utilization = u.gpu / 100.0;
    s.memory_utilization = u.memory / 100.0;
  }
  NvmlMemory m{};
  if (n.memory(n.device, &m) == kNvmlSuccess) {
    s.memory_used_bytes = static_cast<int64_t>(m.used);
    s.memory_total_bytes = static_cast<int64_t>(m.total);
  }
  unsigned int mw = 0;
  if (n.power(n.device, &mw) == kNvmlSuccess) s.power_watts = mw / 1000.0;
  unsigned int c = 0;
  if (n.temperature(n.device, kNvmlTemperatureGpu, &c) == kNvmlSuccess) s.temperature_celsius = c;
  unsigned long long ecc = 0;
  s.ecc_uncorrected =
      n.ecc(n.device, kNvmlMemoryErrorUncorrected, kNvmlVolatileEcc, &ecc) == kNvmlSuccess
          ? static_cast<int64_t>(ecc)
          : -1;
  if (n.events != nullptr) {
    NvmlEventData e{};
    // Timeout 0: only what is already there; the step loop must not wait on the driver.
    while (n.event_wait(n.events, &e, 0) == kNvmlSuccess) {
      if (e.event_type != kNvmlEventXidCriticalError) continue;
      ++s.xid_events;
      s.last_xid = static_cast<int64_t>(e.event_data);
    }
  }
  return s;
}

}  // namespace meshtrain::obs
