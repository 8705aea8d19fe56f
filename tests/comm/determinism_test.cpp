// Determinism: float all-reduces of values whose sum depends on the order of additions give the
// same bits on every rank and on every run; 64 ranks rendezvous over tcp and all-reduce.
#include <gtest/gtest.h>

#include <random>

#include "comm_test_util.h"

namespace meshtrain::comm {
namespace {

std::vector<std::vector<float>> run_once(const std::string& backend, int world, size_t count,
                                         Algorithm algo) {
  std::vector<std::vector<float>> results(world);
  testing::run_ranks(backend, world, [&](ProcessGroup& pg) {
    std::mt19937 rng(1234 + pg.rank());
    std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
    std::vector<float> buf(count);
    for (auto& v : buf) v = dist(rng) * (1.0f + static_cast<float>(pg.rank()) * 1e-3f);
    pg.all_reduce(buf.data(), count, DType::f32, {.op = ReduceOp::sum, .algorithm = algo})->wait();
    results[pg.rank()] = std::move(buf);
  });
  return results;
}

TEST(Determinism, SameBitsOnEveryRankAndEveryRun) {
  for (const char* backend : {"shm", "tcp", "hier"}) {
    for (Algorithm algo : {Algorithm::automatic, Algorithm::ring, Algorithm::halving_doubling}) {
      if (std::string(backend) != "tcp" && algo != Algorithm::automatic) continue;
      for (int world : {3, 4}) {
        auto a = run_once(backend, world, 100003, algo);
        auto b = run_once(backend, world, 100003, algo);
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(0, std::memcmp(a[r].data(), a[0].data(), a[0].size() * 4))
              << backend << " rank " << r << " differs from rank 0";
          ASSERT_EQ(0, std::memcmp(a[r].data(), b[r].data(), a[r].size() * 4))
              << backend << " run 2 differs on rank " << r;
        }
      }
    }
  }
}

TEST(Scale, SixtyFourRanksOverTcp) {
  const int world = 64;
  testing::run_ranks("tcp", world, [&](ProcessGroup& pg) {
    std::vector<int64_t> v(1000, pg.rank());
    pg.all_reduce(v.data(), v.size(), DType::i64)->wait();
    for (int64_t x : v) ASSERT_EQ(x, int64_t{world} * (world - 1) / 2);
  });
}

}  // namespace
}  // namespace meshtrain::comm
