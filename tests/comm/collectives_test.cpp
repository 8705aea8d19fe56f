// Every collective against a simple reference, on every backend, for world sizes 1 to 8, every
// dtype and reduction, and counts 0, 1, odd and unaligned (a few multi-megabyte cases).
#include <gtest/gtest.h>

#include <numeric>

#include "all_to_all_v_util.h"
#include "comm_test_util.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

using testing::make_input;
using testing::reference_reduce;
using testing::run_ranks;

constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f16,
                             DType::i32, DType::i64,  DType::u8};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                             ReduceOp::product};

struct Param {
  std::string backend;
  int world;
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return info.param.backend + "_w" + std::to_string(info.param.world);
}

class Collectives : public ::testing::TestWithParam<Param> {};

TEST_P(Collectives, AllReduceEveryDTypeAndOp) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}}) {
      for (DType dt : kDTypes) {
        for (ReduceOp op : kOps) {
          auto buf = make_input(pg.rank(), count, dt, op);
          pg.all_reduce(buf.data(), count, dt, {.op = op})->wait();
          auto want = reference_reduce(pg.size(), count, dt, op);
          ASSERT_EQ(buf, want) << dtype_name(dt) << ' ' << reduce_op_name(op) << " count " << count
                               << " rank " << pg.rank() << ": " << testing::hex_diff(buf, want);
        }
      }
    }
  });
}

TEST(RingPieces, BlocksLongerThanAPieceOfUnequalLengthsReduceExactly) {
  // The ring moves each block in pieces of 4 MiB; blocks of 2-3 pieces whose lengths differ by
  // one element (the last piece of a shorter block is empty on some steps) still pair up.
  for (int world : {2, 3}) {
    run_ranks("tcp", world, [&](ProcessGroup& pg) {
      const size_t piece = (size_t{4} << 20) / 4;
      for (size_t count : {world * 2 * piece + 1, world * (2 * piece + 7) + 2}) {
        for (DType dt : {DType::f32, DType::i64}) {
          auto buf = make_input(pg.rank(), count, dt, ReduceOp::sum);
          pg.all_reduce(buf.data(), count, dt, {.op = ReduceOp::sum, .algorithm = Algorithm::ring})
              ->wait();
          ASSERT_EQ(buf, reference_reduce(pg.size(), count, dt, ReduceOp::sum))
              << dtype_name(dt) << " count " << count << " world " << world;
        }
      }
    });
  }
}

TEST_P(Collectives, AllReduceEveryAlgorithm) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    for (Algorithm algo :
         {Algorithm::ring, Algorithm::halving_doubling, Algorithm::tree, Algorithm::direct}) {
      for (size_t count : {size_t{3}, size_t{4099}}) {
        for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
          auto buf = make_input(pg.rank(), count, dt, ReduceOp::sum);
          pg.all_reduce(buf.data(), count, dt, {.op = ReduceOp::sum, .algorithm = algo})->wait();
          ASSERT_EQ(buf, reference_reduce(pg.size(), count, dt, ReduceOp::sum))
              << algorithm_name(algo) << ' ' << dtype_name(dt) << " count " << count;
        }
      }
    }
  });
}

TEST_P(Collectives, BroadcastAndReduce) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    for (int root : {0, pg.size() - 1}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{1003}}) {
        for (DType dt : kDTypes) {
          auto buf = make_input(pg.rank(), count, dt, ReduceOp::sum);
          pg.broadcast(buf.data(), count, dt, {.root = root})->wait();
          ASSERT_EQ(buf, make_input(root, count, dt, ReduceOp::sum)) << "broadcast root " << root;

          for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
            auto r = make_input(pg.rank(), count, dt, op);
            pg.reduce(r.data(), count, dt, {.root = root, .op = op})->wait();
            if (pg.rank() == root) {
              ASSERT_EQ(r, reference_reduce(pg.size(), count, dt, op))
                  << "reduce " << dtype_name(dt) << " root " << root;
            }
          }
        }
      }
    }
  });
}

TEST_P(Collectives, GatherFamily) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    const int n = pg.size();
    for (size_t count : {size_t{0}, size_t{1}, size_t{517}}) {
      for (DType dt : {DType::f32, DType::bf16, DType::i64, DType::u8}) {
        const size_t es = dtype_size(dt);
        std::vector<uint8_t> expected;
        for (int q = 0; q < n; ++q) {
          auto in = make_input(q, count, dt, ReduceOp::sum);
          expected.insert(expected.end(), in.begin(), in.end());
        }
        auto in = make_input(pg.rank(), count, dt, ReduceOp::sum);
        std::vector<uint8_t> out(count * n * es, 0xee);
        pg.all_gather(in.data(), out.data(), count, dt)->wait();
        ASSERT_EQ(out, expected) << "all_gather " << dtype_name(dt) << " count " << count;

        const int root = n / 2;
        std::vector<uint8_t> g(count * n * es, 0xee);
        pg.gather(in.data(), pg.rank() == root ? g.data() : nullptr, count, dt, {.root = root})
            ->wait();
        if (pg.rank() == root) {
          ASSERT_EQ(g, expected) << "gather";
        }

        std::vector<uint8_t> piece(count * es, 0xee);
        pg.scatter(pg.rank() == root ? expected.data() : nullptr, piece.data(), count, dt,
                   {.root = root})
            ->wait();
        ASSERT_EQ(piece, make_input(pg.rank(), count, dt, ReduceOp::sum)) << "scatter";
      }
    }
    // Unequal sizes, some empty.
    std::vector<size_t> counts(n);
    for (int q = 0; q < n; ++q) counts[q] = (q * 37) % 5 == 0 ? 0 : 100 * q + 3;
    size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<uint8_t> expected;
    for (int q = 0; q < n; ++q) {
      auto in = make_input(q, counts[q], DType::i32, ReduceOp::sum);
      expected.insert(expected.end(), in.begin(), in.end());
    }
    auto in = make_input(pg.rank(), counts[pg.rank()], DType::i32, ReduceOp::sum);
    std::vector<uint8_t> out(total * 4, 0xee);
    pg.all_gather_v(in.data(), out.data(), counts, DType::i32)->wait();
    ASSERT_EQ(out, expected) << "all_gather_v";
  });
}

TEST_P(Collectives, ReduceScatterAndAllToAll) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    const int n = pg.size();
    for (size_t count : {size_t{0}, size_t{1}, size_t{333}}) {
      for (DType dt : kDTypes) {
        const size_t es = dtype_size(dt);
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min}) {
          auto in = make_input(pg.rank(), count * n, dt, op);
          std::vector<uint8_t> out(count * es, 0xee);
          pg.reduce_scatter(in.data(), out.data(), count, dt, {.op = op})->wait();
          ASSERT_EQ(out, reference_reduce(n, count, dt, op, count * pg.rank()))
              << "reduce_scatter " << dtype_name(dt) << ' ' << reduce_op_name(op);
        }
        // all_to_all: block j of rank i is input_value(i, j * count + k).
        auto in = make_input(pg.rank(), count * n, dt, ReduceOp::sum);
        std::vector<uint8_t> out(count * n * es, 0xee);
        pg.all_to_all(in.data(), out.data(), count, dt)->wait();
        for (int src = 0; src < n; ++src) {
          auto want = make_input(src, count, dt, ReduceOp::sum, count * pg.rank());
          ASSERT_EQ(0, std::memcmp(out.data() + src * count * es, want.data(), want.size()))
              << "all_to_all from " << src;
        }
      }
    }
  });
}

TEST_P(Collectives, AllToAllV) {
  // Uneven blocks with zeros, everything to one rank and nothing at all, each dtype size, and the
  // receive counts both known and exchanged; bitwise (tests/comm/all_to_all_v_test.cpp runs
  // the same with real processes and blocks of megabytes).
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    uint32_t seed = 1;
    for (auto shape : {testing::A2aShape::random, testing::A2aShape::one_receiver,
                       testing::A2aShape::all_zero}) {
      for (DType dt : {DType::f32, DType::bf16, DType::i32, DType::u8}) {
        for (bool exchange : {false, true}) {
          const auto counts = testing::a2a_counts(shape, pg.size(), ++seed, dt);
          const std::string err = testing::a2a_run_and_check(pg, counts, dt, seed, exchange);
          ASSERT_EQ(err, "") << dtype_name(dt) << " seed " << seed;
        }
      }
    }
  });
}

TEST_P(Collectives, SendRecvAndBarrier) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    const int n = pg.size();
    pg.barrier()->wait();
    if (n == 1) return;
    const int next = (pg.rank() + 1) % n;
    const int prev = (pg.rank() + n - 1) % n;
    for (size_t count : {size_t{0}, size_t{5}, size_t{100003}}) {
      auto out = make_input(pg.rank(), count, DType::f32, ReduceOp::sum);
      std::vector<uint8_t> in(out.size(), 0xee);
      // Issue the receive first so that ring-shaped sends never wait on each other.
      auto r = pg.recv(in.data(), count, DType::f32, prev, 7);
      auto s = pg.send(out.data(), count, DType::f32, next, 7);
      s->wait();
      r->wait();
      ASSERT_EQ(in, make_input(prev, count, DType::f32, ReduceOp::sum)) << "count " << count;
    }
    // Tags are matched: two messages received in the opposite order of sending.
    if (pg.rank() == 0) {
      int32_t a = 11, b = 22;
      pg.send(&a, 1, DType::i32, 1, 1)->wait();
      pg.send(&b, 1, DType::i32, 1, 2)->wait();
    } else if (pg.rank() == 1) {
      int32_t a = 0, b = 0;
      pg.recv(&b, 1, DType::i32, 0, 2)->wait();
      pg.recv(&a, 1, DType::i32, 0, 1)->wait();
      EXPECT_EQ(a, 11);
      EXPECT_EQ(b, 22);
    }
    pg.barrier()->wait();
  });
}

TEST_P(Collectives, SplitMakesSubGroups) {
  const auto [backend, world] = GetParam();
  run_ranks(backend, world, [&](ProcessGroup& pg) {
    std::vector<int> evens;
    for (int q = 0; q < pg.size(); q += 2) evens.push_back(q);
    auto sub = pg.split(evens);
    if (pg.rank() % 2 != 0) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->rank(), pg.rank() / 2);
      EXPECT_EQ(sub->size(), static_cast<int>(evens.size()));
      int64_t v = pg.rank();
      sub->all_reduce(&v, 1, DType::i64)->wait();
      int64_t want = 0;
      for (int q : evens) want += q;
      EXPECT_EQ(v, want);
    }
    // The parent still works after the split.
    int64_t one = 1;
    pg.all_reduce(&one, 1, DType::i64)->wait();
    EXPECT_EQ(one, pg.size());
  });
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (const char* b : {"shm", "tcp"}) {
    for (int w : {1, 2, 3, 4, 5, 7, 8}) out.push_back({b, w});
  }
  // hier: ranks alternate between two simulated hosts (see run_ranks), so 2 is one rank per
  // host, 3 and 5 uneven hosts, 4 and 8 even hosts.
  for (int w : {1, 2, 3, 4, 5, 8}) out.push_back({"hier", w});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives, ::testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace meshtrain::comm
