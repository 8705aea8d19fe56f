// The CUDA device runtime on a real device: properties, the caching allocator's steady state and
// cross-stream frees, streams and events, pinned staging. Skipped, with the reason, where the
// process has no device; built only with CUDA.
#include <gtest/gtest.h>

#include "tests/support/capability.h"

#if MESHTRAIN_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "meshtrain/cuda/async_copy.h"
#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/device_support.h"
#include "meshtrain/cuda/pinned_buffer.h"
#include "meshtrain/cuda/stream.h"

namespace meshtrain::cuda {
namespace {

TEST(CudaDevice, PropertiesDescribeARealDevice) {
  MT_REQUIRE_CUDA_DEVICE();
  const DeviceProperties p = device_properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GE(p.major, 7);
  EXPECT_GT(p.multiprocessors, 0);
  EXPECT_GT(p.total_memory, size_t{1} << 30);
  const MemoryInfo m = memory_info(0);
  EXPECT_LE(m.free_bytes, m.total_bytes);
  EXPECT_EQ(m.total_bytes, p.total_memory);
  EXPECT_NE(p.str().find("cuda:0"), std::string::npos);
  EXPECT_THROW(device_properties(device_count()), Error);
}

// This build has code for the device it runs on (the GPU check builds for it), and an H100/H200
// takes every precision.
TEST(CudaDevice, TheBuildRunsOnThisDevice) {
  MT_REQUIRE_CUDA_DEVICE();
  EXPECT_NE(compiled_architectures().find("sm_"), std::string::npos) << compiled_architectures();
  const DeviceProperties p = device_properties(0);
  for (DType precision : {DType::f32, DType::f16}) EXPECT_EQ(unsupported_reason(0, precision), "");
  if (p.major >= 8) {
    EXPECT_EQ(unsupported_reason(0, DType::bf16), "");
  }
}

TEST(CudaDevice, CachingAllocatorReachesASteadyState) {
  MT_REQUIRE_CUDA_DEVICE();
  CachingAllocator& a = CachingAllocator::for_device(0);
  Stream s = Stream::create(0);
  const std::vector<size_t> sizes = {4096, 3 << 20, 777, 64 << 20, 12 << 20, 100};
  auto step = [&] {
    std::vector<void*> ps;
    for (size_t n : sizes) {
      ps.push_back(a.allocate(n, s.get()));
      MT_CUDA_CHECK(cudaMemsetAsync(ps.back(), 1, n, s.get()));
    }
    for (void* p : ps) a.free(p);
  };
  step();
  const AllocatorStats first = a.stats();
  for (int i = 0; i < 4; ++i) step();
  s.synchronize();
  const AllocatorStats later = a.stats();
  EXPECT_EQ(later.segment_allocations, first.segment_allocations) << "cudaMalloc after step 1";
  EXPECT_GE(later.peak_reserved_bytes, later.peak_allocated_bytes);
  EXPECT_GE(later.peak_allocated_bytes, (64u << 20) + (12u << 20));
}

TEST(CudaDevice, CrossStreamFreeWaitsForTheOtherStream) {
  MT_REQUIRE_CUDA_DEVICE();
  CachingAllocator& a = CachingAllocator::for_device(0);
  Stream s1 = Stream::create(0);
  Stream s2 = Stream::create(0);
  const size_t n = 1 << 20;
  void* p = a.allocate(n, s1.get());
  a.record_stream(p, s2.get());
  // s2 writes p; its free must wait for that write.
  std::vector<char> host(n, 7);
  PinnedBuffer pinned(n);
  std::memcpy(pinned.data(), host.data(), n);
  copy_to_device_async(p, pinned.data(), n, s2.get());
  const uint64_t frees = a.stats().frees;
  a.free(p);
  EXPECT_EQ(a.stats().frees, frees) << "the block went back while s2 may still use it";
  s2.synchronize();
  void* q = a.allocate(n, s1.get());  // s2 is done: the deferred free is processed here
  EXPECT_EQ(a.stats().frees, frees + 1);
  a.free(q);
}

TEST(CudaDevice, EventsOrderStreamsAndTime) {
  MT_REQUIRE_CUDA_DEVICE();
  Stream s1 = Stream::create(0);
  Stream s2 = Stream::create(0, -1);
  const size_t n = 8 << 20;
  void* buf = CachingAllocator::for_device(0).allocate(n, s1.get());
  Event start(true), end(true);
  start.record(s1);
  MT_CUDA_CHECK(cudaMemsetAsync(buf, 3, n, s1.get()));
  end.record(s1);
  s2.wait(end);
  PinnedBuffer out(16);
  copy_to_host_async(out.data(), buf, 16, s2.get());
  s2.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_GE(start.elapsed_ms(end), 0.0f);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out.as<unsigned char>()[i], 3);
  CachingAllocator::for_device(0).free(buf);
}

TEST(CudaDevice, HostStagerRoundTripsPageableMemoryInChunks) {
  MT_REQUIRE_CUDA_DEVICE();
  Stream s = Stream::create(0);
  const std::vector<float> src = test::random_floats(300001, 5);
  const size_t bytes = src.size() * sizeof(float);
  void* d = CachingAllocator::for_device(0).allocate(bytes, s.get());
  HostStager stager(64 << 10);  // many chunks
  stager.to_device(d, src.data(), bytes, s.get());
  std::vector<float> back(src.size(), 0.0f);
  stager.to_host(back.data(), d, bytes, s.get());
  EXPECT_EQ(back, src);
  CachingAllocator::for_device(0).free(d);
}

TEST(CudaDevice, TensorsMoveToTheDeviceAndBack) {
  MT_REQUIRE_CUDA_DEVICE();
  const std::vector<float> v = test::random_floats(1000, 9);
  Tensor h = Tensor::from_vector(v, {10, 100});
  Tensor d = h.to(Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_EQ(d.to_vector(), v);
  EXPECT_EQ(d.slice(3, 4).to(Device::cpu()).to_vector(),
            std::vector<float>(v.begin() + 300, v.begin() + 400));
  Tensor z = Tensor::zeros({7}, DType::bf16, Device::cuda(0));
  EXPECT_EQ(z.to_vector(), std::vector<float>(7, 0.0f));
  z.fill_(-3.0);
  EXPECT_EQ(z.to_vector(), std::vector<float>(7, -3.0f));
  EXPECT_EQ(d.clone().to_vector(), v);
  EXPECT_EQ(d.to(DType::bf16).to_vector(), h.to(DType::bf16).to_vector());
}

}  // namespace
}  // namespace meshtrain::cuda

#else

TEST(CudaDevice, BuiltWithoutCuda) {
  MT_SKIP_UNLESS("cuda", false, "built without CUDA: device tests are not compiled");
}

#endif
