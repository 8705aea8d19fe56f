// What every build and every machine must get right about CUDA: whether it is there, why not,
// and that asking for a cuda tensor without it fails with that reason. The tensor core's device
// plumbing (to(), copy_, fill_, item on a non-CPU device) is checked here with a fake device
// (fake_device.h), so it is tested on machines without a GPU too.
#include "meshtrain/cuda/availability.h"

#include <gtest/gtest.h>

#include "fake_device.h"
#include "meshtrain/tensor/tensor.h"
#include "meshtrain/util/error.h"

namespace meshtrain {
namespace {

TEST(CudaAvailability, MatchesTheBuildAndExplainsAnAbsence) {
  EXPECT_EQ(cuda::built_with_cuda(), MESHTRAIN_HAVE_CUDA != 0);
  const int n = cuda::device_count();
  EXPECT_GE(n, 0);
  const std::string reason = cuda::unavailable_reason();
  if (n > 0) {
    EXPECT_TRUE(reason.empty()) << reason;
  } else if (cuda::built_with_cuda()) {
    EXPECT_EQ(reason.rfind("no CUDA device: ", 0), 0u) << reason;
  } else {
    EXPECT_EQ(reason.rfind("built without CUDA", 0), 0u) << reason;
    EXPECT_EQ(cuda::storage_allocator(), nullptr);
  }
  EXPECT_EQ(cuda::device_count(), n) << "the answer is cached, not re-probed";
}

TEST(CudaAvailability, CudaTensorWithoutADeviceFailsWithTheReason) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    (void)Tensor::zeros({4}, DType::f32, Device::cuda(0));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(cuda::unavailable_reason()), std::string::npos)
        << e.what();
  }
  // CPU tensors are unaffected by the failed attempt.
  Tensor t = Tensor::ones({3});
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 1, 1}));
}

// The tensor core's device plumbing, with the fake device of fake_device.h.
class FakeDeviceTensor : public test::FakeDeviceTest {};

TEST_F(FakeDeviceTensor, RoundTripsThroughTheDeviceAllocator) {
  Tensor h = Tensor::from_vector(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f}, {2, 3});
  Tensor d = h.to(Device::cuda(1));
  EXPECT_EQ(d.device(), Device::cuda(1));
  EXPECT_EQ(d.shape(), h.shape());
  EXPECT_EQ(alloc_.live.size(), 1u);
  EXPECT_EQ(alloc_.copies, 1);
  Tensor back = d.to(Device::cpu());
  EXPECT_TRUE(back.device().is_cpu());
  EXPECT_EQ(back.to_vector(), h.to_vector());
  EXPECT_EQ(d.to_vector(), h.to_vector());  // reads through a host copy
  EXPECT_EQ(d.slice(1, 2).view({3}).to(Device::cpu()).to_vector(),
            (std::vector<float>{0.0f, 7.0f, -0.5f}))
      << "views keep their offset";
  EXPECT_FLOAT_EQ(d.slice(1, 2).view({3}).slice(1, 2).item(), 7.0f);
  EXPECT_TRUE(d.to(Device::cuda(1)).is_same(d));
  d = Tensor();
  back = Tensor();
  EXPECT_TRUE(alloc_.live.empty()) << "device storage is released with its last view";
}

TEST_F(FakeDeviceTensor, FillZeroCloneAndConvertOnTheDevice) {
  Tensor d = Tensor::zeros({5}, DType::f32, Device::cuda(0));
  EXPECT_EQ(alloc_.zeros, 1);
  EXPECT_EQ(d.to_vector(), std::vector<float>(5, 0.0f));
  d.fill_(2.5);
  EXPECT_EQ(d.to_vector(), std::vector<float>(5, 2.5f));
  Tensor c = d.clone();
  EXPECT_EQ(c.device(), Device::cuda(0));
  EXPECT_FALSE(c.storage() == d.storage());
  EXPECT_EQ(c.to_vector(), d.to_vector());
  // A dtype change on one device is a device cast; across devices it converts on the host.
  // Both round like convert().
  Tensor h = Tensor::from_vector(std::vector<float>{1.0f / 3.0f, 65504.0f, -1e-8f}, {3});
  Tensor dh = h.to(Device::cuda(0)).to(DType::bf16);
  EXPECT_EQ(kernels_.calls["cast"], 1);
  EXPECT_EQ(dh.dtype(), DType::bf16);
  EXPECT_EQ(dh.device(), Device::cuda(0));
  EXPECT_EQ(dh.to_vector(), h.to(DType::bf16).to_vector());
  Tensor into_host = Tensor::empty({3}, DType::f16);
  into_host.copy_(h.to(Device::cuda(0)));
  EXPECT_EQ(into_host.to_vector(), h.to(DType::f16).to_vector());
  Tensor one = Tensor::full({1}, 4.0, DType::f16, Device::cuda(0));
  EXPECT_FLOAT_EQ(one.item(), 4.0f);
}

}  // namespace
}  // namespace meshtrain
