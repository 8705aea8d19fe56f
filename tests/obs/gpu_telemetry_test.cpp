// GPU telemetry through NVML, loaded at run time: against a stand-in library with fixed readings
// (fake_nvml.cpp) on every machine, and the reasons it gives when there is no NVML or no such
// GPU. The real library is exercised where a GPU is (train_cuda_test.cpp).
#include "meshtrain/obs/gpu_telemetry.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "meshtrain/obs/metrics.h"
#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/obs/training_metrics.h"

namespace meshtrain::obs {
namespace {

const std::string kFake = MESHTRAIN_FAKE_NVML;

// Raises an XID event in the stand-in (the same loaded copy as GpuTelemetry's).
void raise_xid(unsigned long long code) {
  void* lib = dlopen(kFake.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr) << "the telemetry has the library loaded";
  auto raise = reinterpret_cast<void (*)(unsigned long long)>(dlsym(lib, "fake_nvml_raise_xid"));
  ASSERT_NE(raise, nullptr);
  raise(code);
  dlclose(lib);
}

TEST(GpuTelemetry, ReadsTheDeviceAndCountsXidEvents) {
  GpuTelemetry t(0, kFake);
  ASSERT_TRUE(t.available()) << t.unavailable_reason();
  GpuSample s = t.sample();
  EXPECT_DOUBLE_EQ(s.utilization, 0.87);
  EXPECT_DOUBLE_EQ(s.memory_utilization, 0.40);
  EXPECT_EQ(s.memory_used_bytes, int64_t{12} << 30);
  EXPECT_EQ(s.memory_total_bytes, int64_t{80} << 30);
  EXPECT_DOUBLE_EQ(s.power_watts, 350.5);
  EXPECT_DOUBLE_EQ(s.temperature_celsius, 61);
  EXPECT_EQ(s.ecc_uncorrected, 0);
  EXPECT_EQ(s.xid_events, 0);
  raise_xid(79);
  raise_xid(48);
  s = t.sample();
  EXPECT_EQ(s.xid_events, 2);
  EXPECT_EQ(s.last_xid, 48);
  EXPECT_EQ(t.sample().xid_events, 2) << "events are counted once";
}

TEST(GpuTelemetry, SaysWhyWhenThereIsNoNvmlOrNoSuchGpu) {
  GpuTelemetry missing(0, "libnvidia-ml-absent.so.1");
  EXPECT_FALSE(missing.available());
  EXPECT_NE(missing.unavailable_reason().find("NVML not loaded"), std::string::npos)
      << missing.unavailable_reason();
  EXPECT_NE(missing.unavailable_reason().find("libnvidia-ml-absent.so.1"), std::string::npos);
  EXPECT_EQ(missing.sample().utilization, 0) << "sampling an absent device is harmless";
  GpuTelemetry other(3, kFake);
  EXPECT_FALSE(other.available());
  EXPECT_EQ(other.unavailable_reason(), "NVML has no GPU 3");
}

TEST(GpuTelemetry, TrainingMetricsExportTheGpuOnAGpuRankOnly) {
  Registry reg;
  TrainingMetricsOptions o;
  o.gpu_index = 0;
  o.nvml_library = kFake;
  TrainingMetrics m(reg, o);
  EXPECT_EQ(m.gpu_telemetry_off_reason(), "");
  nlohmann::json row;
  PhaseClock phases;
  m.on_step({.step = 1, .loss = 2.0, .lr = 1e-3, .grad_norm = 1.0, .step_s = 0.1}, phases, row);
  EXPECT_DOUBLE_EQ(row.value("gpu_util", -1.0), 0.87);
  EXPECT_EQ(row.value("gpu_mem_used_bytes", int64_t{-1}), int64_t{12} << 30);
  EXPECT_DOUBLE_EQ(row.value("gpu_power_w", -1.0), 350.5);
  const std::string text = reg.render();
  EXPECT_NE(text.find("meshtrain_gpu_utilization_ratio 0.87"), std::string::npos) << text;
  EXPECT_NE(text.find("meshtrain_gpu_temperature_celsius 61"), std::string::npos);
  EXPECT_NE(text.find("meshtrain_gpu_xid_errors_total 0"), std::string::npos);

  Registry cpu_reg;
  TrainingMetrics cpu(cpu_reg, TrainingMetricsOptions{});
  nlohmann::json cpu_row;
  cpu.on_step({.step = 1, .step_s = 0.1}, phases, cpu_row);
  EXPECT_FALSE(cpu_row.contains("gpu_util"));
  EXPECT_EQ(cpu_reg.render().find("meshtrain_gpu_"), std::string::npos);

  Registry no_nvml_reg;
  TrainingMetricsOptions no_nvml = o;
  no_nvml.nvml_library = "libnvidia-ml-absent.so.1";
  TrainingMetrics off(no_nvml_reg, no_nvml);
  EXPECT_NE(off.gpu_telemetry_off_reason().find("NVML not loaded"), std::string::npos);
  EXPECT_EQ(no_nvml_reg.render().find("meshtrain_gpu_"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain::obs
