// Shared by the device kernel tests: host vectors moved to and from the device, raw pointers for
// the kernels' entry points, the products' switches restored, and the fixture that skips without
// a device.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/kernels/gemm.h"
#include "meshtrain/tensor/tensor.h"
#include "tests/cuda/cuda_test_util.h"

namespace meshtrain::test {

inline const Device kDev = Device::cuda(0);

inline Tensor up(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(kDev);
}
inline Tensor up(const std::vector<int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(kDev);
}
inline Tensor dev_empty(int64_t n, DType t = DType::f32) {
  return Tensor::empty({n}, t, kDev);
}
inline float* fp(const Tensor& t) {
  return static_cast<float*>(t.data_ptr());
}
inline const int32_t* ip(const Tensor& t) {
  return static_cast<const int32_t*>(t.data_ptr());
}
inline cudaStream_t stream() {
  return cuda::current_stream(0);
}
// Values rounded through a 16-bit dtype, so that host and device start from the same inputs.
inline std::vector<float> rounded(const std::vector<float>& v, DType t) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(t).to_vector();
}

// Restores the process-wide product switches (fused epilogues, TF32) a test turns, however it
// ends, and starts it from exact f32 products.
class ProductSwitches {
 public:
  ProductSwitches() : fused_(cuda::fused_epilogues()), tf32_(cuda::allow_tf32()) {
    cuda::set_allow_tf32(false);
  }
  ~ProductSwitches() {
    cuda::set_fused_epilogues(fused_);
    cuda::set_allow_tf32(tf32_);
  }
  ProductSwitches(const ProductSwitches&) = delete;
  ProductSwitches& operator=(const ProductSwitches&) = delete;

 private:
  bool fused_, tf32_;
};

// Every device kernel test: skipped, with the reason, where the process has no device.
class DeviceKernelTest : public ::testing::Test {
 protected:
  void SetUp() override { MT_REQUIRE_CUDA_DEVICE(); }
};

}  // namespace meshtrain::test
