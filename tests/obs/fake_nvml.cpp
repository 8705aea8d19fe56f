// A stand-in for the driver's NVML library (libnvidia-ml.so.1), built as a shared library for
// gpu_telemetry_test.cpp: one GPU (index 0) with fixed readings, and XID events the test raises
// through fake_nvml_raise_xid. Only the functions GpuTelemetry loads, with NVML's C ABI.
#include <cstring>
#include <deque>

namespace {

struct Device {
  int id;
};
Device g_device{0};
int g_event_set = 0;
bool g_initialised = false;
std::deque<unsigned long long> g_xids;

struct Utilization {
  unsigned int gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};
struct EventData {
  void* device;
  unsigned long long event_type, event_data;
  unsigned int gpu_instance_id, compute_instance_id;
};

constexpr int kSuccess = 0, kInvalidArgument = 2, kUninitialized = 1, kTimeout = 10;

}  // namespace

extern "C" {

int nvmlInit_v2() {
  g_initialised = true;
  return kSuccess;
}
int nvmlShutdown() {
  g_initialised = false;
  return kSuccess;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (!g_initialised) return kUninitialized;
  if (index != 0) return kInvalidArgument;
  *device = &g_device;
  return kSuccess;
}
int nvmlDeviceGetUtilizationRates(void*, Utilization* u) {
  u->gpu = 87;
  u->memory = 40;
  return kSuccess;
}
int nvmlDeviceGetMemoryInfo(void*, Memory* m) {
  m->total = 80ull << 30;
  m->used = 12ull << 30;
  m->free = m->total - m->used;
  return kSuccess;
}
int nvmlDeviceGetPowerUsage(void*, unsigned int* mw) {
  *mw = 350500;
  return kSuccess;
}
int nvmlDeviceGetTemperature(void*, int sensor, unsigned int* c) {
  if (sensor != 0) return kInvalidArgument;
  *c = 61;
  return kSuccess;
}
int nvmlDeviceGetTotalEccErrors(void*, int, int, unsigned long long* count) {
  *count = 0;
  return kSuccess;
}
int nvmlEventSetCreate(void** set) {
  *set = &g_event_set;
  return kSuccess;
}
int nvmlDeviceRegisterEvents(void*, unsigned long long types, void*) {
  return types == 0x8 ? kSuccess : kInvalidArgument;
}
int nvmlEventSetWait_v2(void*, EventData* data, unsigned int) {
  if (g_xids.empty()) return kTimeout;
  std::memset(data, 0, sizeof(*data));
  data->device = &g_device;
  data->event_type = 0x8;
  data->event_data = g_xids.front();
  g_xids.pop_front();
  return kSuccess;
}
int nvmlEventSetFree(void*) {
  return kSuccess;
}

void fake_nvml_raise_xid(unsigned long long code) {
  g_xids.push_back(code);
}

}  // extern "C"
