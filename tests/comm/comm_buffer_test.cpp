// Buffers from ProcessGroup::allocate_buffer: the shm backend's in-place all-reduce on them gives
// the reference values and the same bits as the staged path, for every rank count, dtype and op;
// a rank whose buffer is elsewhere makes every rank fall back; other backends hand out private
// memory that works the same; no shared-memory names are left behind.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "comm_test_util.h"
#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/util/error.h"
#include "tests/support/capability.h"
#include "tests/support/child_process.h"
#include "tests/support/small_dev_shm.h"
#include "tests/support/wait.h"

namespace meshtrain::comm {
namespace {

// Settings read when a group is made.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// A small threshold lets odd, short counts take the shared path.
class SharedThreshold : public ScopedEnv {
 public:
  explicit SharedThreshold(const char* bytes)
      : ScopedEnv("MESHTRAIN_SHM_SHARED_MIN_BYTES", bytes) {}
};

std::set<std::string> shm_names() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("meshtrain-", 0) == 0) out.insert(n);
    }
    ::closedir(d);
  }
  return out;
}

TEST(CommBuffer, ShmAllReduceInPlaceMatchesTheReferenceForEveryDTypeAndOp) {
  SharedThreshold small("1");
  for (int world : {2, 3, 4}) {
    testing::run_ranks("shm", world, [&](ProcessGroup& pg) {
      const size_t max_count = 70001;
      CommBufferPtr buf = pg.allocate_buffer(max_count * 8);
      ASSERT_TRUE(buf->shared());
      ASSERT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 64, 0u);
      for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
        for (ReduceOp op :
             {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::product}) {
          for (size_t count : {size_t{1}, size_t{17}, size_t{4099}, max_count}) {
            auto in = testing::make_input(pg.rank(), count, dtype, op);
            std::memcpy(buf->data(), in.data(), in.size());
            pg.all_reduce(buf->data(), count, dtype, {.op = op})->wait();
            auto want = testing::reference_reduce(world, count, dtype, op);
            ASSERT_EQ(0, std::memcmp(buf->data(), want.data(), want.size()))
                << "world " << world << " " << dtype_name(dtype) << " " << reduce_op_name(op)
                << " count " << count;
          }
        }
      }
      // Every one of them ran in place.
      EXPECT_EQ(dynamic_cast<ShmProcessGroup&>(pg).in_place_all_reduces(), 6u * 5u * 4u);
    });
  }
}

// Floats whose sum depends on the order of additions: the in-place path adds in rank order as
// the staged path does, so the bits agree with a private buffer's.
TEST(CommBuffer, InPlaceGivesTheSameBitsAsStagedCopies) {
  for (int world : {2, 3, 4}) {
    const size_t count = (size_t{3} << 20) / 4 + 5;  // above the default threshold, odd
    std::vector<std::vector<float>> shared(world), staged(world);
    testing::run_ranks("shm", world, [&](ProcessGroup& pg) {
      std::mt19937 rng(99 + pg.rank());
      std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
      std::vector<float> input(count);
      for (auto& v : input) v = dist(rng) * (1.0f + static_cast<float>(pg.rank()) * 1e-3f);
      CommBufferPtr buf = pg.allocate_buffer(count * 4);
      std::memcpy(buf->data(), input.data(), count * 4);
      pg.all_reduce(buf->data(), count, DType::f32, {.async_op = false})->wait();
      EXPECT_EQ(dynamic_cast<ShmProcessGroup&>(pg).in_place_all_reduces(), 1u);
      std::vector<float> priv = input;
      pg.all_reduce(priv.data(), count, DType::f32)->wait();
      shared[pg.rank()].assign(buf->as<float>(), buf->as<float>() + count);
      staged[pg.rank()] = std::move(priv);
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(0, std::memcmp(shared[r].data(), staged[0].data(), count * 4))
          << "world " << world << " rank " << r;
      ASSERT_EQ(0, std::memcmp(staged[r].data(), staged[0].data(), count * 4));
    }
  }
}

// ZeRO's collectives on shared buffers: a reduce-scatter reads every rank's input where it is
// and an all-gather whose input is its own block of the output copies the peers' blocks from
// theirs; both give the staged path's bits, also when queued behind and between in-place
// all-reduces (one ticket order for all three).
TEST(CommBuffer, ReduceScatterAndAllGatherRunInPlaceWithTheStagedBits) {
  SharedThreshold small("1");
  for (int world : {2, 3, 4}) {
    testing::run_ranks("shm", world, [&](ProcessGroup& pg) {
      auto& shm = dynamic_cast<ShmProcessGroup&>(pg);
      const int n = pg.size(), me = pg.rank();
      for (size_t count : {size_t{1}, size_t{1001}, size_t{300007}}) {
        std::mt19937 rng(7 + me);
        std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
        std::vector<float> input(count * n);
        for (auto& v : input) v = dist(rng);
        CommBufferPtr rs_in = pg.allocate_buffer(count * n * 4);
        CommBufferPtr ag = pg.allocate_buffer(count * n * 4);
        CommBufferPtr ar = pg.allocate_buffer(count * 4);
        std::memcpy(rs_in->data(), input.data(), count * n * 4);
        std::memcpy(ag->as<float>() + me * count, input.data(), count * 4);
        std::memcpy(ar->data(), input.data(), count * 4);
        std::vector<float> rs_out(count);
        const uint64_t rs0 = shm.in_place_reduce_scatters(), ag0 = shm.in_place_all_gathers();
        auto w1 = pg.all_reduce(ar->data(), count, DType::f32);
        auto w2 = pg.reduce_scatter(rs_in->data(), rs_out.data(), count, DType::f32,
                                    {.op = ReduceOp::avg});
        auto w3 = pg.all_gather(ag->as<float>() + me * count, ag->data(), count, DType::f32);
        w1->wait();
        w2->wait();
        w3->wait();
        EXPECT_EQ(shm.in_place_reduce_scatters(), rs0 + 1) << "count " << count;
        EXPECT_EQ(shm.in_place_all_gathers(), ag0 + 1) << "count " << count;
        // The same collectives on private memory take the staged path.
        std::vector<float> rs_ref(count), ag_ref(count * n);
        pg.reduce_scatter(input.data(), rs_ref.data(), count, DType::f32, {.op = ReduceOp::avg})
            ->wait();
        pg.all_gather(input.data(), ag_ref.data(), count, DType::f32)->wait();
        EXPECT_EQ(shm.in_place_reduce_scatters(), rs0 + 1);
        ASSERT_EQ(0, std::memcmp(rs_out.data(), rs_ref.data(), count * 4))
            << "world " << world << " count " << count;
        ASSERT_EQ(0, std::memcmp(ag->data(), ag_ref.data(), count * n * 4))
            << "world " << world << " count " << count;
      }
    });
  }
}

// One rank's all-gather input is not its block of the output: every rank takes the staged path
// and the result is still right.
TEST(CommBuffer, AnAllGatherWithItsInputElsewhereFallsBackOnEveryRank) {
  SharedThreshold small("1");
  testing::run_ranks("shm", 3, [&](ProcessGroup& pg) {
    auto& shm = dynamic_cast<ShmProcessGroup&>(pg);
    const size_t count = 513;
    CommBufferPtr out = pg.allocate_buffer(count * 3 * 4);
    std::vector<float> mine(count, static_cast<float>(pg.rank() + 1));
    const float* in = mine.data();
    if (pg.rank() != 1) {
      std::memcpy(out->as<float>() + pg.rank() * count, mine.data(), count * 4);
      in = out->as<float>() + pg.rank() * count;
    }
    pg.all_gather(in, out->data(), count, DType::f32)->wait();
    EXPECT_EQ(shm.in_place_all_gathers(), 0u);
    for (int q = 0; q < 3; ++q)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(out->as<float>()[q * count + i], static_cast<float>(q + 1));
  });
}

TEST(CommBuffer, BuffersAtDifferentOffsetsOnEachRankAndRepeatedCalls) {
  SharedThreshold small("1");
  testing::run_ranks("shm", 3, [&](ProcessGroup& pg) {
    const size_t count = 10007;
    CommBufferPtr a = pg.allocate_buffer(4 * (count + 64));
    CommBufferPtr b = pg.allocate_buffer(4 * count);
    float* at = a->as<float>() + pg.rank() * 7;  // unaligned, different on every rank
    for (int iter = 0; iter < 5; ++iter) {
      for (size_t i = 0; i < count; ++i) at[i] = static_cast<float>(pg.rank() + iter + i % 3);
      for (size_t i = 0; i < count; ++i) b->as<float>()[i] = static_cast<float>(pg.rank());
      pg.all_reduce(at, count, DType::f32)->wait();
      pg.all_reduce(b->data(), count, DType::f32)->wait();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(at[i], static_cast<float>(3 + 3 * (iter + i % 3))) << "iter " << iter;
        ASSERT_EQ(b->as<float>()[i], 3.0f);
      }
    }
  });
}

// One rank passes private memory: the last rank to announce its buffer notices, every rank takes
// the staged path, and the result is still right.
TEST(CommBuffer, ARankWithPrivateMemoryMakesEveryRankFallBack) {
  SharedThreshold small("1");
  testing::run_ranks("shm", 3, [&](ProcessGroup& pg) {
    const size_t count = 4099;
    CommBufferPtr shared = pg.allocate_buffer(count * 4);
    std::vector<float> priv(count);
    float* data = pg.rank() == 1 ? priv.data() : shared->as<float>();
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(pg.rank() * 10 + i % 5);
    pg.all_reduce(data, count, DType::f32)->wait();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], static_cast<float>(30 + 3 * (i % 5)));
    EXPECT_EQ(dynamic_cast<ShmProcessGroup&>(pg).in_place_all_reduces(), 0u);
  });
}

// Buffers from two calls: rank 0 uses the first, the others the second. Equal allocation
// numbers are required, so this falls back too.
TEST(CommBuffer, BuffersFromDifferentCallsFallBack) {
  SharedThreshold small("1");
  testing::run_ranks("shm", 2, [&](ProcessGroup& pg) {
    const size_t count = 1000;
    CommBufferPtr first = pg.allocate_buffer(count * 4);
    CommBufferPtr second = pg.allocate_buffer(count * 4);
    float* data = pg.rank() == 0 ? first->as<float>() : second->as<float>();
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(pg.rank() + 1);
    pg.all_reduce(data, count, DType::f32)->wait();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], 3.0f);
    EXPECT_EQ(dynamic_cast<ShmProcessGroup&>(pg).in_place_all_reduces(), 0u);
  });
}

// A rank that waits does the work of the ranks that are still computing: rank 1 announces its
// buffer when it issues the all-reduce and goes on (here it waits until rank 0's wait returned),
// while rank 0, waiting, reduces every chunk into both buffers. Rank 1's wait then finds the
// result in place.
TEST(CommBuffer, TheRankThatWaitsReducesForAPeerThatComputes) {
  // As without a spare core per rank: the group's thread leaves the operation to its issuer.
  ScopedEnv leave("MESHTRAIN_SHM_IN_PLACE_LEAVE_US", "1000000");
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_future = rank0_done.get_future().share();
  testing::run_ranks("shm", 2, [&](ProcessGroup& pg) {
    const size_t count = size_t{1} << 20;  // 4 MiB: 64 chunks of the default 64 KiB
    CommBufferPtr buf = pg.allocate_buffer(count * 4);
    float* x = buf->as<float>();
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(pg.rank() + 1 + i % 7);
    WorkPtr w = pg.all_reduce(x, count, DType::f32);
    if (pg.rank() == 1) {
      // Still "computing": rank 1 waits only once rank 0 has finished the whole operation.
      ASSERT_EQ(rank0_done_future.wait_for(std::chrono::seconds(30)), std::future_status::ready)
          << "rank 0's wait did not return while rank 1 was computing";
    }
    w->wait();
    if (pg.rank() == 0) rank0_done.set_value();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], static_cast<float>(3 + 2 * (i % 7)));
    auto& shm = dynamic_cast<ShmProcessGroup&>(pg);
    EXPECT_EQ(shm.in_place_all_reduces(), 1u);
    EXPECT_EQ(shm.in_place_chunks_reduced(), pg.rank() == 0 ? 64u : 0u) << "rank " << pg.rank();
  });
}

// More in-place all-reduces in flight than the group has slots for: the later ones are announced
// when they run, after the earlier ones have finished on every rank.
TEST(CommBuffer, MoreInPlaceAllReducesInFlightThanSlots) {
  SharedThreshold small("1");
  testing::run_ranks("shm", 3, [&](ProcessGroup& pg) {
    const size_t parts = 150, count = 1000;
    CommBufferPtr buf = pg.allocate_buffer(parts * count * 4);
    float* x = buf->as<float>();
    for (size_t i = 0; i < parts * count; ++i) x[i] = static_cast<float>(pg.rank() + i % 11);
    std::vector<WorkPtr> works;
    for (size_t p = 0; p < parts; ++p)
      works.push_back(pg.all_reduce(x + p * count, count, DType::f32));
    for (auto& w : works) w->wait();
    for (size_t i = 0; i < parts * count; ++i)
      ASSERT_EQ(x[i], static_cast<float>(3 + 3 * (i % 11)));
    EXPECT_EQ(dynamic_cast<ShmProcessGroup&>(pg).in_place_all_reduces(), parts);
  });
}

// Nobody runs it: the group's thread takes the operation after a while.
TEST(CommBuffer, AnInPlaceAllReduceNobodyWaitsForStillCompletes) {
  testing::run_ranks("shm", 2, [&](ProcessGroup& pg) {
    const size_t count = size_t{1} << 18;
    CommBufferPtr buf = pg.allocate_buffer(count * 4);
    float* x = buf->as<float>();
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(pg.rank() + 1);
    WorkPtr w = pg.all_reduce(x, count, DType::f32);
    // A timed wait does not run the operation on this thread (an untimed one would).
    w->wait(std::chrono::milliseconds(30000));
    ASSERT_TRUE(w->is_completed());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], 3.0f);
  });
}

TEST(CommBuffer, OtherBackendsHandOutPrivateMemoryThatWorks) {
  for (const char* backend : {"tcp", "hier"}) {
    testing::run_ranks(backend, 2, [&](ProcessGroup& pg) {
      CommBufferPtr buf = pg.allocate_buffer(4096 * 4);
      EXPECT_FALSE(buf->shared());
      for (size_t i = 0; i < 4096; ++i) buf->as<float>()[i] = static_cast<float>(pg.rank() + 1);
      pg.all_reduce(buf->data(), 4096, DType::f32)->wait();
      for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(buf->as<float>()[i], 3.0f) << backend;
    });
  }
}

TEST(CommBuffer, LeavesNoSharedMemoryNamesBehind) {
  const auto before = shm_names();
  testing::run_ranks("shm", 3, [&](ProcessGroup& pg) {
    for (int i = 0; i < 3; ++i) {
      CommBufferPtr buf = pg.allocate_buffer(size_t{1} << 20);
      EXPECT_EQ(buf->size(), size_t{1} << 20);
      for (size_t k = 0; k < buf->size(); ++k) ASSERT_EQ(buf->data()[k], 0) << "not zero-filled";
    }
  });
  // A name lives only until every rank has mapped it, so a group being made by another test at
  // this moment shows one briefly; a leaked name stays. Wait for the new names to go.
  std::set<std::string> left;
  const bool gone = ::meshtrain::testing::wait_until(
      [&] {
        left.clear();
        for (const std::string& n : shm_names())
          if (!before.count(n)) left.insert(n);
        return left.empty();
      },
      std::chrono::seconds(10));
  EXPECT_TRUE(gone) << "left behind: " << (left.empty() ? std::string() : *left.begin());
}

using ::meshtrain::testing::with_small_dev_shm;

// A container's /dev/shm is often 64 MiB. A buffer that does not fit must not become a SIGBUS at
// the first touch of a page: the allocation fails cleanly on the rank that could not reserve it,
// every rank falls back to private memory, and the all-reduce still works.
TEST(CommBuffer, AFullDevShmFallsBackToPrivateMemoryOnEveryRank) {
  MT_SKIP_UNLESS("mountns", ::geteuid() == 0, "needs root to mount a small /dev/shm");
  const int rc = with_small_dev_shm("32m", [] {
    int rc = 0;
    testing::run_ranks("shm", 2, [&](ProcessGroup& pg) {
      CommBufferPtr small = pg.allocate_buffer(size_t{1} << 20);  // fits
      // One of these fits, two do not.
      uint64_t big_bytes = 0;
      if (pg.rank() == 0) {
        struct statvfs st {};
        if (::statvfs("/dev/shm", &st) == 0) big_bytes = st.f_bavail * st.f_frsize / 5 * 3;
        big_bytes = std::max<uint64_t>(big_bytes / 4096 * 4096, uint64_t{4} << 20);
      }
      pg.broadcast(&big_bytes, 1, DType::i64)->wait();
      // Rank 1 comes once rank 0's part is reserved (free space below what rank 1 asks for), so
      // that rank 0 gets its part and rank 1 does not (at the same time both could fail
      // halfway, which falls back too but tests less).
      if (pg.rank() == 1) {
        const bool reserved = ::meshtrain::testing::wait_until(
            [&] {
              struct statvfs st {};
              return ::statvfs("/dev/shm", &st) == 0 && st.f_bavail * st.f_frsize < big_bytes;
            },
            std::chrono::seconds(30));
        if (!reserved) rc = 8;
      }
      CommBufferPtr big = pg.allocate_buffer(big_bytes);
      if (!small->shared()) rc = 4;
      if (big->shared()) rc = 5;
      const size_t count = size_t{1} << 20;
      float* v = big->as<float>();  // at least 4 MiB
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(pg.rank() + 1);
      pg.all_reduce(v, count, DType::f32)->wait();
      for (size_t i = 0; i < count; ++i) {
        if (v[i] != 3.0f) rc = 6;
      }
    });
    return rc;
  });
  MT_SKIP_UNLESS("mountns", rc != 3,
                 "cannot make a mount namespace with a small /dev/shm here (reason above)");
  EXPECT_EQ(rc, 0) << "4: small buffer not shared, 5: big buffer shared, 6: wrong sum, "
                      "7: an exception (printed above), 8: rank 0's part never took its space";
}

// The group's own segment (staging buffers and channels, about 1.1 MiB for 2 ranks at their
// smallest) does not fit in a 512 KiB /dev/shm: making the group fails on every rank with an
// error that says what to do, instead of a SIGBUS when a collective first touches a page that
// was never there.
TEST(CommBuffer, AGroupTooBigForDevShmIsAClearErrorOnEveryRank) {
  MT_SKIP_UNLESS("mountns", ::geteuid() == 0, "needs root to mount a small /dev/shm");
  const int rc = with_small_dev_shm("512k", [] {
    std::vector<std::string> errors(2);
    auto store = std::make_shared<HashStore>();
    store->set_timeout(std::chrono::seconds(30));
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        try {
          auto pg = make_process_group("shm", store, r, 2, testing::test_options("shm"));
          std::vector<float> v(size_t{8} << 20, 1.0f);  // through every staging byte
          pg->all_reduce(v.data(), v.size(), DType::f32)->wait();
        } catch (const meshtrain::CommError& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : ranks) t.join();
    for (const std::string& e : errors) {
      std::fprintf(stderr, "%s\n", e.c_str());
      if (e.find("/dev/shm has") == std::string::npos || e.find("--shm-size") == std::string::npos)
        return 4;
    }
    return 0;
  });
  MT_SKIP_UNLESS("mountns", rc != 3,
                 "cannot make a mount namespace with a small /dev/shm here (reason above)");
  EXPECT_EQ(rc, 0) << "4: a rank's error (printed above) does not say what /dev/shm lacks and "
                      "what to do, 7: another exception (printed above)";
}

// 8 ranks' segment takes 80 MiB at the default sizes, more than a container's default 64 MiB
// /dev/shm. Rank 0 cuts the staging buffers and channels until the segment takes at most half of
// what is free, every rank follows, and the collectives stay correct (here with 32 MiB).
TEST(CommBuffer, EightRanksFitASmallDevShmWithSmallerStagingBuffers) {
  MT_SKIP_UNLESS("mountns", ::geteuid() == 0, "needs root to mount a small /dev/shm");
  const int rc = with_small_dev_shm("32m", [] {
    std::atomic<int> rc{0};
    testing::run_ranks("shm", 8, [&](ProcessGroup& pg) {
      // More than the cut staging buffers hold at once, so that the staged path cycles them.
      const size_t count = (size_t{6} << 20) / sizeof(float);
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(pg.rank() + (i % 3));
      pg.all_reduce(v.data(), count, DType::f32)->wait();
      for (size_t i = 0; i < count; ++i) {
        if (v[i] != static_cast<float>(28 + 8 * (i % 3))) rc = 4;
      }
      std::vector<float> mine(size_t{1} << 16, static_cast<float>(pg.rank()));
      std::vector<float> all(mine.size() * 8);
      pg.all_gather(mine.data(), all.data(), mine.size(), DType::f32)->wait();
      for (size_t i = 0; i < all.size(); ++i) {
        if (all[i] != static_cast<float>(i / mine.size())) rc = 5;
      }
    });
    return rc.load();
  });
  MT_SKIP_UNLESS("mountns", rc != 3,
                 "cannot make a mount namespace with a small /dev/shm here (reason above)");
  EXPECT_EQ(rc, 0) << "4: wrong all-reduce sum, 5: wrong all-gather, 7: an exception (printed "
                      "above; before the segment was fitted, one that /dev/shm is too small)";
}

// A malformed MESHTRAIN_SHM_* override stops the group at once with one line naming it, where it
// used to be ignored without a word.
TEST(CommBuffer, AMalformedShmOverrideStopsTheGroupNamingIt) {
  ScopedEnv spin("MESHTRAIN_SHM_SPIN_US", "fast");
  try {
    auto pg = make_process_group("shm", std::make_shared<HashStore>(), 0, 1,
                                 testing::test_options("shm"));
    ADD_FAILURE() << "the group was made";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("MESHTRAIN_SHM_SPIN_US='fast' is not a whole number"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::comm
