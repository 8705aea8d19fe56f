// The nccl process group on one device (NCCL refuses two ranks on one GPU, so a single-GPU
// machine can only check a group of one: the plumbing, the stream ordering and the Work life
// cycle; multi-rank runs need a multi-GPU machine). Skipped, with the reason, without a device;
// built only with NCCL. Registration is checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/cuda/nccl/nccl_backend.h"

#if MESHTRAIN_HAVE_NCCL

#include <vector>

#include "cuda_test_util.h"
#include "meshtrain/comm/hash_store.h"

#endif

namespace meshtrain {
namespace {

TEST(NcclBackend, RegistersExactlyWhenBuiltWithNccl) {
  EXPECT_EQ(cuda::register_nccl_backend(), MESHTRAIN_HAVE_NCCL != 0);
  const auto names = comm::registered_backends();
  const bool listed = std::find(names.begin(), names.end(), "nccl") != names.end();
  EXPECT_EQ(listed, MESHTRAIN_HAVE_NCCL != 0);
}

#if MESHTRAIN_HAVE_NCCL

TEST(NcclBackend, GroupOfOneRunsEveryCollective) {
  MT_REQUIRE_CUDA_DEVICE();
  cuda::register_nccl_backend();
  auto store = std::make_shared<comm::HashStore>();
  comm::ProcessGroupOptions opts;
  opts.name = "nccl_test";
  opts.timeout = std::chrono::seconds(60);
  auto pg = comm::make_process_group("nccl", store, 0, 1, opts);
  EXPECT_EQ(pg->backend_name(), "nccl");
  const std::vector<float> v = test::random_floats(1000, 7);
  Tensor a = Tensor::from_vector(v, {1000}).to(Device::cuda(0));
  Tensor out = Tensor::zeros({1000}, DType::f32, Device::cuda(0));
  pg->all_reduce(a.data_ptr(), 1000, DType::f32)->wait();
  EXPECT_EQ(a.to_vector(), v);  // a sum over one rank
  pg->broadcast(a.data_ptr(), 1000, DType::f32)->wait();
  pg->all_gather(a.data_ptr(), out.data_ptr(), 1000, DType::f32)->wait();
  EXPECT_EQ(out.to_vector(), v);
  out.zero_();
  pg->all_to_all(a.data_ptr(), out.data_ptr(), 1000, DType::f32)->wait();
  EXPECT_EQ(out.to_vector(), v);
  out.zero_();
  const std::vector<size_t> counts = pg->exchange_counts({1000});  // an all_to_all
  EXPECT_EQ(counts, std::vector<size_t>{1000});
  pg->all_to_all_v(a.data_ptr(), {1000}, out.data_ptr(), counts, DType::f32)->wait();
  EXPECT_EQ(out.to_vector(), v);
  pg->barrier()->wait();
  EXPECT_EQ(pg->next_seq(), 7u);
  pg->abort("test over");
  EXPECT_TRUE(pg->aborted());
  EXPECT_THROW(pg->barrier()->wait(), CommError);
}

#endif

}  // namespace
}  // namespace meshtrain
