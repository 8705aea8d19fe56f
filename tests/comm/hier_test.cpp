// The hier backend and the choices around it: host layouts, what "auto" picks, the local address
// tcp advertises, and hier all-reduces large enough to take the sharded path (with a remainder
// that goes through the leaders) against the exact reference.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/process_group_hier.h"
#include "meshtrain/comm/process_group_tcp.h"

namespace meshtrain::comm {
namespace {

TEST(HostLayout, GroupsRanksByHostInOrderOfFirstRank) {
  HostLayout l = make_host_layout({"b", "a", "b", "a", "c"});
  ASSERT_EQ(l.num_hosts(), 3);
  EXPECT_EQ(l.hosts[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(l.hosts[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(l.hosts[2], (std::vector<int>{4}));
  EXPECT_EQ(l.local_rank, (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(l.host_index, (std::vector<int>{0, 1, 0, 1, 2}));
  EXPECT_EQ(l.multi_rank_hosts(), 2);
  EXPECT_FALSE(l.uniform());
  EXPECT_TRUE(make_host_layout({"x", "y", "x", "y"}).uniform());
}

TEST(AutoBackend, PicksShmTcpOrHierFromTheLayout) {
  EXPECT_EQ(auto_backend_for(make_host_layout({"a", "a", "a"})), "shm");
  EXPECT_EQ(auto_backend_for(make_host_layout({"a", "b", "c"})), "tcp");
  EXPECT_EQ(auto_backend_for(make_host_layout({"a", "a", "b"})), "tcp");
  EXPECT_EQ(auto_backend_for(make_host_layout({"a", "b", "a", "b"})), "hier");
  EXPECT_EQ(auto_backend_for(make_host_layout({"a", "a", "b", "b", "c"})), "hier");
}

TEST(AutoBackend, GroupsGetTheChosenBackend) {
  struct Case {
    std::vector<std::string> hosts;
    std::string want;
  };
  for (const Case& c : {Case{{"h", "h", "h"}, "shm"}, Case{{"h0", "h1"}, "tcp"},
                        Case{{"h0", "h1", "h0", "h1"}, "hier"}}) {
    const int world = static_cast<int>(c.hosts.size());
    std::vector<std::string> got(world);
    testing::run_ranks(
        "auto", world,
        [&](ProcessGroup& pg) {
          got[pg.rank()] = pg.backend_name();
          int64_t v = pg.rank() + 1;
          pg.all_reduce(&v, 1, DType::i64)->wait();
          EXPECT_EQ(v, int64_t{world} * (world + 1) / 2);
        },
        [&](int r, ProcessGroupOptions& o) { o.host_id = c.hosts[r]; });
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], c.want) << "rank " << r;
  }
}

TEST(TcpAddress, LocalAddressTowardsAHostFollowsTheRoute) {
  EXPECT_EQ(local_address_towards("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(local_address_towards("localhost"), "127.0.0.1");
  EXPECT_EQ(local_address_towards(""), "");
  EXPECT_EQ(local_address_towards("no-such-host.invalid"), "");
  ProcessGroupOptions o;
  o.address = "10.1.2.3";
  EXPECT_EQ(resolve_comm_address(o), "10.1.2.3");
}

// A mesh's tensor-parallel group is its ranks on one host: split from a hier world it is an shm
// group, so its all-gathers and point to point stay in shared memory too; a group that spans
// hosts is hier again.
TEST(Hier, SplitOnOneHostIsShmAndAcrossHostsIsHier) {
  testing::run_ranks("hier", 4, [&](ProcessGroup& pg) {
    // Hosts by rank % 2: {0, 2} and {1, 3}.
    const ProcessGroupPtr even = pg.split({0, 2});
    const ProcessGroupPtr odd = pg.split({1, 3});
    const ProcessGroupPtr across = pg.split({0, 1, 2, 3});
    const ProcessGroupPtr& mine = pg.rank() % 2 == 0 ? even : odd;
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(pg.rank() % 2 == 0 ? odd : even, nullptr);
    EXPECT_EQ(mine->backend_name(), "shm");
    ASSERT_NE(across, nullptr);
    EXPECT_EQ(across->backend_name(), "hier");
    int64_t v = pg.rank();
    std::vector<int64_t> both(2);
    mine->all_gather(&v, both.data(), 1, DType::i64)->wait();
    EXPECT_EQ(both, (std::vector<int64_t>{pg.rank() % 2, pg.rank() % 2 + 2}));
    int64_t sum = pg.rank();
    across->all_reduce(&sum, 1, DType::i64)->wait();
    EXPECT_EQ(sum, 6);
  });
}

TEST(Hier, LargeAllReducesTakeTheShardedPathExactly) {
  // Two hosts of three ranks and two hosts of two ranks; counts leave a remainder after sharding.
  for (int world : {4, 6}) {
    testing::run_ranks("hier", world, [&](ProcessGroup& pg) {
      auto& hier = dynamic_cast<HierProcessGroup&>(pg);
      ASSERT_EQ(hier.layout().num_hosts(), 2);
      for (DType dt : {DType::f32, DType::bf16, DType::i64, DType::u8}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::product}) {
          const size_t count = (size_t{3} << 20) / dtype_size(dt) + 5;
          auto buf = testing::make_input(pg.rank(), count, dt, op);
          pg.all_reduce(buf.data(), count, dt, {.op = op})->wait();
          auto want = testing::reference_reduce(pg.size(), count, dt, op);
          ASSERT_EQ(buf, want) << "world " << world << ' ' << dtype_name(dt) << ' '
                               << reduce_op_name(op) << ": " << testing::hex_diff(buf, want);
        }
      }
    });
  }
}

}  // namespace
}  // namespace meshtrain::comm
