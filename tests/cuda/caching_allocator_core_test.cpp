// The caching allocator's bookkeeping on the CPU, over a fake memory source that hands out
// address ranges (never dereferenced) and counts calls: these run on every machine, GPU or not.
#include "meshtrain/cuda/caching_allocator_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

using Core = CachingAllocatorCore;
constexpr size_t kMiB = size_t{1} << 20;

class FakeSource final : public MemorySource {
 public:
  explicit FakeSource(size_t capacity = SIZE_MAX) : capacity_(capacity) {}
  void* allocate_segment(size_t nbytes) override {
    ++allocs;
    if (in_use + nbytes > capacity_) return nullptr;
    in_use += nbytes;
    const uintptr_t p = next_;
    next_ += nbytes + 4096;  // gaps between segments, so merging across them would show
    live.emplace(p, nbytes);
    return reinterpret_cast<void*>(p);
  }
  void free_segment(void* p, size_t nbytes) override {
    ++frees;
    auto it = live.find(reinterpret_cast<uintptr_t>(p));
    EXPECT_NE(it, live.end()) << "segment freed that was never allocated";
    if (it != live.end()) {
      EXPECT_EQ(it->second, nbytes);
      live.erase(it);
    }
    in_use -= nbytes;
  }
  size_t allocs = 0;
  size_t frees = 0;
  size_t in_use = 0;
  std::map<uintptr_t, size_t> live;

 private:
  size_t capacity_;
  uintptr_t next_ = uintptr_t{1} << 40;
};

uintptr_t addr(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

TEST(CachingAllocatorCore, RoundsRequestsAndSizesSegments) {
  EXPECT_EQ(Core::round_size(1), 512u);
  EXPECT_EQ(Core::round_size(512), 512u);
  EXPECT_EQ(Core::round_size(513), 1024u);
  EXPECT_EQ(Core::segment_size(512), 2 * kMiB);
  EXPECT_EQ(Core::segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(Core::segment_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(Core::segment_size(30 * kMiB + 512), 32 * kMiB);
}

TEST(CachingAllocatorCore, SmallRequestsShareOneSegment) {
  FakeSource src;
  Core core(src, "fake:0");
  void* a = core.allocate(1000, 0);
  void* b = core.allocate(3000, 0);
  EXPECT_EQ(src.allocs, 1u);
  EXPECT_EQ(core.block_size(a), 1024u);
  EXPECT_EQ(core.block_size(b), 3072u);
  EXPECT_EQ(addr(b), addr(a) + 1024);  // carved from the same segment, best fit at its start
  const AllocatorStats s = core.stats();
  EXPECT_EQ(s.allocated_bytes, 4096u);
  EXPECT_EQ(s.requested_bytes, 4000u);
  EXPECT_EQ(s.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(s.active_blocks, 2u);
  core.free(a);
  core.free(b);
  EXPECT_EQ(core.stats().allocated_bytes, 0u);
  EXPECT_EQ(core.stats().reserved_bytes, 2 * kMiB);  // cached, not returned
  EXPECT_EQ(src.frees, 0u);
}

TEST(CachingAllocatorCore, FreedNeighboursMergeSoTheSegmentServesLargerRequests) {
  FakeSource src;
  Core core(src, "fake:0");
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(core.allocate(256 * 1024, 0));  // 8 x 256 KiB = 2 MiB
  EXPECT_EQ(src.allocs, 1u);
  // Free in an order that exercises merging with the previous, the next, and both.
  for (int i : {1, 3, 2, 0, 7, 5, 6, 4}) core.free(ps[static_cast<size_t>(i)]);
  void* x = core.allocate(kMiB, 0);
  void* y = core.allocate(kMiB, 0);
  EXPECT_EQ(src.allocs, 1u) << "the merged segment should hold two 1 MiB blocks";
  EXPECT_EQ(addr(x), addr(ps[0]));
  EXPECT_EQ(addr(y), addr(ps[0]) + kMiB);
  core.free(x);
  core.free(y);
}

TEST(CachingAllocatorCore, SteadyStateTrainingStepsNeverReachTheSource) {
  FakeSource src;
  Core core(src, "fake:0");
  // One "step": activations of mixed sizes allocated in forward order, freed in backward order,
  // with some temporaries freed early.
  const std::vector<size_t> sizes = {768 * 4,   3 * kMiB, 50304 * 4, 12 * kMiB, 100,
                                     64 * kMiB, 777,      5 * kMiB,  kMiB,      2 * kMiB + 1};
  auto step = [&] {
    std::vector<void*> live;
    for (size_t i = 0; i < sizes.size(); ++i) {
      live.push_back(core.allocate(sizes[i], 0));
      if (i % 3 == 2) {
        core.free(live[i - 1]);
        live[i - 1] = nullptr;
      }
    }
    for (auto it = live.rbegin(); it != live.rend(); ++it) core.free(*it);
  };
  step();
  const AllocatorStats first = core.stats();
  EXPECT_GT(first.segment_allocations, 0u);
  for (int i = 0; i < 5; ++i) step();
  const AllocatorStats later = core.stats();
  EXPECT_EQ(later.segment_allocations, first.segment_allocations);
  EXPECT_EQ(later.reserved_bytes, first.reserved_bytes);
  EXPECT_EQ(later.peak_allocated_bytes, first.peak_allocated_bytes);
  EXPECT_EQ(later.allocated_bytes, 0u);
  EXPECT_EQ(later.allocations, 6 * sizes.size());
  EXPECT_EQ(later.frees, later.allocations);
  EXPECT_GE(later.peak_reserved_bytes, later.peak_allocated_bytes);
}

TEST(CachingAllocatorCore, StreamsKeepSeparatePools) {
  FakeSource src;
  Core core(src, "fake:0");
  void* a = core.allocate(4096, 1);
  core.free(a);
  void* b = core.allocate(4096, 2);
  EXPECT_EQ(src.allocs, 2u) << "a block freed on stream 1 must not be handed to stream 2";
  EXPECT_EQ(core.block_stream(b), 2u);
  void* c = core.allocate(4096, 1);
  EXPECT_EQ(c, a);
  core.free(b);
  core.free(c);
}

TEST(CachingAllocatorCore, LargeBlocksSplitOnlyIntoUsableRemainders) {
  FakeSource src;
  Core core(src, "fake:0");
  void* a = core.allocate(5 * kMiB, 0);  // a 20 MiB segment
  void* b = core.allocate(5 * kMiB, 0);  // the 15 MiB remainder serves it
  EXPECT_EQ(src.allocs, 1u);
  EXPECT_EQ(addr(b), addr(a) + 5 * kMiB);
  // 10 MiB are left; 9.5 MiB would leave 512 KiB, too small to be worth a large block: the
  // whole remainder is handed out.
  void* c = core.allocate(9 * kMiB + kMiB / 2, 0);
  EXPECT_EQ(src.allocs, 1u);
  EXPECT_EQ(core.block_size(c), 10 * kMiB);
  // Small requests never come out of the large pool.
  core.free(b);
  void* d = core.allocate(1024, 0);
  EXPECT_EQ(src.allocs, 2u);
  for (void* p : {a, c, d}) core.free(p);
}

TEST(CachingAllocatorCore, OutOfMemoryReleasesCacheThenFailsWithFigures) {
  FakeSource src(40 * kMiB);
  Core core(src, "fake:0");
  void* a = core.allocate(30 * kMiB, 0);
  core.free(a);                           // 30 MiB cached
  void* b = core.allocate(36 * kMiB, 0);  // does not fit beside the cache: cache released
  EXPECT_EQ(core.stats().out_of_memory_retries, 1u);
  EXPECT_EQ(src.frees, 1u);
  EXPECT_EQ(core.stats().reserved_bytes, 36 * kMiB);
  try {
    (void)core.allocate(8 * kMiB, 0);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fake:0 out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  }
  core.free(b);
}

// A size near SIZE_MAX (an overflowed count) wrapped around when rounded up to blocks and came
// back as a 512-byte block.
TEST(CachingAllocatorCore, ARequestBeyondAnyDeviceIsRefusedNotWrapped) {
  FakeSource src;
  Core core(src, "fake:0");
  for (const size_t n : {SIZE_MAX, SIZE_MAX - 100, size_t{1} << 63}) {
    EXPECT_THROW((void)core.allocate(n, 0), Error) << n;
  }
  EXPECT_EQ(core.stats().allocated_bytes, 0u);
  EXPECT_EQ(src.allocs, 0u);
}

TEST(CachingAllocatorCore, RejectsForeignAndDoubleFrees) {
  FakeSource src;
  Core core(src, "fake:0");
  void* a = core.allocate(100, 0);
  int local = 0;
  EXPECT_THROW(core.free(&local), Error);
  core.free(a);
  EXPECT_THROW(core.free(a), Error);
  core.free(nullptr);
  EXPECT_EQ(core.allocate(0, 0), nullptr);
}

TEST(CachingAllocatorCore, ReleaseCachedReturnsOnlyWhollyFreeSegments) {
  FakeSource src;
  Core core(src, "fake:0");
  void* a = core.allocate(1024, 0);      // small segment, stays in use
  void* b = core.allocate(8 * kMiB, 0);  // large segment
  core.free(b);
  core.release_cached();
  EXPECT_EQ(src.frees, 1u);
  EXPECT_EQ(core.stats().reserved_bytes, 2 * kMiB);
  EXPECT_EQ(core.stats().segments, 1u);
  core.free(a);
  core.release_cached();
  EXPECT_EQ(core.stats().reserved_bytes, 0u);
  EXPECT_TRUE(src.live.empty());
}

TEST(CachingAllocatorCore, DestructorReturnsEverySegment) {
  FakeSource src;
  {
    Core core(src, "fake:0");
    (void)core.allocate(1000, 0);
    void* b = core.allocate(12 * kMiB, 3);
    (void)core.allocate(100, 3);
    core.free(b);
  }
  EXPECT_TRUE(src.live.empty());
  EXPECT_EQ(src.allocs, src.frees);
}

TEST(CachingAllocatorCore, RandomTrafficKeepsBlocksDisjointAndStatsExact) {
  FakeSource src;
  Core core(src, "fake:0");
  std::mt19937_64 rng(1234);
  struct Live {
    uintptr_t p;
    size_t size;
    StreamId stream;
  };
  std::vector<Live> live;
  size_t expected_allocated = 0;
  for (int it = 0; it < 20000; ++it) {
    const bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      const size_t nbytes = rng() % 4 == 0 ? 1 + rng() % (24 * kMiB) : 1 + rng() % 300000;
      const StreamId stream = rng() % 3;
      void* p = core.allocate(nbytes, stream);
      const size_t sz = core.block_size(p);
      ASSERT_GE(sz, nbytes);
      ASSERT_EQ(core.block_stream(p), stream);
      live.push_back({addr(p), sz, stream});
      expected_allocated += sz;
    } else {
      const size_t k = rng() % live.size();
      core.free(reinterpret_cast<void*>(live[k].p));
      expected_allocated -= live[k].size;
      live[k] = live.back();
      live.pop_back();
    }
    if (it % 500 == 0) {
      auto sorted = live;
      std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.p < b.p; });
      for (size_t i = 1; i < sorted.size(); ++i)
        ASSERT_LE(sorted[i - 1].p + sorted[i - 1].size, sorted[i].p) << "overlapping blocks";
      const AllocatorStats s = core.stats();
      ASSERT_EQ(s.allocated_bytes, expected_allocated);
      ASSERT_EQ(s.active_blocks, live.size());
      ASSERT_EQ(s.reserved_bytes, src.in_use);
      ASSERT_LE(s.allocated_bytes, s.reserved_bytes);
    }
  }
  for (const Live& l : live) core.free(reinterpret_cast<void*>(l.p));
  core.release_cached();
  EXPECT_TRUE(src.live.empty());
}

}  // namespace
}  // namespace meshtrain::cuda
